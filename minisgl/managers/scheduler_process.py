"""run_scheduler_process: the body of one tensor- or pipeline-parallel rank's process.

Mirrors run_scheduler_process at the end of python/sglang/srt/managers/scheduler.py:
build this rank's Scheduler (and with it the TpModelWorker, which joins the process
group), report ready, run the event loop until node 0 shuts down. SGLang also sets up
its ZMQ sockets, NUMA binding and the watchdog here; omitted.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Optional

import torch

from minisgl import tracing
from minisgl.distributed.parallel_state import destroy_distributed_environment
from minisgl.managers.scheduler import Scheduler
from minisgl.server_args import ServerArgs

# Where rank processes write their trace events (read by the launcher, see run_scheduler_process).
TRACE_DIR_ENV = "MINISGL_TRACE_DIR"


def run_scheduler_process(
    server_args: ServerArgs,
    tp_rank: int,
    recv_from_engine: Optional[Connection] = None,
    trace_dir: Optional[str] = None,
    pp_rank: int = 0,
) -> None:
    """Build this rank's Scheduler, tell the front end it is ready (rank 0 only), then run
    the event loop until the front end shuts down. With a trace_dir (the launcher's MINISGL_TRACE_DIR), the rank's
    trace events are written to tp<rank>.jsonl (pp<stage>_tp<rank>.jsonl for a pipeline stage) there when it exits."""
    ranks_per_node = server_args.pp_size * server_args.tp_size // server_args.nnodes
    # The ranks of one node share its cores.
    torch.set_num_threads(max(1, torch.get_num_threads() // ranks_per_node))
    with tracing.record() if trace_dir else contextlib.nullcontext() as events:
        try:
            with tracing.span("run_scheduler_process", tp_rank=tp_rank, node_rank=server_args.node_rank):
                scheduler = Scheduler(server_args, tp_rank, pp_rank)
                if recv_from_engine is not None:
                    recv_from_engine.send(("ready", scheduler.worker_info))
                scheduler.event_loop(recv_from_engine)
        except BaseException as e:
            if recv_from_engine is not None:
                _send_error(recv_from_engine, e)
            raise
        finally:
            if trace_dir:
                name = f"pp{pp_rank}_tp{tp_rank}" if server_args.pp_size > 1 else f"tp{tp_rank}"
                tracing.dump_jsonl(events, os.path.join(trace_dir, f"{name}.jsonl"))
            destroy_distributed_environment()
    # A clean stop skips the interpreter's teardown, which takes seconds once torch and
    # transformers are loaded; nothing is left to flush (SGLang kills its schedulers outright).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _send_error(conn: Connection, error: BaseException) -> None:
    detail = traceback.format_exc()
    try:
        conn.send(("error", error, detail))
    except Exception:  # unpicklable, or the Engine is gone
        with contextlib.suppress(Exception):
            conn.send(("error", RuntimeError(repr(error)), detail))
