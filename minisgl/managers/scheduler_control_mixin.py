"""The scheduler's control requests: flush the radix cache, report internal state, drive the
expert distribution recorder, start and stop the torch profiler (scheduler_profiler.py).

SGLang keeps these methods in managers/scheduler.py itself (flush_cache, get_internal_state,
expert_distribution_handle); minisgl moves them into this mixin so that scheduler.py holds the
scheduling loop alone, within the 400-line rule. SGLang dispatches them through a
TypeBasedDispatcher over many more request types (weights, profiling, sessions); omitted.
"""

from __future__ import annotations

from typing import Optional

from minisgl.eplb.expert_distribution import get_global_expert_distribution_recorder
from minisgl.managers.io_struct import ExpertDistributionReq, FlushCacheReqInput, GetInternalStateReq, ProfileReq
from minisgl.managers.scheduler_profiler import handle_profile_req


class SchedulerControlMixin:
    """Mixed into Scheduler; reads its queues, pools and counters."""

    def flush_cache(self) -> bool:
        """Empty the radix cache; refused (False) while requests are in flight, as in SGLang."""
        if not self.is_idle():
            return False
        return self.tree_cache.flush()

    def get_internal_state(self) -> dict:
        """KV-pool, radix-cache and queue accounting. Finished requests leave their KV in the radix
        cache (evictable_tokens): the pool is whole again, available_kv_tokens ==
        max_total_num_tokens, only after flush_cache."""
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "cached_tokens": self.num_cached_tokens,
            "hit_rate": self.num_cached_tokens / max(self.num_prompt_tokens, 1),
            "evictable_tokens": self.tree_cache.evictable_size(),
            "protected_tokens": self.tree_cache.protected_size(),
            "available_kv_tokens": self.token_to_kv_pool_allocator.available_size(),
            "max_total_num_tokens": self.worker_info.max_total_num_tokens,
            "num_running_reqs": len(self.running_batch.reqs),
            "num_waiting_reqs": len(self.waiting_queue),
            "num_retracted_reqs": self.num_retracted_reqs,
            # Request-slot occupancy (rows of req_to_token): a leak shows as used slots while idle.
            "available_req_slots": self.req_to_token_pool.available_size(),
            "max_req_slots": self.req_to_token_pool.size,
            "is_idle": self.is_idle(),
        }

    def expert_distribution_handle(self, action: str, output_path: Optional[str] = None):
        recorder = get_global_expert_distribution_recorder()
        if action == "start":
            return recorder.start_record()
        if action == "stop":
            return recorder.stop_record()
        return recorder.dump_record(output_path)

    def handle_control_request(self, req):
        """Answer one control request (io_struct); the front end's only way to reach the scheduler
        besides generate and abort."""
        if isinstance(req, FlushCacheReqInput):
            return self.flush_cache()
        if isinstance(req, GetInternalStateReq):
            return self.get_internal_state()
        if isinstance(req, ExpertDistributionReq):
            if req.action == "dump" and self.tp_rank != 0:
                return None  # routing is replicated, so every rank counted the same; one writes
            return self.expert_distribution_handle(req.action, req.output_path)
        if isinstance(req, ProfileReq):
            return handle_profile_req(req, self.tp_rank, self.pp_rank if self.server_args.pp_size > 1 else None)
        raise TypeError(f"unknown request {type(req).__name__}")
