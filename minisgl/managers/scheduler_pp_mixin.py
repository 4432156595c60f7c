"""SchedulerPPMixin: the scheduler loop of one pipeline stage, with micro-batches in flight.

Mirrors event_loop_pp in python/sglang/srt/managers/scheduler_pp_mixin.py:47 (init_pp_loop_state,
_pp_recv_proxy_tensors :929, _pp_send_dict_to_next_stage :912, _pp_send_output_to_next_stage :988,
_pp_process_batch_result). Every stage runs
the same scheduler over the same requests, making the same decisions in the same order, as TP
ranks do; what differs is who computes what:

    iteration k, micro-batch m = k % pp_size, on every stage:
      take the requests (stage 0 from the front end, others from the previous stage), pass them on
      schedule micro-batch m from its own running batch (SGLang's running_mbs[m])
      run it: stage 0 from token ids, the others from the previous stage's PPProxyTensors;
        send the tensors on (all but the last), or sample (the last) and send the result to stage 0
      take the result of micro-batch (m + 1) % pp_size, scheduled pp_size - 1 iterations ago
        (stage 0 from the last stage, the others from the previous stage), pass it on, process it

So while the last stage runs micro-batch m, stage 0 already runs m + 1: with pp_size micro-batches
in flight no stage waits for the others (after the pipeline fills). A micro-batch's result is
processed by every stage in the same iteration, after all stages have run it, so an abort or a
finished request never frees KV a stage still has to write. Every send is asynchronous (isend)
and every receive blocking, SGLang's rule: a blocking send could wait for a stage that itself
waits for this one's next message. Communication rides the PP group (one per TP shard: each
shard of stage s talks to the same shard of stage s + 1); within stage 0 the requests are
broadcast over the TP group as in event_loop_normal.

A micro-batch whose forward raises on some stage aborts only its own requests, as a failed batch
does in event_loop_normal (Scheduler.step_normal): the stage sends a PPStageError down the pipeline
in place of the tensors, later stages skip the forward and pass it on, the last stage returns it as
the micro-batch's result, and every stage aborts the batch when that result comes round, in the
same iteration, so their schedulers and KV pools stay alike. An exception while scheduling or
processing a result still ends the stage, and with it the server: the stages would not all see it.

Omitted: SGLang's async batch depth, disaggregation and the delayed sampling for grammars.
"""

from __future__ import annotations

import dataclasses
import logging
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Optional

from minisgl import tracing
from minisgl.distributed.parallel_state import get_pp_group
from minisgl.layers.utils import PPProxyTensors

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import ScheduleBatch
    from minisgl.managers.scheduler import Scheduler
    from minisgl.managers.tp_worker import GenerationBatchResult

logger = logging.getLogger(__name__)


class PPStageError(RuntimeError):
    """A micro-batch's forward failed on a stage: what travels in place of its tensors and its result."""


class SchedulerPPMixin:
    """Mixed into Scheduler; ``self`` is the Scheduler."""

    def init_pp_loop_state(self: "Scheduler") -> None:
        self.pp_group = get_pp_group()
        self.pp_loop_size = self.server_args.pp_size
        self.mbs: list[Optional[ScheduleBatch]] = [None] * self.pp_loop_size  # the batch each slot has in flight
        self.running_mbs = [self._new_batch([]) for _ in range(self.pp_loop_size)]
        self.last_mbs: list[Optional[ScheduleBatch]] = [None] * self.pp_loop_size
        self.last_rank_outputs: dict[int, GenerationBatchResult] = {}  # the last stage's own results, by slot
        self.pp_send_works: list = []  # sends not yet known to be complete

    def event_loop_pp(self: "Scheduler", recv_from_engine: Optional[Connection]) -> None:
        """SGLang's event_loop_pp (see the module docstring for one iteration)."""
        self.init_pp_loop_state()
        while True:
            for mb_id in range(self.pp_loop_size):
                if not self._pp_step(mb_id, recv_from_engine):
                    return

    @tracing.traced(attrs=lambda self, mb_id, recv_from_engine: {"mb_id": mb_id, "pp_rank": self.pp_rank})
    def _pp_step(self: "Scheduler", mb_id: int, recv_from_engine: Optional[Connection]) -> bool:
        """One iteration for micro-batch ``mb_id``; False once the front end has shut down."""
        next_mb_id = (mb_id + 1) % self.pp_loop_size
        recv_reqs = self._pp_recv_requests(recv_from_engine)
        if any(r is None for r in recv_reqs):
            return False
        replies = self.process_input_requests(recv_reqs)

        self.running_batch, self.last_batch = self.running_mbs[mb_id], self.last_mbs[mb_id]
        self.mbs[mb_id] = batch = self.get_next_batch_to_run()
        self.running_mbs[mb_id], self.last_mbs[mb_id] = self.running_batch, None
        if batch is not None:
            self._pp_launch_batch(mb_id, batch)

        done = self.mbs[next_mb_id]
        if done is not None:
            result = self._pp_recv_output(next_mb_id)
            self.running_batch = self.running_mbs[next_mb_id]
            if isinstance(result, PPStageError):
                self.abort_failed_batch(done, result)  # filters this micro-batch's running batch too
                done = None  # as in step_normal, a failed batch does not join the running batch
            else:
                tracing.point(
                    "Scheduler.process_batch_result", forward_mode=done.forward_mode.name, batch_size=len(done.reqs)
                )
                self.process_batch_result(done, result)
            self.last_mbs[next_mb_id], self.mbs[next_mb_id] = done, None
        self.pp_send_works = [w for w in self.pp_send_works if not w.is_completed()]

        outputs, self.outputs = self.outputs, []
        if self.pp_rank == 0 and self.tp_rank == 0 and (outputs or replies):
            recv_from_engine.send(("out", outputs, replies))
        return True

    def _pp_recv_requests(self: "Scheduler", recv_from_engine: Optional[Connection]) -> list:
        """Stage 0 takes the front end's requests (recv_requests); later stages take the previous
        stage's. Every stage but the last passes them on, a shutdown (None) included."""
        if self.pp_group.is_first_rank:
            recv_reqs = self.recv_requests(recv_from_engine)  # broadcast over stage 0's TP group
        else:
            recv_reqs = self.pp_group.recv_object(self.pp_group.prev_rank)
        if not self.pp_group.is_last_rank:
            works = self.pp_group.send_object(recv_reqs, self.pp_group.next_rank)
            if any(r is None for r in recv_reqs):
                for work in works:  # the next stage must hear of the shutdown before this process exits
                    work.wait()
            self.pp_send_works += works
        return recv_reqs

    def _pp_launch_batch(self: "Scheduler", mb_id: int, batch: "ScheduleBatch") -> None:
        """Run this stage's layers on the micro-batch; hand the tensors on, or (the last stage) send the
        result back to stage 0. A forward that raises becomes a PPStageError, sent in their place."""
        pp_proxy_tensors, result = None, None
        if not self.pp_group.is_first_rank:
            pp_proxy_tensors = self._pp_recv_proxy_tensors()
            if isinstance(pp_proxy_tensors, PPStageError):
                result = pp_proxy_tensors  # an earlier stage failed on this micro-batch: nothing to run
        if result is None:
            try:
                result = self.tp_worker.forward_batch_generation(
                    batch.get_model_worker_batch(), pp_proxy_tensors=pp_proxy_tensors
                )
            except Exception as e:
                logger.exception("micro-batch %d failed on this stage; its requests are aborted", mb_id)
                result = PPStageError(f"pipeline stage {self.pp_rank}: {type(e).__name__}: {e}")
        if self.pp_group.is_last_rank:
            self.last_rank_outputs[mb_id] = result
            self._pp_send_output_to_next_stage(result)
        else:
            failed = isinstance(result, PPStageError)
            self._pp_send_dict_to_next_stage(result if failed else result.pp_hidden_states_proxy_tensors)

    def _pp_recv_proxy_tensors(self: "Scheduler") -> "PPProxyTensors | PPStageError":
        """The previous stage's tensors for this micro-batch, or the PPStageError it sent in their place."""
        received = self.pp_group.recv_tensor_dict(device=self.worker_info.device)
        if isinstance(received, PPStageError):
            return received
        proxy = PPProxyTensors(received)
        tracing.point("SchedulerPPMixin._pp_recv_proxy_tensors", src=self.pp_group.prev_rank, **_traced(proxy))
        return proxy

    @tracing.traced(attrs=lambda self, proxy: {"dst": self.pp_group.next_rank, **_traced(proxy)})
    def _pp_send_dict_to_next_stage(self: "Scheduler", proxy: "PPProxyTensors | PPStageError") -> None:
        """Hand the tensors to the next stage; a PPStageError goes in place of their header (which
        GroupCoordinator.recv_tensor_dict then returns as is)."""
        if isinstance(proxy, PPStageError):
            self.pp_send_works += self.pp_group.send_object(proxy, self.pp_group.next_rank)
        else:
            self.pp_send_works += self.pp_group.send_tensor_dict(proxy.tensors)

    @tracing.traced(attrs=lambda self, result: {"dst": self.pp_group.next_rank, **_traced(result)})
    def _pp_send_output_to_next_stage(self: "Scheduler", result: "GenerationBatchResult | PPStageError") -> None:
        """The last stage sends a micro-batch's result (or its PPStageError) to stage 0."""
        out = result if isinstance(result, PPStageError) else _for_the_scheduler(result)
        self.pp_send_works += self.pp_group.send_object(out, self.pp_group.next_rank)

    def _pp_recv_output(self: "Scheduler", mb_id: int) -> "GenerationBatchResult | PPStageError":
        """The sampled result of micro-batch ``mb_id``: the last stage has it; stage 0 receives it from the
        last, and every later stage from the one before it, passing it on to the stage after."""
        if self.pp_group.is_last_rank:
            return self.last_rank_outputs.pop(mb_id)
        result = self.pp_group.recv_object(self.pp_group.prev_rank)
        if tracing.is_enabled():  # the ids as a list only when recording
            tracing.point("SchedulerPPMixin._pp_recv_output", src=self.pp_group.prev_rank, **_traced(result))
        if self.pp_group.rank_in_group < self.pp_group.world_size - 2:
            self.pp_send_works += self.pp_group.send_object(result, self.pp_group.next_rank)
        return result


def _for_the_scheduler(result: "GenerationBatchResult") -> "GenerationBatchResult":
    """What the other stages' schedulers read of a result: the tokens, logprobs and hidden states,
    not the [batch, vocab] logits they were sampled from."""
    out = dataclasses.replace(result.logits_output, next_token_logits=None)
    return dataclasses.replace(result, logits_output=out)


def _traced(what: "PPProxyTensors | GenerationBatchResult | PPStageError") -> dict:
    """A trace event's view of what crosses between stages: the tensors' shapes, a result's token ids,
    or the error."""
    if isinstance(what, PPStageError):
        return {"error": str(what)}
    if isinstance(what, PPProxyTensors):
        return {k: list(t.shape) for k, t in what.tensors.items()}
    return {"next_token_ids": what.next_token_ids.tolist()}
