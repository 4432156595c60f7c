"""Scheduler: decide what runs next, run it through the TpModelWorker, account for the results.

Mirrors python/sglang/srt/managers/scheduler.py (handle_generate_request, get_next_batch_to_run,
get_new_batch_prefill, update_running_batch, run_batch, abort_request, the TP event loop);
admission lives in schedule_policy.py and result handling in scheduler_output_processor_mixin.py,
as in SGLang; the control requests (flush_cache, get_internal_state, the expert recorder) in
scheduler_control_mixin.py. Continuous batching works as in SGLang: a step either prefills newly
admitted requests or decodes the running batch, and a finished prefill joins the running batch at
the next step. When decode runs out of KV slots, requests are retracted to the waiting queue and
later re-prefilled from prompt + output so far. The scheduler talks only to the TpModelWorker,
never to a ModelRunner or a model (claim C1). With one rank the Engine runs the Scheduler
in-process; with tensor parallelism each rank runs one in its own process (scheduler_process.py),
rank 0 receiving the requests and broadcasting them, as SGLang does. step() runs one iteration of
either loop: event_loop_normal's here, event_loop_overlap's in scheduler_overlap_mixin.py. With
pipeline parallelism every stage runs event_loop_pp (scheduler_pp_mixin.py) instead.
SGLang's scheduler is also an IPC hub (ZMQ) and runs disaggregation; omitted.
"""

from __future__ import annotations

import logging
from multiprocessing.connection import Connection
from typing import Optional

import torch

from minisgl import tracing
from minisgl.constrained.grammar_manager import GrammarManager
from minisgl.distributed.parallel_state import get_tp_group
from minisgl.distributed.utils import broadcast_pyobj
from minisgl.hf_transformers_utils import get_tokenizer
from minisgl.managers.finish_reason import FINISH_ABORT
from minisgl.managers.io_struct import (
    AbortReq,
    ReqOutput,
    TokenizedGenerateReqInput,
)
from minisgl.managers.schedule_batch import Req, ScheduleBatch
from minisgl.managers.schedule_policy import (
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY,
    AddReqResult,
    PrefillAdder,
    SchedulePolicy,
)
from minisgl.managers.scheduler_control_mixin import SchedulerControlMixin
from minisgl.managers.scheduler_output_processor_mixin import SchedulerOutputProcessorMixin
from minisgl.managers.scheduler_overlap_mixin import SchedulerOverlapMixin
from minisgl.managers.scheduler_pp_mixin import SchedulerPPMixin
from minisgl.managers.tp_worker import GenerationBatchResult, TpModelWorker
from minisgl.mem_cache.radix_cache import RadixCache
from minisgl.server_args import ServerArgs
from minisgl.speculative.spec_info import SpeculativeAlgorithm

logger = logging.getLogger(__name__)

# An idle rank 0 wakes this often so the other ranks' broadcast never waits out its timeout.
IDLE_POLL_INTERVAL_S = 1.0


class Scheduler(SchedulerOutputProcessorMixin, SchedulerOverlapMixin, SchedulerControlMixin, SchedulerPPMixin):
    """Mirrors Scheduler in scheduler.py; see the module docstring for what it omits."""

    def __init__(self, server_args: ServerArgs, tp_rank: int = 0, pp_rank: int = 0) -> None:
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.pp_rank = pp_rank
        self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
        with tracing.span("Scheduler.__init__"):
            self.tp_worker = TpModelWorker(server_args, tp_rank=tp_rank, pp_rank=pp_rank)
            self.worker_info = self.tp_worker.get_worker_info()
            self.model_config = self.tp_worker.model_config
            self.req_to_token_pool, self.token_to_kv_pool_allocator = self.tp_worker.get_memory_pool()
            self.maybe_init_draft_worker()
            self.tokenizer = (
                None
                if server_args.skip_tokenizer_init
                else get_tokenizer(server_args.tokenizer_path or self.model_config.model_path)
            )
        self.tree_cache = RadixCache(
            self.req_to_token_pool,
            self.token_to_kv_pool_allocator,
            self.worker_info.page_size,
            disable=server_args.disable_radix_cache,
        )
        self.eos_token_ids = set(self.model_config.hf_eos_token_id)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.waiting_queue: list[Req] = []
        self.grammar_manager = GrammarManager(
            self.tokenizer, self.worker_info.vocab_size, self.eos_token_ids, server_args.grammar_compile_timeout
        )
        self.running_batch = self._new_batch([])
        self.running_mbs = [self.running_batch]  # the pipeline loop keeps one per micro-batch
        self.last_batch: Optional[ScheduleBatch] = None
        self.cur_batch: Optional[ScheduleBatch] = None  # the batch this step prepares, runs and accounts for
        self.outputs: list[ReqOutput] = []
        self.num_retracted_reqs = 0
        # Prefix-cache statistics: prompt tokens seen, and how many were served from the cache.
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.policy = SchedulePolicy(server_args.schedule_policy, self.tree_cache)
        self._rid_to_req: dict[str, Req] = {}
        self.init_overlap()

    def maybe_init_draft_worker(self) -> None:
        """With speculative decoding, the draft worker wraps the target's (SGLang's order and name)."""
        self.draft_worker = None
        if not self.spec_algorithm.is_none():
            worker_cls = self.spec_algorithm.create_worker(self.server_args)
            self.draft_worker = worker_cls(self.server_args, self.tp_rank, target_worker=self.tp_worker)

    def _new_batch(self, reqs: list[Req]) -> ScheduleBatch:
        return ScheduleBatch.init_new(
            reqs,
            self.req_to_token_pool,
            self.token_to_kv_pool_allocator,
            self.tree_cache,
            self.worker_info.vocab_size,
            self.worker_info.device,
            num_decode_tokens=self.server_args.speculative_num_slots_per_round(),
        )

    # ---- requests in ---------------------------------------------------------------------

    def handle_generate_request(self, recv_req: TokenizedGenerateReqInput) -> None:
        params = recv_req.sampling_params
        generator = None
        if not params.is_greedy:
            generator = torch.Generator(device=self.worker_info.device)
            seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,)))
            generator.manual_seed(seed)
        req = Req(recv_req, self.eos_token_ids, self.worker_info.max_req_len, generator)
        self._rid_to_req[req.rid] = req
        if not self.grammar_manager.process_req_with_grammar(req):
            self.waiting_queue.append(req)

    def abort_request(self, rid: str) -> None:
        """Finish a request now, wherever it is, and free its KV at once."""
        req = self._rid_to_req.get(rid)
        if req is None or req.finished():
            return
        req.finished_reason = FINISH_ABORT("aborted by request")
        if req in self.waiting_queue:
            self.waiting_queue.remove(req)  # a chunked request waits here holding KV
        else:
            for batch in self.running_mbs:
                batch.filter_batch()
        self._finish(req)
        self.drain_finished_in_flight()

    # ---- choosing a batch ----------------------------------------------------------------

    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        # A prefill that just ran joins the running batch (continuous batching).
        if self.last_batch is not None and self.last_batch.forward_mode.is_extend():
            self.last_batch.filter_batch()
            self.running_batch.merge_batch(self.last_batch)
        self.last_batch = None

        batch = self.get_new_batch_prefill()
        if batch is None and not self.running_batch.is_empty():
            batch = self.update_running_batch(self.running_batch)
        if batch is not None:
            tracing.point(
                "Scheduler.get_next_batch_to_run", forward_mode=batch.forward_mode.name, batch_size=batch.batch_size()
            )
        return batch

    def get_new_batch_prefill(self) -> Optional[ScheduleBatch]:
        idle = not self.waiting_queue and self.running_batch.is_empty()
        for req in self.grammar_manager.get_ready_grammar_requests(block=idle):
            if req.finished():
                self._finish(req)  # its grammar failed to compile
            else:
                self.waiting_queue.append(req)
        if not self.waiting_queue:
            return None
        self.policy.calc_priority(self.waiting_queue)
        # A mixed batch's decode rows count against its token budgets (SGLang's mixed_with_decode_tokens).
        mixed = len(self.running_batch.reqs) if self.server_args.enable_mixed_chunk else 0
        chunk = self.server_args.chunked_prefill_size
        adder = PrefillAdder(
            self.tree_cache,
            self.token_to_kv_pool_allocator,
            self.running_batch.reqs,
            self.new_token_ratio,
            self.req_to_token_pool.available_size(),
            self.worker_info.max_running_requests,
            None if chunk is None else chunk - mixed,
            self.worker_info.max_prefill_tokens - mixed,
        )
        for req in self.waiting_queue:
            if adder.add_one_req(req) == AddReqResult.STOP:
                break
        for req in adder.can_run_list:
            if req.req_pool_idx is None and req.total_retractions == 0:
                req.cached_tokens = len(req.prefix_indices)
                self.num_prompt_tokens += len(req.origin_input_ids)
                self.num_cached_tokens += req.cached_tokens
        if not adder.can_run_list:
            return None
        admitted = set(map(id, adder.can_run_list))
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        batch = self.cur_batch = self._new_batch(adder.can_run_list)
        batch.prepare_for_extend()
        if self._can_mix():
            self.running_batch.prepare_for_decode(self.future_token_ids)
            batch.mix_with_running(self.running_batch)
            self.running_batch.reqs = []  # they come back with the mixed batch, as a prefill's do
        return batch

    def _can_mix(self) -> bool:
        """--enable-mixed-chunk: fold the running requests' decode step into this prefill, unless their
        KV does not fit (the next decode step retracts). SGLang also declines when a request wants
        logprobs; here a decode row's logprobs and hidden states come out as a one-token extend's."""
        running = self.running_batch
        return self.server_args.enable_mixed_chunk and not running.is_empty() and running.check_decode_mem()

    def update_running_batch(self, batch: ScheduleBatch) -> Optional[ScheduleBatch]:
        if not batch.check_decode_mem():
            self.process_results_in_flight()  # overlap: retract only settled requests
        if batch.is_empty():
            return None
        if not batch.check_decode_mem():
            retracted = batch.retract_decode()
            self.num_retracted_reqs += len(retracted)
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO
            tracing.point("Scheduler.retract_decode", num_retracted=len(retracted))
            self.waiting_queue = retracted + self.waiting_queue
            if not batch.check_decode_mem():
                # One request alone does not fit: it can never finish, so end it with a reason.
                for req in batch.reqs:
                    req.finished_reason = FINISH_ABORT("the KV cache is too small for this request")
                    self._finish(req)
                batch.filter_batch()
                return None
        self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        self.cur_batch = batch
        batch.prepare_for_decode(self.future_token_ids)
        return batch

    # ---- running it ----------------------------------------------------------------------

    @tracing.traced(attrs=lambda self, batch: {"forward_mode": batch.forward_mode.name})
    def run_batch(self, batch: ScheduleBatch) -> GenerationBatchResult:
        if self.draft_worker is not None:
            # SGLang's speculative (non-overlap) path hands the draft worker the ScheduleBatch.
            return self.draft_worker.forward_batch_generation(batch)
        return self.tp_worker.forward_batch_generation(batch.get_model_worker_batch())

    def _finish(self, req: Req, new_ids: Optional[list[int]] = None) -> None:
        if req.req_pool_idx is not None:
            if req.return_routed_experts:
                slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len]
                req.routed_experts = self.tp_worker.get_routed_experts(slots)
            if not self.defer_release(req):
                self.release_kv_cache(req, req.kv_len)
        self._rid_to_req.pop(req.rid, None)
        req.grammar = None  # frees its matcher
        if new_ids is None:
            new_ids = [req.output_ids[-1]] if req.output_ids else []
        self._emit(req, new_ids)

    # ---- the loop --------------------------------------------------------------------------

    @tracing.traced
    def step(self) -> list[ReqOutput]:
        """One iteration of the chosen loop, minus receiving; both drivers call this."""
        return self.step_overlap() if self.enable_overlap else self.step_normal()

    def step_normal(self) -> list[ReqOutput]:
        """One iteration of SGLang's event_loop_normal, minus receiving: pick, run, account.

        Fault isolation, a second line behind request validation: an exception while a
        batch is prepared, run or accounted for ends that batch's requests with the error
        and frees their KV; the other requests go on. One raised outside any batch cannot
        be attributed, so it propagates (SGLang's scheduler dies on any exception)."""
        self.cur_batch = None
        try:
            batch = self.get_next_batch_to_run()
            if batch is not None:
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
                self.last_batch = batch
        except Exception as e:
            if self.cur_batch is None:
                raise
            logger.exception("a batch failed; its requests are aborted")
            self.abort_failed_batch(self.cur_batch, e)
        outputs, self.outputs = self.outputs, []
        return outputs

    def abort_failed_batch(self, batch: ScheduleBatch, error: Exception) -> None:
        failed = [r for r in batch.reqs if self._rid_to_req.get(r.rid) is r]  # not yet finished and sent
        batch.release_failed_reqs(failed)
        for req in failed:
            req.finished_reason = FINISH_ABORT(f"internal error: {type(error).__name__}: {error}")
            self._rid_to_req.pop(req.rid)
            self._emit(req, [])
        # A chunked request may be back in the queue; a decode batch is the running batch.
        self.waiting_queue = [r for r in self.waiting_queue if not r.finished()]
        self.running_batch.filter_batch()

    def is_idle(self) -> bool:
        return not self._rid_to_req and not self.result_queue

    # ---- tensor parallelism: one scheduler process per rank ------------------------------

    def event_loop(self, recv_from_engine: Optional[Connection]) -> None:
        """One rank's loop: event_loop_pp for a pipeline stage, else event_loop_overlap or
        event_loop_normal, as server_args chose."""
        if self.server_args.pp_size > 1:
            self.event_loop_pp(recv_from_engine)
        else:
            (self.event_loop_overlap if self.enable_overlap else self.event_loop_normal)(recv_from_engine)

    def event_loop_normal(self, recv_from_engine: Optional[Connection]) -> None:
        """SGLang's event_loop_normal for one TP rank."""
        self._serve(recv_from_engine, self.step_normal)

    def _serve(self, recv_from_engine: Optional[Connection], step) -> None:
        """Receive and broadcast, then step, until the Engine shuts down. Every rank runs the
        same requests through the same deterministic decisions, so the batches (and the
        collectives inside the forward) line up; only rank 0 hears from the Engine."""
        while True:
            recv_reqs = self.recv_requests(recv_from_engine)
            if any(r is None for r in recv_reqs):
                return  # the Engine shut down
            replies = self.process_input_requests(recv_reqs)
            outputs = step()
            if self.tp_rank == 0 and (outputs or replies):
                recv_from_engine.send(("out", outputs, replies))

    def recv_requests(self, recv_from_engine: Optional[Connection]) -> list:
        """Rank 0 takes everything the Engine has sent and broadcasts it; all ranks return it
        (SGLang's recv_requests)."""
        recv_reqs = []
        if self.tp_rank == 0:
            # Wait while idle, but not forever: the other ranks wait inside the broadcast,
            # and a collective left open for the group's timeout fails.
            if recv_from_engine.poll(IDLE_POLL_INTERVAL_S if self.is_idle() else 0):
                while recv_from_engine.poll():
                    recv_reqs += recv_from_engine.recv()  # each message is a list of requests
        tp_group = get_tp_group()
        recv_reqs = broadcast_pyobj(recv_reqs, self.tp_rank, tp_group.cpu_group if tp_group else None)
        if recv_reqs:
            tracing.point("Scheduler.recv_requests", num_reqs=len(recv_reqs), source_rank=0)
        return recv_reqs

    @tracing.traced(attrs=lambda self, recv_reqs: {"num_reqs": len(recv_reqs)})
    def process_input_requests(self, recv_reqs: list) -> list:
        """Apply each request in order; return the control requests' replies, in order (an
        exception for one that failed). Every driver and every TP rank comes through here, so
        every rank isolates alike: a generate request the scheduler cannot queue (validation
        should have caught it) ends alone, with an abort, and the others are applied."""
        replies = []
        for req in recv_reqs:
            if isinstance(req, TokenizedGenerateReqInput):
                try:
                    self.handle_generate_request(req)
                except Exception as e:
                    logger.exception("request %s could not be queued", req.rid)
                    self._refuse(req, e)
            elif isinstance(req, AbortReq):
                self.abort_request(req.rid)
            else:
                try:
                    replies.append(self.handle_control_request(req))
                except Exception as e:  # the caller's mistake (e.g. recorder off): it gets the error
                    replies.append(e)
        return replies

    def _refuse(self, recv_req: TokenizedGenerateReqInput, error: Exception) -> None:
        req = self._rid_to_req.pop(recv_req.rid, None)
        if req is not None and req in self.waiting_queue:
            self.waiting_queue.remove(req)
        reason = FINISH_ABORT(f"the request could not be queued: {type(error).__name__}: {error}")
        meta = {"id": recv_req.rid, "prompt_tokens": len(recv_req.input_ids), "completion_tokens": 0}
        self.outputs.append(ReqOutput(recv_req.rid, [], True, {**meta, "finish_reason": reason.to_json()}))

    def shutdown(self) -> None:
        """The overlap loop's forward thread ends; the rest goes with the scheduler's owner."""
        self.shutdown_overlap()
