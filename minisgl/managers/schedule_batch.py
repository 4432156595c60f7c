"""Req, ScheduleBatch and ModelWorkerBatch: the scheduler's view of the work.

Mirrors python/sglang/srt/managers/schedule_batch.py. A Req is one request's whole life (tokens,
KV ownership, finish state, side outputs). A ScheduleBatch is the set of requests that run one
forward together; its ``prepare_for_extend`` / ``prepare_for_decode`` allocate KV slots and write
``req_to_token``; ``get_model_worker_batch`` reduces it to the plain data the worker needs. A
constrained request's grammar (minisgl/constrained/) ends it once terminated. SGLang also handles
multimodal inputs, disaggregation and hierarchical cache here; omitted.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Optional

import torch

from minisgl.managers.finish_reason import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_MATCHED_STR,
    FINISH_MATCHED_TOKEN,
    BaseFinishReason,
)
from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
from minisgl.mem_cache.memory_pool import ReqToTokenPool
from minisgl.mem_cache.radix_cache import RadixCache
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from minisgl.sampling.sampling_batch_info import SamplingBatchInfo

if TYPE_CHECKING:
    from minisgl.constrained.base_grammar_backend import BaseGrammarObject


class Req:
    """One request's whole life in the scheduler (SGLang's Req in schedule_batch.py)."""

    def __init__(
        self,
        recv_req: TokenizedGenerateReqInput,
        eos_token_ids: set[int],
        max_req_len: int,
        generator: Optional[torch.Generator] = None,
    ) -> None:
        # The request's options arrive in one object, made and checked by the TokenizerManager.
        self.rid = recv_req.rid
        self.origin_input_text = recv_req.input_text
        self.origin_input_ids = list(recv_req.input_ids)
        self.sampling_params = recv_req.sampling_params
        self.custom_logit_processor = recv_req.custom_logit_processor  # serialized, checked by the front end
        self.eos_token_ids = eos_token_ids
        self.max_req_len = max_req_len
        self.generator = generator
        self.output_ids: list[int] = []
        self.finished_reason: Optional[BaseFinishReason] = None
        # Set when a json_schema / regex / ebnf constraint has compiled; it has accepted every output id.
        self.grammar: Optional["BaseGrammarObject"] = None

        # KV ownership: req_to_token[req_pool_idx, :kv_len] are the slots with computed KV;
        # the first len(prefix_indices) of them belong to the radix cache (locked via last_node).
        self.req_pool_idx: Optional[int] = None
        self.kv_len = 0
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.last_node = None
        # The tokens this round must have KV for, and how many of them already do.
        self.fill_ids: list[int] = []
        self.prefix_len = 0
        self.extend_input_len = 0
        self.is_chunked = False  # this round prefills only part of fill_ids
        self.cached_tokens = 0  # prompt tokens served by the radix cache at admission

        # Side outputs.
        self.return_logprob = recv_req.return_logprob
        self.stream = recv_req.stream  # a streamed request gets its logprobs with every output
        # -1 means "only the generated tokens": start at the last prompt position.
        start = recv_req.logprob_start_len
        self.logprob_start_len = len(self.origin_input_ids) if start < 0 else start
        self.top_logprobs_num = recv_req.top_logprobs_num
        self.token_ids_logprob = recv_req.token_ids_logprob
        self.return_hidden_states = recv_req.return_hidden_states
        self.return_routed_experts = recv_req.return_routed_experts
        self.input_token_logprobs: list = []
        self.input_top_logprobs_val: list = []
        self.input_top_logprobs_idx: list = []
        self.input_token_ids_logprobs_val: list = []
        self.input_token_ids_logprobs_idx: list = []
        self.output_token_logprobs: list[float] = []
        self.output_top_logprobs_val: list = []
        self.output_top_logprobs_idx: list = []
        self.output_token_ids_logprobs_val: list = []
        self.output_token_ids_logprobs_idx: list = []
        self.hidden_states: list[list[float]] = []
        self.routed_experts: Optional[torch.Tensor] = None
        self.total_retractions = 0  # SGLang's name for how often it was retracted
        # Speculative decoding: verify rounds run, draft tokens the target accepted, and EAGLE's draft
        # state for the next round (speculative/eagle_info.py, EagleDraftInput.store).
        self.spec_verify_ct, self.spec_accepted_tokens, self.eagle_draft_state = 0, 0, None

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def abort(self, message: str) -> None:
        """End the request with an abort reason (for components below managers/, e.g. a grammar that fails)."""
        self.finished_reason = FINISH_ABORT(message)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def init_next_round_input(self, tree_cache: RadixCache) -> None:
        """Everything known so far needs KV; the prefix is what the pool already has:
        this request's own earlier chunks, or else the longest match in the radix cache."""
        self.fill_ids = self.origin_input_ids + self.output_ids
        if self.kv_len == 0:
            self.prefix_indices, self.last_node = tree_cache.match_prefix(self.fill_ids[: self._max_prefix_len()])
        self.prefix_len = max(self.kv_len, len(self.prefix_indices))
        self.extend_input_len = len(self.fill_ids) - self.prefix_len

    def _max_prefix_len(self) -> int:
        # At least one token must run to produce logits; positions whose prompt logprobs or
        # hidden states were asked for must run too (a cache hit would skip them).
        limit = len(self.fill_ids) - 1
        if self.return_hidden_states:
            limit = 0
        if self.return_logprob and self.total_retractions == 0:
            limit = min(limit, self.logprob_start_len)
        return max(limit, 0)

    def wants_prompt_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len < len(self.origin_input_ids)

    def check_finished(self, tail_text: Optional[str] = None) -> None:
        """Set finished_reason if the last token ends the request (SGLang's order of checks)."""
        if self.finished():
            return
        params = self.sampling_params
        if len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = FINISH_LENGTH(params.max_new_tokens)
            return
        last = self.output_ids[-1]
        if self.grammar is not None and self.grammar.is_terminated():
            self.finished_reason = FINISH_MATCHED_TOKEN(last)  # it accepted a stop token, whatever ignore_eos says
            return
        if last in params.stop_token_ids or (not params.ignore_eos and last in self.eos_token_ids):
            self.finished_reason = FINISH_MATCHED_TOKEN(last)
            return
        if tail_text is not None:
            for stop in params.stop_strs:
                if stop in tail_text:
                    self.finished_reason = FINISH_MATCHED_STR(stop)
                    return
            for pattern in params.stop_regex_strs:
                if re.search(pattern, tail_text):
                    self.finished_reason = FINISH_MATCHED_STR(pattern)  # SGLang reports the pattern too
                    return
        if self.seqlen >= self.max_req_len:
            self.finished_reason = FINISH_LENGTH(len(self.output_ids))

    def reset_for_retract(self) -> None:
        """Forget all KV; the request will be prefilled again from prompt + output so far."""
        self.req_pool_idx = None
        self.kv_len = 0
        self.prefix_len = 0
        self.total_retractions += 1


@dataclasses.dataclass
class ModelWorkerBatch:
    """What the worker needs from a ScheduleBatch: lists and tensors, no Req objects."""

    forward_mode: ForwardMode
    input_ids: list[int]
    req_pool_indices: list[int]
    seq_lens: list[int]
    out_cache_loc: torch.Tensor
    sampling_info: Optional[SamplingBatchInfo]  # None while delay_sample waits for it
    return_logprob: bool
    top_logprobs_nums: list[int]
    token_ids_logprobs: list[Optional[list[int]]]
    capture_hidden_mode: CaptureHiddenMode
    extend_seq_lens: Optional[list[int]] = None
    extend_prefix_lens: Optional[list[int]] = None
    extend_logprob_start_lens: Optional[list[int]] = None
    spec_info: Optional[Any] = None  # what an EAGLE round hands the forward (speculative/eagle_info.py)
    delay_sample: bool = False  # overlap loop: sampling info built, tokens sampled after the previous result


class ScheduleBatch:
    def __init__(
        self,
        reqs: list[Req],
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator,
        tree_cache: RadixCache,
        vocab_size: int,
        device: str,
        num_decode_tokens: int = 1,
    ) -> None:
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.tree_cache = tree_cache
        self.vocab_size = vocab_size
        self.device = device
        # KV slots a decode step takes per request: 1, or when speculating the last token plus
        # its drafts (speculative_num_draft_tokens), of which the rejected are freed after verify.
        self.num_decode_tokens = num_decode_tokens
        self.forward_mode: Optional[ForwardMode] = None
        self.input_ids: list[int] = []
        self.out_cache_loc: Optional[torch.Tensor] = None
        self.out_cache_loc_written = False  # every slot of out_cache_loc is in some req_to_token row
        self.decoding_reqs: list[Req] = []  # a MIXED batch's decode rows (mix_with_running)

    @classmethod
    def init_new(
        cls, reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, vocab_size, device, num_decode_tokens=1
    ):
        return cls(
            reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, vocab_size, device, num_decode_tokens
        )

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    # ---- KV allocation -------------------------------------------------------------------

    def _alloc_token_slots(self, prefix_lens: list[int], seq_lens: list[int]) -> Optional[torch.Tensor]:
        allocator = self.token_to_kv_pool_allocator
        page = allocator.page_size
        need = sum(-(-s // page) - -(-p // page) for p, s in zip(prefix_lens, seq_lens)) * page
        if allocator.available_size() < need:
            # Make room from cached prefixes nobody is using (LRU).
            self.tree_cache.evict(need - allocator.available_size())
        if page == 1:
            return allocator.alloc(sum(s - p for p, s in zip(prefix_lens, seq_lens)))
        table = self.req_to_token_pool.req_to_token
        last_loc = [int(table[r.req_pool_idx, p - 1]) if p > 0 else -1 for r, p in zip(self.reqs, prefix_lens)]
        if self.forward_mode.is_decode() and self.num_decode_tokens == 1:
            return allocator.alloc_decode(seq_lens, last_loc)  # one token each: a page only where the last is full
        return allocator.alloc_extend(prefix_lens, seq_lens, last_loc)

    def _write_req_to_token(self, prefix_lens: list[int], seq_lens: list[int]) -> None:
        self.out_cache_loc_written = False
        start = 0
        for req, pre, seq in zip(self.reqs, prefix_lens, seq_lens):
            self.req_to_token_pool.write(
                (req.req_pool_idx, slice(pre, seq)), self.out_cache_loc[start : start + seq - pre]
            )
            req.kv_len = seq
            start += seq - pre
        self.out_cache_loc_written = True

    def prepare_for_extend(self) -> None:
        """Claim request slots and KV slots for every new token of every request."""
        self.forward_mode = ForwardMode.EXTEND
        needs_slot = [r for r in self.reqs if r.req_pool_idx is None]
        slots = self.req_to_token_pool.alloc(len(needs_slot))
        assert slots is not None, "scheduler admitted more requests than req_to_token has rows"
        for req, slot in zip(needs_slot, slots):
            req.req_pool_idx = slot
            # A fresh request starts from its cached prefix: those slots are the tree's.
            self.req_to_token_pool.write((slot, slice(0, len(req.prefix_indices))), req.prefix_indices)
            req.kv_len = len(req.prefix_indices)
        prefix_lens = [r.prefix_len for r in self.reqs]
        seq_lens = [len(r.fill_ids) for r in self.reqs]
        self.out_cache_loc = self._alloc_token_slots(prefix_lens, seq_lens)
        assert self.out_cache_loc is not None, "scheduler admitted more tokens than the KV pool has free"
        self._write_req_to_token(prefix_lens, seq_lens)
        self.input_ids = [t for r in self.reqs for t in r.fill_ids[r.prefix_len :]]
        self.prefix_lens, self.seq_lens = prefix_lens, seq_lens
        self.extend_lens = [s - p for p, s in zip(prefix_lens, seq_lens)]

    def mix_with_running(self, running: "ScheduleBatch") -> None:
        """SGLang's mix_with_running (--enable-mixed-chunk): the running requests' decode step joins this
        prefill's forward, each as an extend of one token on its KV. ``running`` is prepared for decode."""
        self.forward_mode = ForwardMode.MIXED
        self.decoding_reqs = list(running.reqs)
        self.reqs = self.reqs + running.reqs
        self.input_ids = self.input_ids + running.input_ids
        self.out_cache_loc = torch.cat([self.out_cache_loc, running.out_cache_loc])
        self.prefix_lens = self.prefix_lens + [s - 1 for s in running.seq_lens]
        self.seq_lens = self.seq_lens + running.seq_lens
        self.extend_lens = self.extend_lens + [1] * len(running.reqs)

    def new_tokens_required_next_decode(self) -> int:
        page = self.token_to_kv_pool_allocator.page_size
        if page == 1:
            return len(self.reqs) * self.num_decode_tokens
        # Only requests whose last page is full need a fresh page.
        return sum(page for r in self.reqs if r.kv_len % page == 0)

    def check_decode_mem(self) -> bool:
        free = self.token_to_kv_pool_allocator.available_size() + self.tree_cache.evictable_size()
        return free >= self.new_tokens_required_next_decode()

    def prepare_for_decode(self, future_token_ids: Optional[dict[str, int]] = None) -> None:
        """One new token per request: its input is the last sampled token (with room for drafts),
        or under overlap scheduling the placeholder of one still being computed (overlap_utils)."""
        self.forward_mode = ForwardMode.DECODE
        pending = future_token_ids or {}
        self.input_ids = [pending[r.rid] if r.rid in pending else r.output_ids[-1] for r in self.reqs]
        prefix_lens = [r.kv_len for r in self.reqs]
        seq_lens = [p + self.num_decode_tokens for p in prefix_lens]
        self.out_cache_loc = self._alloc_token_slots(prefix_lens, seq_lens)
        assert self.out_cache_loc is not None, "check_decode_mem must run before prepare_for_decode"
        self._write_req_to_token(prefix_lens, seq_lens)
        self.seq_lens = seq_lens

    def retract_decode(self) -> list[Req]:
        """Free requests until the rest can decode; return the retracted ones (SGLang's order)."""
        # SGLang's victim order: fewest generated tokens first, then the longest prompt, so the
        # work thrown away (and redone at re-prefill) is the cheapest per slot freed.
        order = sorted(self.reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)
        retracted = []
        while not self.check_decode_mem() and len(order) > 1:
            req = order.pop()
            # Its computed KV stays in the cache (evictable), so the re-prefill may hit it.
            self.tree_cache.cache_finished_req(req)
            req.reset_for_retract()
            retracted.append(req)
            self.reqs = [r for r in self.reqs if r is not req]
        return retracted

    def release_failed_reqs(self, reqs: list[Req]) -> None:
        """Free every KV slot and req_to_token row that ``reqs`` hold after this batch failed.

        Nothing goes to the radix cache: a forward that failed may have written half its
        KV, and a cached prefix would hand that to later requests. Their locked prefixes
        stay cached (computed by earlier, successful forwards) and are unlocked."""
        owned = []
        if self.out_cache_loc is not None and not self.out_cache_loc_written:
            owned.append(self.out_cache_loc)  # allocated, perhaps not yet recorded in any row
        for req in reqs:
            if req.req_pool_idx is not None:  # None: admitted, but the batch failed before it got a row
                row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
                owned.append(row[len(req.prefix_indices) : req.kv_len].to(torch.int64))
                self.req_to_token_pool.free(req.req_pool_idx)
            # Locked at admission (PrefillAdder) or since moved on by cache_unfinished_req.
            self.tree_cache.dec_lock_ref(req.last_node)
            req.req_pool_idx, req.kv_len, req.last_node = None, 0, None
            req.prefix_indices = torch.empty(0, dtype=torch.int64)
        if owned:
            self.token_to_kv_pool_allocator.free(torch.unique(torch.cat(owned)))

    def filter_batch(self) -> None:
        self.reqs = [r for r in self.reqs if not r.finished()]

    def merge_batch(self, other: "ScheduleBatch") -> None:
        self.reqs.extend(other.reqs)

    # ---- hand-off to the worker ----------------------------------------------------------

    def build_sampling_info(self) -> SamplingBatchInfo:
        return SamplingBatchInfo.from_reqs(self.reqs, self.vocab_size, self.device)

    def get_model_worker_batch(self, delay_sample: bool = False) -> ModelWorkerBatch:
        reqs = self.reqs
        return_logprob = any(r.return_logprob for r in reqs)
        capture = CaptureHiddenMode.NULL
        if any(r.return_hidden_states for r in reqs):
            capture = CaptureHiddenMode.FULL if self.forward_mode.is_extend() else CaptureHiddenMode.LAST
        batch = ModelWorkerBatch(
            forward_mode=self.forward_mode,
            input_ids=self.input_ids,
            req_pool_indices=[r.req_pool_idx for r in reqs],
            seq_lens=self.seq_lens,
            out_cache_loc=self.out_cache_loc,
            sampling_info=None if delay_sample else self.build_sampling_info(),
            return_logprob=return_logprob,
            top_logprobs_nums=[r.top_logprobs_num if r.return_logprob else 0 for r in reqs],
            token_ids_logprobs=[r.token_ids_logprob if r.return_logprob else None for r in reqs],
            capture_hidden_mode=capture,
            delay_sample=delay_sample,
        )
        if self.forward_mode.is_extend():
            batch.extend_seq_lens = self.extend_lens
            batch.extend_prefix_lens = self.prefix_lens
            # Prompt logprobs are computed once: not for requests that did not ask, and not
            # again when a retracted request re-prefills its prompt (a start at seq_len: none).
            batch.extend_logprob_start_lens = [
                r.logprob_start_len if r.return_logprob and r.total_retractions == 0 else s
                for r, s in zip(reqs, self.seq_lens)
            ]
        return batch
