"""SchedulerOverlapMixin: SGLang's event_loop_overlap on a CPU, with the forward on its own thread.

Mirrors event_loop_overlap, run_batch's overlap branch and the delayed result of
python/sglang/srt/managers/scheduler.py. While the forward of batch N runs, the
scheduler processes N-1's result and prepares N+1, whose inputs are N's *future*
token ids (overlap_utils.FutureMap). SGLang runs the forward on a CUDA stream of its
own and returns at once; minisgl does the same on a GPU (overlap_utils.StreamExecutor).
On a CPU every op blocks its caller, so there the forward runs on one worker thread
(as SGLang's older tp_worker_overlap_thread.py did); PyTorch releases the GIL inside
each op, so the two threads really overlap.

What follows from it, handled as SGLang handles it except where said:
- A request that finishes in N has already been put in N+1 (unless N's token is its
  last by length, which is known in advance): that forward decodes it
  once more for nothing, and its result is skipped. Its KV slots and req_to_token row
  stay reserved until N+1's forward is done (N+1 reads them), then they are released
  without the one extra slot.
- A batch whose sampling reads the previous token on the host (grammar masks,
  penalties, min_new_tokens) is launched without its sampling
  (ModelWorkerBatch.delay_sample): its forward runs while N's result is processed,
  then its sampling info is built and its sampling queued behind the forward
  (SGLang's delay_sample_func and launch_batch_sample_if_needed). SGLang delays only
  grammars; its penalties count up to the token before last, where minisgl's are exact.
- Before a batch whose routed experts are returned, and before a retraction, the
  result in flight is processed first (a sync).
- Two prefills in a row are not overlapped (the second would miss the first's prompt in
  the radix cache); SGLang does the same behind SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP.
- Speculative decoding runs with the normal loop (SGLang's v1 speculative path does too).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import copy
import logging

import torch

from minisgl import tracing
from minisgl.managers.overlap_utils import FutureIndices, FutureMap, StreamExecutor
from minisgl.managers.schedule_batch import Req, ScheduleBatch
from minisgl.managers.tp_worker import GenerationBatchResult
from minisgl.openmp_pool import one_openmp_thread, release_openmp_workers
from minisgl.sampling.sampling_batch_info import SamplingBatchInfo

logger = logging.getLogger(__name__)


class SchedulerOverlapMixin:
    """Mixed into Scheduler; ``self`` is the Scheduler."""

    def init_overlap(self) -> None:
        # Both loops keep these (empty in the normal loop), so the code they share need not ask.
        self.result_queue: collections.deque[tuple[ScheduleBatch, concurrent.futures.Future]] = collections.deque()
        self.future_token_ids: dict[str, int] = {}  # rid -> placeholder of its newest token, not yet processed
        self.deferred_releases: list[tuple[ScheduleBatch, Req, int]] = []  # (batch that reads it, req, KV to keep)
        self.enable_overlap = not self.server_args.disable_overlap_schedule
        if self.enable_overlap and not self.spec_algorithm.is_none():
            logger.warning("overlap scheduling is disabled because speculative decoding needs the normal loop")
            self.enable_overlap = False
        if not self.enable_overlap:
            return
        self.future_map = FutureMap(self.worker_info.max_running_requests, self.worker_info.device)
        self.forward_on_a_thread = not self.worker_info.device.startswith("cuda")  # a CPU's: see step_overlap
        if not self.forward_on_a_thread:
            self.forward_executor = StreamExecutor()
        else:
            # A new thread would start with OpenMP's default thread count, not the one torch was told.
            self.forward_executor = concurrent.futures.ThreadPoolExecutor(
                1, "minisgl-forward", initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),)
            )
            # The forward thread runs the parallel ops from now on. This thread's OpenMP workers, left
            # from loading the model, would make libgomp put both pools to sleep between ops, so they
            # end here, and its steps run on one thread (step_overlap) so as not to build them again.
            release_openmp_workers()

    def shutdown_overlap(self) -> None:
        """End the forward thread, and its OpenMP workers with it (a CPU's)."""
        if self.enable_overlap and self.forward_on_a_thread:
            self.forward_executor.shutdown(wait=True)

    def event_loop_overlap(self, recv_from_engine) -> None:
        """SGLang's event_loop_overlap for one TP rank; see _serve for the receive side."""
        self._serve(recv_from_engine, self.step_overlap)

    def step_overlap(self):
        """One iteration of event_loop_overlap: prepare and launch N+1, then process N. On a CPU this
        thread's ops run on it alone, so that the forward thread stays the process's one OpenMP
        master (minisgl/openmp_pool.py)."""
        with one_openmp_thread() if self.forward_on_a_thread else contextlib.nullcontext():
            return self._step_overlap()

    def _step_overlap(self):
        if self.result_queue and self._needs_sync():
            self.process_results_in_flight()
        # A request whose token in flight is its last by length is not decoded again.
        last = [r for r in self.running_batch.reqs if r.rid in self.future_token_ids and _reaches_length_limit(r)]
        if last:
            self.running_batch.reqs = [r for r in self.running_batch.reqs if r not in last]
        self.cur_batch = None
        batch = None
        try:
            batch = self.get_next_batch_to_run()
            if batch is not None:
                self._launch_batch(batch)
                self.last_batch = batch
        except Exception as e:
            if self.cur_batch is None:
                raise
            logger.exception("a batch failed; its requests are aborted")
            self._wait_for_forwards()
            self.abort_failed_batch(self.cur_batch, e)
            batch = None
        # The batch just launched runs while the one before it is accounted for.
        if len(self.result_queue) > (1 if batch is not None else 0):
            self._pop_and_process()
        self.launch_batch_sample_if_needed()
        self.drain_finished_in_flight()
        outputs, self.outputs = self.outputs, []
        return outputs

    def launch_batch_sample_if_needed(self) -> None:
        """Sample the batch just launched if its sampling was delayed (SGLang's method of this name).

        Every result before it has been processed by now, so the requests' grammars have accepted
        their previous tokens and their output ids hold them: the sampling info built here is the
        one the normal loop would build. The sampling is queued behind the forward (the one
        forward thread or stream), and it takes the forward's place in result_queue."""
        if not self.result_queue or not self.result_queue[-1][0].delay_sample:
            return
        launched, forward = self.result_queue[-1]
        assert len(self.result_queue) == 1, "a delayed sample must wait for every earlier result"
        launched.delay_sample = False  # launched now
        tracing.point(
            "Scheduler.launch_batch_sample", forward_mode=launched.forward_mode.name, batch_size=len(launched.reqs)
        )
        sample = self.forward_executor.submit(
            self._sample_with_future,
            forward,
            launched.build_sampling_info(),
            launched.future_indices,
            tracing.is_enabled(),
        )
        self.result_queue[-1] = (launched, sample)

    def process_results_in_flight(self) -> None:
        """Wait for every launched forward and process its result (a sync point)."""
        while self.result_queue:
            self._pop_and_process()

    def drain_finished_in_flight(self) -> None:
        """If only finished requests are in flight, wait for them: the scheduler is then idle as
        soon as the last request is answered (flush_cache, get_internal_state see a whole pool)."""
        if all(r.finished() for b, _ in self.result_queue for r in b.reqs):
            self.process_results_in_flight()

    def _needs_sync(self) -> bool:
        # Two prefills in a row: the second must see the first's prompt in the radix cache, and a
        # chunked request its next chunk (SGLang's SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP).
        launched = self.result_queue[-1][0]
        if launched.forward_mode.is_extend() and (self.waiting_queue or any(r.is_chunked for r in launched.reqs)):
            return True
        # A finished request's routed experts are read with no forward in flight.
        reqs = self.running_batch.reqs
        if self.last_batch is not None and self.last_batch.forward_mode.is_extend():
            reqs = reqs + self.last_batch.reqs
        return any(r.return_routed_experts for r in reqs)

    def _launch_batch(self, batch: ScheduleBatch) -> None:
        if batch.forward_mode.is_decode():
            kv_before = [s - batch.num_decode_tokens for s in batch.seq_lens]
        else:
            kv_before = list(batch.prefix_lens)
        delay_sample = any(_sampling_reads_last_token(r) for r in batch.reqs)
        # The sampling info is built here, on this thread (a delayed sample's, later).
        model_worker_batch = batch.get_model_worker_batch(delay_sample=delay_sample)
        future_indices = self.future_map.alloc_future_indices(batch.batch_size())
        placeholders = future_indices.placeholders()
        launched = copy.copy(batch)  # the running batch changes while this one is in flight
        launched.reqs = list(batch.reqs)
        launched.kv_lens_before = dict(zip((r.rid for r in batch.reqs), kv_before))
        launched.placeholders = placeholders
        launched.future_indices = future_indices
        launched.delay_sample = delay_sample
        for req, placeholder in zip(batch.reqs, placeholders):
            if not req.is_chunked:  # a chunk samples no token
                self.future_token_ids[req.rid] = placeholder
        if batch.forward_mode.is_extend():
            batch.reqs = [r for r in batch.reqs if not r.is_chunked]  # chunks never join the running batch
        tracing.point("Scheduler.launch_batch", forward_mode=batch.forward_mode.name, batch_size=len(launched.reqs))
        future = self.forward_executor.submit(
            self._forward_with_future, model_worker_batch, future_indices, tracing.is_enabled()
        )
        self.result_queue.append((launched, future))

    def _forward_with_future(
        self, model_worker_batch, future_indices: FutureIndices, trace: bool
    ) -> tuple[GenerationBatchResult, list[dict]]:
        """On the forward thread (a CPU) or stream (a GPU): resolve the batch's future ids, run it,
        publish its tokens. Its trace events come back with the result, to be added when the
        result is processed."""
        with tracing.record() if trace else contextlib.nullcontext([]) as events:
            input_ids = torch.tensor(model_worker_batch.input_ids, dtype=torch.int64, device=self.future_map.device)
            self.future_map.resolve_future(input_ids)
            model_worker_batch.input_ids = input_ids
            result = self.tp_worker.forward_batch_generation(model_worker_batch)
            if result.delay_sample_func is None:
                self.future_map.store_to_map(future_indices, result.next_token_ids)
        return result, events

    def _sample_with_future(
        self,
        forward: concurrent.futures.Future,
        sampling_info: SamplingBatchInfo,
        future_indices: FutureIndices,
        trace: bool,
    ) -> tuple[GenerationBatchResult, list[dict]]:
        """After _forward_with_future, on the same thread or stream: sample a delayed batch and
        publish its tokens. The forward has returned by now (it was queued first), so the base
        class's result() does not wait; a GPU's kernels may still run, and this one's follow
        them on the stream, where _DeviceFuture.result() would have made the scheduler wait."""
        result, events = concurrent.futures.Future.result(forward)
        with tracing.record() if trace else contextlib.nullcontext([]) as sample_events:
            result.next_token_ids = result.delay_sample_func(sampling_info)
            result.delay_sample_func = None
            self.future_map.store_to_map(future_indices, result.next_token_ids)
        return result, events + sample_events

    def _pop_and_process(self) -> None:
        batch, future = self.result_queue.popleft()
        reqs = list(batch.reqs)
        try:
            result, events = future.result()
            tracing.extend(events)
            tracing.point("Scheduler.process_batch_result", forward_mode=batch.forward_mode.name, batch_size=len(reqs))
            self.process_batch_result(batch, result)
        except Exception as e:
            logger.exception("a batch failed; its requests are aborted")
            self._wait_for_forwards()
            self.abort_failed_batch(batch, e)
        for req, placeholder in zip(reqs, batch.placeholders):
            if self.future_token_ids.get(req.rid) == placeholder:
                del self.future_token_ids[req.rid]  # its token is in output_ids now
        self.running_batch.filter_batch()
        # Requests that finished while this batch's forward could still read their KV.
        keep = []
        for reader, req, kv_len in self.deferred_releases:
            if reader is batch:
                self.release_kv_cache(req, kv_len)
            else:
                keep.append((reader, req, kv_len))
        self.deferred_releases = keep

    def defer_release(self, req: Req) -> bool:
        """Keep a finished request's KV while a launched forward still reads it (True if so)."""
        for batch, _ in reversed(self.result_queue):
            if any(r is req for r in batch.reqs):
                self.deferred_releases.append((batch, req, batch.kv_lens_before[req.rid]))
                return True
        return False

    def release_kv_cache(self, req: Req, kv_len: int) -> None:
        """Hand a finished request's KV to the radix cache (both loops; SGLang's release_kv_cache).
        Slots past kv_len, taken for a step the overlap loop ran after the request had
        finished, are freed: a page where one starts there (the others are in a freed page)."""
        page = self.worker_info.page_size
        extra = [pos for pos in range(kv_len, req.kv_len) if pos % page == 0]
        if extra:
            self.token_to_kv_pool_allocator.free(self.req_to_token_pool.req_to_token[req.req_pool_idx, extra].long())
        req.kv_len = kv_len
        self.tree_cache.cache_finished_req(req)
        req.req_pool_idx = None

    def _wait_for_forwards(self) -> None:
        """Let every launched forward end before an abort frees what it reads."""
        for _, future in self.result_queue:
            with contextlib.suppress(Exception):  # its own failure is handled when it is popped
                future.result()


def _sampling_reads_last_token(req: Req) -> bool:
    """Whether the request's sampling info depends on its previous token (then it is delayed). A
    custom logit processor does not: minisgl hands it no ``__req__``, unlike SGLang."""
    params = req.sampling_params
    return (
        req.grammar is not None
        or bool(params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0)
        or len(req.output_ids) < params.min_new_tokens
    )


def _reaches_length_limit(req: Req) -> bool:
    """True if the one token still to be appended ends the request by length, whatever it is."""
    return len(req.output_ids) + 1 >= req.sampling_params.max_new_tokens or req.seqlen + 1 >= req.max_req_len
