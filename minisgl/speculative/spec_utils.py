"""Helpers every speculative worker shares: forwards without side outputs, the sampling
distribution, and giving back the KV slots a round did not keep.

Mirrors the small helpers of python/sglang/srt/speculative/spec_utils.py; StandaloneWorker
(standalone_worker.py) and EAGLEWorker (eagle_worker.py) both import them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from minisgl.layers.sampler import top_k_top_p_min_p_renorm
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import ModelWorkerBatch, Req
    from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
    from minisgl.mem_cache.memory_pool import ReqToTokenPool
    from minisgl.sampling.sampling_batch_info import SamplingBatchInfo


def plain_batch(batch: "ModelWorkerBatch", **changes) -> "ModelWorkerBatch":
    """A forward of the round: no logprobs or hidden states (refused under speculation)."""
    return dataclasses.replace(
        batch, **{"return_logprob": False, "capture_hidden_mode": CaptureHiddenMode.NULL, **changes}
    )


def sampling_probs(logits: torch.Tensor, info: "SamplingBatchInfo") -> torch.Tensor:
    """The distribution the Sampler draws from: temperature, then top-k / top-p / min-p."""
    return top_k_top_p_min_p_renorm(torch.softmax(logits / info.temperatures, dim=-1), info)


def release_kv(
    req_to_token_pool: "ReqToTokenPool", allocator: "TokenToKVPoolAllocator", req: "Req", kv_len: int
) -> None:
    """Give back the request's slots from position kv_len on: KV no token will ever use."""
    slots = req_to_token_pool.req_to_token[req.req_pool_idx, kv_len : req.kv_len]
    allocator.free(slots.to(torch.int64))
    req.kv_len = kv_len
