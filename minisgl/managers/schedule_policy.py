"""SchedulePolicy and PrefillAdder: which waiting requests the next prefill takes.

Mirrors python/sglang/srt/managers/schedule_policy.py. ``SchedulePolicy`` orders the
waiting queue (``fcfs``, or ``lpm``: longest cached prefix first); ``PrefillAdder``
admits requests one at a time against four budgets: running-request slots, rows of
``req_to_token``, the prefill token budget (chunked prefill) and KV tokens. The KV
budget is live, as SGLang's ``rem_total_tokens``: free slots plus what the radix
cache could evict, less the decode room promised to admitted and running requests.
Locking a request's cached prefix takes those tokens out of the evictable count,
so the check is made again after the lock, and a request that no longer fits is
unlocked and left waiting. Omitted: priority scheduling, DFS-weight and random
policies, the hierarchical cache and LoRA budgets.
"""

from __future__ import annotations

import math
from typing import Optional

from minisgl.managers.schedule_batch import Req
from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
from minisgl.mem_cache.radix_cache import RadixCache

# SGLang's defaults: admission reserves decode room for only a fraction of each request's
# remaining max_new_tokens (most requests stop early). The fraction decays while decoding
# goes well and jumps back after a retraction; remaining tokens are clipped at 4096.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
CLIP_MAX_NEW_TOKENS = 4096
# SGLang's in-batch prefix check: a request whose first 32 tokens equal those of a request
# already admitted this round waits one round, so it can reuse that request's KV. A shorter
# shared head is not worth the wait (SGLang's DEPRIORITIZE threshold): identical short
# prompts, the n samples of one prompt for instance, are admitted together.
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32


class SchedulePolicy:
    """Orders the waiting queue before admission (SGLang's calc_priority)."""

    def __init__(self, policy: str, tree_cache: RadixCache) -> None:
        self.policy = policy
        self.tree_cache = tree_cache

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        if self.policy != "lpm":
            return  # fcfs: arrival order
        for req in waiting_queue:
            req.init_next_round_input(self.tree_cache)
        # Longest cached prefix first: the most reuse before the cache changes.
        waiting_queue.sort(key=lambda r: -len(r.prefix_indices))


class AddReqResult:
    CONTINUE = "continue"  # admitted (or deferred one round); try the next request
    STOP = "stop"  # a budget ran out: no later request is looked at this round


class PrefillAdder:
    """Admits requests into one prefill batch (SGLang's PrefillAdder.add_one_req)."""

    def __init__(
        self,
        tree_cache: RadixCache,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator,
        running_reqs: list[Req],
        new_token_ratio: float,
        free_req_slots: int,
        max_running_requests: int,
        chunked_prefill_size: Optional[int],
        max_prefill_tokens: int,
    ) -> None:
        self.tree_cache = tree_cache
        self.allocator = token_to_kv_pool_allocator
        self.page_size = token_to_kv_pool_allocator.page_size
        self.running_reqs = running_reqs
        self.new_token_ratio = new_token_ratio
        self.free_req_slots = free_req_slots
        self.max_running_requests = max_running_requests
        self.chunked_prefill_size = chunked_prefill_size
        self.max_prefill_tokens = max_prefill_tokens
        self.can_run_list: list[Req] = []
        self.prefill_tokens = 0
        # KV tokens promised and not yet allocated: decode room of the running requests,
        # plus the prefill and decode room of every request admitted this round.
        self.reserved_tokens = sum(self.decode_reservation(r) for r in running_reqs)
        self._admitted_heads: set[tuple[int, ...]] = set()

    def decode_reservation(self, req: Req) -> int:
        remaining = min(req.sampling_params.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)
        return math.ceil(max(remaining, 0) * self.new_token_ratio)

    @property
    def rem_total_tokens(self) -> int:
        # Read live: locking a prefix moves its tokens out of the evictable count.
        return self.allocator.available_size() + self.tree_cache.evictable_size() - self.reserved_tokens

    def add_one_req(self, req: Req) -> str:
        if len(self.running_reqs) + len(self.can_run_list) >= self.max_running_requests:
            return AddReqResult.STOP
        if req.req_pool_idx is None and self.free_req_slots == 0:
            return AddReqResult.STOP
        req.init_next_round_input(self.tree_cache)  # lazily: requests behind the first refused are never matched
        head = tuple(req.fill_ids[:IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD])
        if self._shares_head_with_admitted(req, head):
            return AddReqResult.CONTINUE
        if self.chunked_prefill_size is not None and not req.wants_prompt_logprobs():
            room = (self.chunked_prefill_size - self.prefill_tokens) // self.page_size * self.page_size
            if room <= 0:
                return AddReqResult.STOP
            if req.extend_input_len > room:
                # Chunked prefill: run the first `room` tokens now, the rest in later rounds.
                req.fill_ids = req.fill_ids[: req.prefix_len + room]
                req.extend_input_len = room
                req.is_chunked = True
        need = math.ceil(req.extend_input_len / self.page_size) * self.page_size
        # With nothing else running, the oldest request starts as soon as its prompt fits;
        # if its decode later outgrows the pool, update_running_batch ends it with a reason.
        if self.running_reqs or self.can_run_list:
            need += self.decode_reservation(req)
        if (
            self.can_run_list
            and not req.is_chunked
            and self.prefill_tokens + req.extend_input_len > self.max_prefill_tokens
        ):
            req.is_chunked = False
            return AddReqResult.STOP
        if req.req_pool_idx is None:
            # A new (or retracted) request locks the cached prefix it will read. Its own
            # prefix is then no longer evictable, so it cannot count as room: check after.
            self.tree_cache.inc_lock_ref(req.last_node)
            if need > self.rem_total_tokens:
                self.tree_cache.dec_lock_ref(req.last_node)
                req.is_chunked = False
                return AddReqResult.STOP
        elif need > self.rem_total_tokens:
            req.is_chunked = False
            return AddReqResult.STOP
        self.can_run_list.append(req)
        self._admitted_heads.add(head)
        self.reserved_tokens += need
        self.free_req_slots -= req.req_pool_idx is None
        self.prefill_tokens += req.extend_input_len
        return AddReqResult.STOP if req.is_chunked else AddReqResult.CONTINUE  # a chunked request ends its batch

    def _shares_head_with_admitted(self, req: Req, head: tuple[int, ...]) -> bool:
        return (
            not self.tree_cache.disable
            and len(head) == IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
            and len(req.prefix_indices) < IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
            and head in self._admitted_heads
        )
