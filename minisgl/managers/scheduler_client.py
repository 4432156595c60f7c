"""SchedulerClient: the Engine's handle on a tensor- and pipeline-parallel group of scheduler processes.

Mirrors the launch half of python/sglang/srt/entrypoints/engine.py
(_launch_scheduler_processes, _wait_for_scheduler_ready, the node_rank >= 1
branch of _launch_subprocesses) and the send/receive half of TokenizerManager.
With tp_size or pp_size > 1 every rank runs its own Scheduler in its own process
(scheduler_process.run_scheduler_process): pp_size x tp_size of them, global rank
pp_rank * tp_size + tp_rank. This client starts the ranks of this node,
talks to rank 0 over a pipe, and offers the in-process Scheduler's methods
(process_input_requests, step, is_idle: scheduler_driver.SchedulerHandle), so a
driver runs either the same way. SGLang connects
the processes with ZMQ sockets and a detokenizer process; minisgl uses one
multiprocessing pipe and detokenizes in the TokenizerManager.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import socket
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as mp_wait
from typing import Any, Optional

from minisgl.configs.model_config import ModelConfig
from minisgl.distributed.utils import get_pp_indices
from minisgl.managers.io_struct import AbortReq, ReqOutput, TokenizedGenerateReqInput
from minisgl.managers.scheduler_process import TRACE_DIR_ENV, run_scheduler_process
from minisgl.server_args import ServerArgs

# How often a waiting client checks that the rank processes it started are still alive.
LIVENESS_CHECK_INTERVAL_S = 0.5
SHUTDOWN_TIMEOUT_S = 30.0


def _mp_context() -> mp.context.BaseContext:
    """SGLang spawns its schedulers, so no rank inherits the parent's threads or CUDA context.
    A fork server gives the same guarantee (it is a fresh process that has only imported
    modules) and starts each rank with a fork instead of seconds of imports. (Loading a
    tokenizer imports transformers.modeling_utils, the slowest of them.)"""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["minisgl.managers.scheduler_process", "transformers.modeling_utils"])
    return ctx


def launch_scheduler_processes(server_args: ServerArgs) -> tuple[list[mp.Process], Optional[Connection]]:
    """Start this node's ranks, pp_size * tp_size // nnodes of them from node_rank * that; return
    them and, on node 0, the pipe to rank 0."""
    ctx = _mp_context()
    # Read here: a forked rank sees the fork server's environment, not this process's.
    trace_dir = os.environ.get(TRACE_DIR_ENV)
    tp_size = server_args.tp_size
    ranks_per_node = server_args.pp_size * tp_size // server_args.nnodes
    first = server_args.node_rank * ranks_per_node
    procs, engine_end = [], None
    for rank in range(first, first + ranks_per_node):
        pp_rank, tp_rank = divmod(rank, tp_size)
        rank_end = None
        if rank == 0:
            engine_end, rank_end = ctx.Pipe()
        # SGLang's process names: the stage appears only under pipeline parallelism.
        name = (
            f"minisgl-scheduler-PP{pp_rank}-TP{tp_rank}"
            if server_args.pp_size > 1
            else f"minisgl-scheduler-TP{tp_rank}"
        )
        proc = ctx.Process(
            target=run_scheduler_process,
            args=(server_args, tp_rank, rank_end, trace_dir, pp_rank),
            name=name,
            daemon=True,
        )
        proc.start()
        procs.append(proc)
    return procs, engine_end


def run_nonzero_rank_node(server_args: ServerArgs) -> None:
    """What a node other than node 0 does: run its ranks and wait. They take their requests
    from rank 0 and exit when node 0 shuts down (SGLang's node_rank >= 1 launch)."""
    procs, _ = launch_scheduler_processes(server_args)
    for proc in procs:
        proc.join()


def with_dist_init_addr(server_args: ServerArgs) -> ServerArgs:
    """A single node needs no address from the user: rank 0 listens on a free loopback port."""
    if server_args.dist_init_addr is not None:
        return server_args
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dataclasses.replace(server_args, dist_init_addr=f"127.0.0.1:{port}")


class SchedulerClient:
    """The Scheduler's interface, served by rank 0's scheduler process over a pipe (see the module docstring)."""

    def __init__(self, server_args: ServerArgs) -> None:
        assert server_args.node_rank == 0, "only node 0 talks to rank 0"
        self.server_args = server_args = with_dist_init_addr(server_args)
        self.model_config = ModelConfig.from_server_args(server_args)
        # Refuse an uneven split, or more stages than layers, here, before any process starts.
        self.model_config.verify_tp_size(server_args.tp_size)
        get_pp_indices(self.model_config.num_hidden_layers, 0, server_args.pp_size)
        self._procs, self._conn = launch_scheduler_processes(server_args)
        self._outbox: list = []  # requests not yet sent: one generate() call travels as one message
        self._outputs: list[ReqOutput] = []
        self._replies: list[Any] = []
        self._in_flight: set[str] = set()
        self.worker_info = None
        while self.worker_info is None:
            self._recv(block=True)

    # ---- the Scheduler's interface ---------------------------------------------------------

    def process_input_requests(self, recv_reqs: list) -> list:
        """Queue the requests for rank 0, which applies them (and broadcasts them to the other
        ranks) through Scheduler.process_input_requests; wait for the control replies, if any."""
        num_controls = 0
        for req in recv_reqs:
            if isinstance(req, TokenizedGenerateReqInput):
                self._in_flight.add(req.rid)
            elif not isinstance(req, AbortReq):
                num_controls += 1
            self._outbox.append(req)
        if not num_controls:
            return []
        self._send_outbox()
        while len(self._replies) < num_controls:
            self._recv(block=True)
        replies, self._replies = self._replies[:num_controls], self._replies[num_controls:]
        return replies

    def step(self) -> list[ReqOutput]:
        """Send what is queued; return what rank 0 has reported since the last call, waiting
        for a report while requests run."""
        self._send_outbox()
        if not self._outputs and self._in_flight:
            self._recv(block=True)
        while self._recv(block=False):
            pass
        outputs, self._outputs = self._outputs, []
        self._in_flight.difference_update(o.rid for o in outputs if o.finished)
        return outputs

    def is_idle(self) -> bool:
        return not self._in_flight

    def dead_ranks(self) -> list[str]:
        """The rank processes of this node that have exited. Safe from any thread: it only asks
        whether a process's sentinel is readable, never reaps it (the scheduler thread does)."""
        exited = set(mp_wait([p.sentinel for p in self._procs], timeout=0))
        return [p.name for p in self._procs if p.sentinel in exited]

    def shutdown(self) -> None:
        """Tell rank 0 to stop (it tells the others), then reap this node's processes."""
        if self._conn is None:
            return
        try:
            self._conn.send([None])
        except OSError:
            pass  # rank 0 is already gone
        for proc in self._procs:
            proc.join(SHUTDOWN_TIMEOUT_S)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        self._conn.close()
        self._conn = None

    # ---- the pipe ------------------------------------------------------------------------

    def _send_outbox(self) -> None:
        if not self._outbox:
            return
        if self._conn is None:
            raise RuntimeError("the scheduler processes have stopped")
        self._conn.send(self._outbox)
        self._outbox = []

    def _recv(self, block: bool) -> bool:
        """Take one message from rank 0 if there is one (waiting for it if block); False if none."""
        if self._conn is None:
            raise RuntimeError("the scheduler processes have stopped")
        while not self._conn.poll(LIVENESS_CHECK_INTERVAL_S if block else 0):
            if not block:
                return False
            dead = [p for p in self._procs if not p.is_alive()]
            if dead and not self._conn.poll():
                self.shutdown()
                raise RuntimeError(f"scheduler process {dead[0].name} exited with code {dead[0].exitcode}")
        msg = self._conn.recv()
        if msg[0] == "ready":
            self.worker_info = msg[1]
        elif msg[0] == "out":
            self._outputs += msg[1]
            self._replies += msg[2]
        else:  # ("error", exception, traceback): rank 0 failed; the group cannot go on
            _, error, detail = msg
            self.shutdown()
            error.add_note(f"raised in scheduler process TP0:\n{detail}")
            raise error
        return True
