"""Scheduler: decide what runs next, run it through the TpModelWorker, account for the results.

Mirrors python/sglang/srt/managers/scheduler.py (handle_generate_request,
get_next_batch_to_run, get_new_batch_prefill, update_running_batch, run_batch,
process_batch_result, abort_request) and the admission rules of
schedule_policy.py (PrefillAdder). Continuous batching works as in SGLang: a
step either prefills newly admitted requests or decodes the running batch, and
a finished prefill joins the running batch at the next step. When decode runs
out of KV slots, requests are retracted to the waiting queue and later
re-prefilled from prompt + output so far. The scheduler talks only to the
TpModelWorker, never to a ModelRunner or a model (claim C1). With one rank
the Engine runs the Scheduler in-process; with tensor parallelism each rank
runs one in its own process (run_scheduler_process), rank 0 receiving the
requests and broadcasting them, as SGLang does. SGLang's scheduler is also an
IPC hub (ZMQ), runs overlap scheduling and disaggregation; omitted.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Optional

import torch

from minisgl import tracing
from minisgl.constrained.grammar_manager import GrammarManager
from minisgl.distributed.parallel_state import destroy_distributed_environment, get_tp_group
from minisgl.distributed.utils import broadcast_pyobj
from minisgl.eplb.expert_distribution import get_global_expert_distribution_recorder
from minisgl.hf_transformers_utils import get_tokenizer
from minisgl.managers.io_struct import (
    AbortReq,
    ExpertDistributionReq,
    FlushCacheReqInput,
    GetInternalStateReq,
    ReqOutput,
    TokenizedGenerateReqInput,
)
from minisgl.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req, ScheduleBatch
from minisgl.managers.tp_worker import GenerationBatchResult, TpModelWorker
from minisgl.mem_cache.radix_cache import RadixCache
from minisgl.server_args import ServerArgs
from minisgl.speculative.spec_info import SpeculativeAlgorithm

logger = logging.getLogger(__name__)

# SGLang's defaults: admission reserves decode room for only a fraction of each request's
# remaining max_new_tokens (most requests stop early). The fraction decays while decoding
# goes well and jumps back after a retraction; remaining tokens are clipped at 4096.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
CLIP_MAX_NEW_TOKENS = 4096
# SGLang's in-batch prefix check: a request whose first tokens equal those of a request
# already admitted this round waits one round, so it can reuse that request's KV.
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
# An idle rank 0 wakes this often so the other ranks' broadcast never waits out its timeout.
IDLE_POLL_INTERVAL_S = 1.0
# Where rank processes write their trace events (read by the launcher, see run_scheduler_process).
TRACE_DIR_ENV = "MINISGL_TRACE_DIR"


class Scheduler:
    def __init__(self, server_args: ServerArgs, tp_rank: int = 0) -> None:
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
        with tracing.span("Scheduler.__init__"):
            self.tp_worker = TpModelWorker(server_args, tp_rank=tp_rank)
            self.worker_info = self.tp_worker.get_worker_info()
            self.model_config = self.tp_worker.model_config
            self.req_to_token_pool, self.token_to_kv_pool_allocator = self.tp_worker.get_memory_pool()
            self.maybe_init_draft_worker()
            self.tokenizer = None if server_args.skip_tokenizer_init else get_tokenizer(
                server_args.tokenizer_path or self.model_config.model_path
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
        self.grammar_manager = GrammarManager(self.tokenizer, self.worker_info.vocab_size, self.eos_token_ids)
        self.running_batch = self._new_batch([])
        self.last_batch: Optional[ScheduleBatch] = None
        self.outputs: list[ReqOutput] = []
        self.num_retracted_reqs = 0
        # Prefix-cache statistics: prompt tokens seen, and how many were served from the cache.
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._rid_to_req: dict[str, Req] = {}

    def maybe_init_draft_worker(self) -> None:
        """With speculative decoding, the draft worker wraps the target's (SGLang's order and name)."""
        self.draft_worker = None
        if not self.spec_algorithm.is_none():
            worker_cls = self.spec_algorithm.create_worker()
            self.draft_worker = worker_cls(self.server_args, self.tp_rank, target_worker=self.tp_worker)

    def _new_batch(self, reqs: list[Req]) -> ScheduleBatch:
        return ScheduleBatch.init_new(
            reqs,
            self.req_to_token_pool,
            self.token_to_kv_pool_allocator,
            self.tree_cache,
            self.worker_info.vocab_size,
            self.worker_info.device,
            num_decode_tokens=self.server_args.speculative_num_draft_tokens or 1,
        )

    # ---- requests in ---------------------------------------------------------------------

    def handle_generate_request(self, recv_req: TokenizedGenerateReqInput) -> None:
        params = recv_req.sampling_params
        generator = None
        if not params.is_greedy:
            generator = torch.Generator(device=self.worker_info.device)
            seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,)))
            generator.manual_seed(seed)
        req = Req(
            rid=recv_req.rid,
            origin_input_text=recv_req.input_text,
            origin_input_ids=recv_req.input_ids,
            sampling_params=params,
            eos_token_ids=self.eos_token_ids,
            max_req_len=self.worker_info.max_req_len,
            return_logprob=recv_req.return_logprob,
            logprob_start_len=recv_req.logprob_start_len,
            top_logprobs_num=recv_req.top_logprobs_num,
            token_ids_logprob=recv_req.token_ids_logprob,
            return_hidden_states=recv_req.return_hidden_states,
            return_routed_experts=recv_req.return_routed_experts,
            generator=generator,
        )
        error = self._validate(req)
        if error is not None:
            # Never drop a request silently: it finishes at once, with the reason.
            req.finished_reason = FINISH_ABORT(error)
            self._emit(req, [])
            return
        self._rid_to_req[req.rid] = req
        if not self.grammar_manager.process_req_with_grammar(req):
            self.waiting_queue.append(req)

    def _validate(self, req: Req) -> Optional[str]:
        prompt_len = len(req.origin_input_ids)
        if prompt_len == 0:
            return "the prompt is empty"
        if prompt_len > self.worker_info.max_req_input_len:
            return (
                f"the prompt has {prompt_len} tokens, more than the {self.worker_info.max_req_input_len} "
                f"allowed by the context length {self.worker_info.max_req_len}"
            )
        if prompt_len + 1 > self.worker_info.max_total_num_tokens:
            return f"the prompt needs {prompt_len + 1} KV slots, the whole pool has {self.worker_info.max_total_num_tokens}"
        if any(not 0 <= t < self.worker_info.vocab_size for t in req.origin_input_ids):
            return f"input ids must be in [0, {self.worker_info.vocab_size})"
        if req.return_hidden_states and not self.server_args.enable_return_hidden_states:
            return "return_hidden_states needs the engine started with enable_return_hidden_states=True"
        if req.return_routed_experts and not self.server_args.enable_return_routed_experts:
            return "return_routed_experts needs the engine started with enable_return_routed_experts=True"
        if req.return_routed_experts and not self.model_config.is_moe:
            return "return_routed_experts needs a mixture-of-experts model"
        if self.draft_worker is not None:
            params = req.sampling_params
            if req.return_logprob or req.return_hidden_states:
                return "speculative decoding does not return logprobs or hidden states"
            if params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0:
                # A drafted position's penalties would depend on the drafts before it.
                return "speculative decoding does not apply frequency, presence or repetition penalties"
            if params.grammar_key is not None:
                return "speculative decoding does not support json_schema, regex or ebnf constraints"
        return None

    def abort_request(self, rid: str) -> None:
        """Finish a request now, wherever it is, and free its KV at once."""
        req = self._rid_to_req.get(rid)
        if req is None or req.finished():
            return
        req.finished_reason = FINISH_ABORT("aborted by request")
        if req in self.waiting_queue:
            self.waiting_queue.remove(req)  # a chunked request waits here holding KV
        else:
            self.running_batch.filter_batch()
        self._finish(req)

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
        info = self.worker_info
        page = info.page_size
        running = self.running_batch.reqs
        if self.server_args.schedule_policy == "lpm":
            for req in self.waiting_queue:
                req.init_next_round_input(self.tree_cache)
            # Longest cached prefix first: the most reuse before the cache changes.
            self.waiting_queue.sort(key=lambda r: -len(r.prefix_indices))
        # Room the running requests will still need for decoding.
        reserved = sum(self._decode_reservation(r) for r in running)
        free_tokens = self.token_to_kv_pool_allocator.available_size() + self.tree_cache.evictable_size() - reserved
        free_req_slots = self.req_to_token_pool.available_size()
        chunk_budget = self.server_args.chunked_prefill_size
        can_run: list[Req] = []
        admitted_prefixes: set[tuple[int, ...]] = set()
        prefill_tokens = 0
        for req in self.waiting_queue:
            if len(running) + len(can_run) >= info.max_running_requests:
                break
            if req.req_pool_idx is None and free_req_slots == 0:
                break
            req.init_next_round_input(self.tree_cache)  # lazily: requests behind the first refused are never matched
            head = tuple(req.fill_ids[:IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD])
            if (
                not self.tree_cache.disable
                and len(req.prefix_indices) < IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
                and head in admitted_prefixes
            ):
                continue
            if chunk_budget is not None and not req.wants_prompt_logprobs():
                room = (chunk_budget - prefill_tokens) // page * page
                if room <= 0:
                    break
                if req.extend_input_len > room:
                    # Chunked prefill: run the first `room` tokens now, the rest in later rounds.
                    req.fill_ids = req.fill_ids[: req.prefix_len + room]
                    req.extend_input_len = room
                    req.is_chunked = True
            need = math.ceil(req.extend_input_len / page) * page
            # With nothing else running, the oldest request starts as soon as its prompt fits;
            # if its decode later outgrows the pool, update_running_batch ends it with a reason.
            if running or can_run:
                need += self._decode_reservation(req)
            if need > free_tokens:
                req.is_chunked = False
                break
            if can_run and not req.is_chunked and prefill_tokens + req.extend_input_len > info.max_prefill_tokens:
                break
            if req.req_pool_idx is None:  # a new (or retracted) request: lock the prefix it will read
                self.tree_cache.inc_lock_ref(req.last_node)
                if req.num_retractions == 0:
                    req.cached_tokens = len(req.prefix_indices)
                    self.num_prompt_tokens += len(req.origin_input_ids)
                    self.num_cached_tokens += req.cached_tokens
            can_run.append(req)
            admitted_prefixes.add(head)
            free_tokens -= need
            free_req_slots -= req.req_pool_idx is None
            prefill_tokens += req.extend_input_len
            if req.is_chunked:
                break  # a chunked request is the last of its batch
        if not can_run:
            return None
        admitted = set(map(id, can_run))
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        batch = self._new_batch(can_run)
        batch.prepare_for_extend()
        return batch

    def _decode_reservation(self, req: Req) -> int:
        remaining = min(req.sampling_params.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)
        return math.ceil(max(remaining, 0) * self.new_token_ratio)

    def update_running_batch(self, batch: ScheduleBatch) -> Optional[ScheduleBatch]:
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
        batch.prepare_for_decode()
        return batch

    # ---- running it ----------------------------------------------------------------------

    def run_batch(self, batch: ScheduleBatch) -> GenerationBatchResult:
        with tracing.span("Scheduler.run_batch", forward_mode=batch.forward_mode.name):
            if self.draft_worker is not None:
                # SGLang's speculative (non-overlap) path hands the draft worker the ScheduleBatch.
                return self.draft_worker.forward_batch_generation(batch)
            return self.tp_worker.forward_batch_generation(batch.get_model_worker_batch())

    def process_batch_result(self, batch: ScheduleBatch, result: GenerationBatchResult) -> None:
        new_token_ids = _split_per_request(result)
        out = result.logits_output
        hidden_offset = 0
        still_running = []
        for i, req in enumerate(batch.reqs):
            if batch.forward_mode.is_extend():
                self._record_extend_side_outputs(req, out, i, hidden_offset, batch.prefix_lens[i])
                hidden_offset += batch.extend_lens[i]
                if req.is_chunked:
                    # Not the whole prompt yet: no token; publish the chunk and come back first.
                    req.is_chunked = False
                    self.tree_cache.cache_unfinished_req(req)
                    self.waiting_queue.insert(0, req)
                    continue
            elif out.hidden_states is not None and req.return_hidden_states:
                req.hidden_states.append(out.hidden_states[i].tolist())
            new_ids = []
            if req.sampling_params.max_new_tokens == 0:
                req.finished_reason = FINISH_LENGTH(0)  # prefill only (e.g. to warm the cache)
            else:
                new_ids = self._append_output_ids(req, new_token_ids[i], out, i)
            if result.accept_length_per_req_cpu is not None:
                self._account_spec_round(req, result.accept_length_per_req_cpu[i])
            if req.finished():
                self._finish(req, new_ids)
                continue
            if batch.forward_mode.is_extend():
                self.tree_cache.cache_unfinished_req(req)
            self._emit(req, new_ids)
            still_running.append(req)
        batch.reqs = still_running

    def _append_output_ids(self, req: Req, token_ids: list[int], out, i: int) -> list[int]:
        """Append the step's tokens (several after a speculative round) up to the first that ends it."""
        appended = []
        for token_id in token_ids:
            req.output_ids.append(token_id)
            appended.append(token_id)
            if req.grammar is not None and not req.grammar.accept_token(token_id):
                req.finished_reason = FINISH_ABORT(f"token {token_id} broke the request's grammar")
            if req.return_logprob:
                self._record_output_logprobs(req, out, i)
            req.check_finished(self._tail_text(req))
            if req.finished():
                break
        return appended

    def _account_spec_round(self, req: Req, num_accepted: int) -> None:
        req.spec_verify_ct += 1
        req.spec_accepted_tokens += num_accepted
        if req.kv_len > req.seqlen - 1:
            # It finished inside the accepted run: tokens it did not keep need no KV.
            self.draft_worker.release_kv(req, req.seqlen - 1)

    def _record_extend_side_outputs(self, req: Req, out, i: int, row_offset: int, prefix_len: int) -> None:
        if req.return_logprob and out.input_token_logprobs is not None:
            req.input_token_logprobs += out.input_token_logprobs[i]
            if out.input_top_logprobs_val[i] is not None:
                req.input_top_logprobs_val += out.input_top_logprobs_val[i]
                req.input_top_logprobs_idx += out.input_top_logprobs_idx[i]
            if out.input_token_ids_logprobs_val[i] is not None:
                req.input_token_ids_logprobs_val += out.input_token_ids_logprobs_val[i]
                req.input_token_ids_logprobs_idx += out.input_token_ids_logprobs_idx[i]
        if req.return_hidden_states and out.hidden_states is not None:
            # Keep each position once: a retracted request re-prefills positions it already has.
            for pos in range(len(req.hidden_states), req.kv_len):
                req.hidden_states.append(out.hidden_states[row_offset + pos - prefix_len].tolist())

    @staticmethod
    def _record_output_logprobs(req: Req, out, i: int) -> None:
        req.output_token_logprobs.append(float(out.next_token_logprobs[i]))
        if out.next_token_top_logprobs_val is not None:
            req.output_top_logprobs_val.append(out.next_token_top_logprobs_val[i])
            req.output_top_logprobs_idx.append(out.next_token_top_logprobs_idx[i])
        if out.next_token_token_ids_logprobs_val is not None:
            req.output_token_ids_logprobs_val.append(out.next_token_token_ids_logprobs_val[i])
            req.output_token_ids_logprobs_idx.append(out.next_token_token_ids_logprobs_idx[i])

    def _tail_text(self, req: Req) -> Optional[str]:
        stops = req.sampling_params.stop_strs
        if not stops or self.tokenizer is None:
            return None
        # Enough trailing tokens to contain the longest stop string: a token is at least one
        # byte (byte-level BPE splits a multibyte character), so count bytes, not characters.
        n = max(len(s.encode()) for s in stops) + 1
        return self.tokenizer.decode(req.output_ids[-n:])

    def _finish(self, req: Req, new_ids: Optional[list[int]] = None) -> None:
        if req.req_pool_idx is not None:
            if req.return_routed_experts:
                slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len]
                req.routed_experts = self.tp_worker.get_routed_experts(slots)
            self.tree_cache.cache_finished_req(req)
            req.req_pool_idx = None
        self._rid_to_req.pop(req.rid, None)
        req.grammar = None  # frees its matcher
        if new_ids is None:
            new_ids = [req.output_ids[-1]] if req.output_ids else []
        self._emit(req, new_ids)

    def _emit(self, req: Req, new_ids: list[int]) -> None:
        meta = self._build_meta_info(req) if req.finished() else None
        if meta is not None and req.spec_verify_ct > 0:
            meta.update(self._spec_meta_info(req))
        self.outputs.append(ReqOutput(req.rid, new_ids, req.finished(), meta))

    def _spec_meta_info(self, req: Req) -> dict:
        """SGLang's speculative metrics (its TokenizerManager computes them from the same counters)."""
        drafted = req.spec_verify_ct * self.server_args.speculative_num_steps
        return {
            "spec_verify_ct": req.spec_verify_ct,
            "spec_accept_token_num": req.spec_accepted_tokens,
            "spec_draft_token_num": drafted,
            "spec_accept_rate": req.spec_accepted_tokens / drafted,
            # Tokens per target forward (the first came from the prefill, as in SGLang).
            "spec_accept_length": len(req.output_ids) / req.spec_verify_ct,
        }

    @staticmethod
    def _build_meta_info(req: Req) -> dict:
        meta = {
            "id": req.rid,
            "prompt_tokens": len(req.origin_input_ids),
            "completion_tokens": len(req.output_ids),
            "finish_reason": req.finished_reason.to_json(),
            "cached_tokens": req.cached_tokens,
            "num_retractions": req.num_retractions,
        }
        if req.return_logprob:
            # SGLang's shape: (logprob, token_id, text); text is filled by the front end if asked.
            start = req.logprob_start_len
            prompt_ids = req.origin_input_ids[start:]
            meta["input_token_logprobs"] = [(lp, t, None) for lp, t in zip(req.input_token_logprobs, prompt_ids)]
            meta["output_token_logprobs"] = [
                (lp, t, None) for lp, t in zip(req.output_token_logprobs, req.output_ids)
            ]
            meta["input_top_logprobs"] = _zip_top(req.input_top_logprobs_val, req.input_top_logprobs_idx)
            meta["output_top_logprobs"] = _zip_top(req.output_top_logprobs_val, req.output_top_logprobs_idx)
            meta["input_token_ids_logprobs"] = _zip_top(req.input_token_ids_logprobs_val, req.input_token_ids_logprobs_idx)
            meta["output_token_ids_logprobs"] = _zip_top(
                req.output_token_ids_logprobs_val, req.output_token_ids_logprobs_idx
            )
        if req.return_hidden_states:
            meta["hidden_states"] = req.hidden_states
        if req.return_routed_experts and req.routed_experts is not None:
            meta["routed_experts"] = req.routed_experts
        return meta

    def flush_cache(self) -> bool:
        """Empty the radix cache; refused (False) while requests are in flight, as in SGLang."""
        if not self.is_idle():
            return False
        return self.tree_cache.flush()

    def get_cache_stats(self) -> dict:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "cached_tokens": self.num_cached_tokens,
            "hit_rate": self.num_cached_tokens / max(self.num_prompt_tokens, 1),
            "evictable_tokens": self.tree_cache.evictable_size(),
            "available_kv_tokens": self.token_to_kv_pool_allocator.available_size(),
            "max_total_num_tokens": self.worker_info.max_total_num_tokens,
        }

    def expert_distribution_handle(self, action: str, output_path: Optional[str] = None):
        recorder = get_global_expert_distribution_recorder()
        if action == "start":
            return recorder.start_record()
        if action == "stop":
            return recorder.stop_record()
        return recorder.dump_record(output_path)

    # ---- the loop --------------------------------------------------------------------------

    def step(self) -> list[ReqOutput]:
        """One iteration of SGLang's event_loop_normal, minus receiving: pick, run, account."""
        batch = self.get_next_batch_to_run()
        if batch is not None:
            result = self.run_batch(batch)
            self.process_batch_result(batch, result)
            self.last_batch = batch
        outputs, self.outputs = self.outputs, []
        return outputs

    def is_idle(self) -> bool:
        return not self._rid_to_req

    # ---- tensor parallelism: one scheduler process per rank ------------------------------

    def event_loop_normal(self, recv_from_engine: Optional[Connection]) -> None:
        """SGLang's event_loop_normal for one TP rank: receive and broadcast, then step.

        Every rank runs the same requests through the same deterministic decisions, so the
        batches (and the collectives inside the forward) line up without further talk.
        Only rank 0 hears from the Engine and answers it."""
        while True:
            recv_reqs = self.recv_requests(recv_from_engine)
            if any(r is None for r in recv_reqs):
                return  # the Engine shut down
            replies = self.process_input_requests(recv_reqs)
            outputs = self.step()
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

    def process_input_requests(self, recv_reqs: list) -> list:
        """Apply each request; return the control requests' replies, in order."""
        replies = []
        for req in recv_reqs:
            if isinstance(req, TokenizedGenerateReqInput):
                self.handle_generate_request(req)
            elif isinstance(req, AbortReq):
                self.abort_request(req.rid)
            else:
                try:
                    replies.append(self._handle_control_request(req))
                except Exception as e:  # the caller's mistake (e.g. recorder off): it gets the error
                    replies.append(e)
        return replies

    def _handle_control_request(self, req):
        if isinstance(req, FlushCacheReqInput):
            return self.flush_cache()
        if isinstance(req, GetInternalStateReq):
            return self.get_cache_stats()
        if isinstance(req, ExpertDistributionReq):
            if req.action == "dump" and self.tp_rank != 0:
                return None  # routing is replicated, so every rank counted the same; one writes
            return self.expert_distribution_handle(req.action, req.output_path)
        raise TypeError(f"unknown request {type(req).__name__}")


def run_scheduler_process(
    server_args: ServerArgs,
    tp_rank: int,
    recv_from_engine: Optional[Connection] = None,
    trace_dir: Optional[str] = None,
) -> None:
    """The body of one TP rank's process (SGLang's run_scheduler_process).

    Builds this rank's Scheduler (and with it the TpModelWorker, which joins the process
    group), tells the Engine it is ready (rank 0 only), then runs the event loop until the
    Engine shuts down. With a trace_dir (the launcher's MINISGL_TRACE_DIR), the rank's
    trace events are written to tp<rank>.jsonl there when it exits."""
    ranks_per_node = server_args.tp_size // server_args.nnodes
    # The ranks of one node share its cores.
    torch.set_num_threads(max(1, torch.get_num_threads() // ranks_per_node))
    with tracing.record() if trace_dir else contextlib.nullcontext() as events:
        try:
            with tracing.span("run_scheduler_process", tp_rank=tp_rank, node_rank=server_args.node_rank):
                scheduler = Scheduler(server_args, tp_rank)
                if recv_from_engine is not None:
                    recv_from_engine.send(("ready", scheduler.worker_info))
                scheduler.event_loop_normal(recv_from_engine)
        except BaseException as e:
            if recv_from_engine is not None:
                _send_error(recv_from_engine, e)
            raise
        finally:
            if trace_dir:
                tracing.dump_jsonl(events, os.path.join(trace_dir, f"tp{tp_rank}.jsonl"))
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


def _split_per_request(result: GenerationBatchResult) -> list[list[int]]:
    """The new tokens of each request: one, or after a speculative round n + 1 for n accepted drafts."""
    flat = result.next_token_ids.tolist()
    if result.accept_length_per_req_cpu is None:
        return [[t] for t in flat]
    out, start = [], 0
    for n in result.accept_length_per_req_cpu:
        out.append(flat[start : start + n + 1])
        start += n + 1
    return out


def _zip_top(vals: list, idxs: list) -> list:
    return [None if v is None else [(lp, t, None) for lp, t in zip(v, i)] for v, i in zip(vals, idxs)]
