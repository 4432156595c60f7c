"""What every speculative worker shares: being a draft TpModelWorker on the target's pools,
forwards without side outputs, the sampling distribution, the logprobs of a round's tokens,
and giving back the KV slots a round did not keep.

Mirrors the small helpers of python/sglang/srt/speculative/spec_utils.py; StandaloneWorker
(standalone_worker.py) and EAGLEWorker (eagle_worker.py) both build on them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from minisgl.layers.sampler import _attach_logprobs_to_output, top_k_top_p_min_p_renorm
from minisgl.managers.tp_worker import TpModelWorker
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode

if TYPE_CHECKING:
    from minisgl.layers.logits_processor import LogitsProcessorOutput
    from minisgl.managers.schedule_batch import ModelWorkerBatch, Req
    from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
    from minisgl.mem_cache.memory_pool import ReqToTokenPool
    from minisgl.sampling.sampling_batch_info import SamplingBatchInfo
    from minisgl.server_args import ServerArgs


class DraftTpModelWorker(TpModelWorker):
    """A TpModelWorker(is_draft_worker=True) on the target's req_to_token_pool and allocator,
    from get_memory_pool() (claim C12): one slot indexes both models' KV pools. SGLang's
    StandaloneWorker and EAGLEWorker each pass the pools to TpModelWorker.__init__ themselves."""

    def __init__(self, server_args: "ServerArgs", tp_rank: int, target_worker: TpModelWorker) -> None:
        self.target_worker = target_worker
        req_to_token_pool, token_to_kv_pool_allocator = target_worker.get_memory_pool()
        super().__init__(
            server_args,
            tp_rank=tp_rank,
            is_draft_worker=True,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        self.req_to_token_pool, self.token_to_kv_pool_allocator = req_to_token_pool, token_to_kv_pool_allocator


def plain_batch(batch: "ModelWorkerBatch", **changes) -> "ModelWorkerBatch":
    """A forward of the round: no side outputs (a round's logprobs come from the verify's
    logits, attach_verified_logprobs; hidden states are refused under speculation)."""
    return dataclasses.replace(
        batch, **{"return_logprob": False, "capture_hidden_mode": CaptureHiddenMode.NULL, **changes}
    )


def sampling_probs(logits: torch.Tensor, info: "SamplingBatchInfo") -> torch.Tensor:
    """The distribution the Sampler draws from: temperature, then top-k / top-p / min-p."""
    return top_k_top_p_min_p_renorm(torch.softmax(logits / info.temperatures, dim=-1), info)


def attach_verified_logprobs(
    out: "LogitsProcessorOutput",
    logits: torch.Tensor,
    rows: list[list[int]],
    token_ids: torch.Tensor,
    batch: "ModelWorkerBatch",
) -> None:
    """The logprobs of a round's tokens (token_ids, request after request), one row per token,
    as the Sampler gives one step's.

    rows[b]: for each token request b emitted, the row of ``logits`` (the target's, biases
    applied) that predicted it, i.e. the accepted node before it (the bonus token's is the
    last accepted node). Its logprob is then the one a plain decode step at that position
    reports: log_softmax after temperature, before top-k/top-p.
    """
    if not batch.return_logprob:
        return
    owner = torch.tensor([b for b, r in enumerate(rows) for _ in r])
    chosen = logits[[row for r in rows for row in r]]
    info = batch.sampling_info
    if not info.is_all_greedy:
        chosen = chosen / info.temperatures[owner]
    _attach_logprobs_to_output(
        out,
        torch.log_softmax(chosen, dim=-1),
        token_ids,
        [batch.top_logprobs_nums[b] for b in owner.tolist()],
        [batch.token_ids_logprobs[b] for b in owner.tolist()],
    )


def release_kv(
    req_to_token_pool: "ReqToTokenPool", allocator: "TokenToKVPoolAllocator", req: "Req", kv_len: int
) -> None:
    """Give back the request's slots from position kv_len on: KV no token will ever use."""
    slots = req_to_token_pool.req_to_token[req.req_pool_idx, kv_len : req.kv_len]
    allocator.free(slots.to(torch.int64))
    req.kv_len = kv_len
