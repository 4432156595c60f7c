"""ForwardMode, CaptureHiddenMode and ForwardBatch: one forward's worth of device state.

Mirrors python/sglang/srt/model_executor/forward_batch_info.py. The scheduler
hands the worker a ModelWorkerBatch (plain lists and tensors);
``ForwardBatch.init_new`` turns it into what the model and the attention
backend read during the forward: positions, the pools, the backend itself.
SGLang also carries multimodal inputs, LoRA ids, DP-attention padding and
speculative info; minisgl carries what its layers use.
"""

from __future__ import annotations

import dataclasses
from enum import IntEnum, auto
from typing import TYPE_CHECKING, Any, Optional

import torch

from minisgl import tracing

if TYPE_CHECKING:
    from minisgl.layers.attention.base_attn_backend import AttentionBackend
    from minisgl.managers.schedule_batch import ModelWorkerBatch
    from minisgl.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from minisgl.model_executor.model_runner import ModelRunner
    from minisgl.sampling.sampling_batch_info import SamplingBatchInfo


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill, possibly on top of a cached prefix
    DECODE = auto()  # one new token per request
    MIXED = auto()  # a prefill with the running requests' decode step folded in (--enable-mixed-chunk)
    IDLE = auto()  # nothing to run (kept for SGLang parity; a TP rank with no work)
    # Speculative decoding (minisgl/speculative/). Both run as extends: new tokens on a prefix.
    TARGET_VERIFY = auto()  # the target scores [last token, drafts...]; logits at every position
    DRAFT_EXTEND = auto()  # the draft writes KV for tokens the target already has (prefill, accepted drafts)

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend(self) -> bool:
        return self == ForwardMode.DRAFT_EXTEND


class CaptureHiddenMode(IntEnum):
    NULL = 0  # keep no hidden states (the default: no extra copy)
    LAST = 1  # the last position of each request
    FULL = 2  # every position

    def need_capture(self) -> bool:
        return self != CaptureHiddenMode.NULL

    def is_full(self) -> bool:
        return self == CaptureHiddenMode.FULL


@dataclasses.dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens]
    req_pool_indices: torch.Tensor  # [bs]
    seq_lens: torch.Tensor  # [bs], prefix + new tokens
    out_cache_loc: torch.Tensor  # [num_tokens], KV slot of each new token
    positions: torch.Tensor  # [num_tokens]
    # Host copies, so per-request loops never sync with the device.
    req_pool_indices_cpu: list[int]
    seq_lens_cpu: list[int]

    # Extend only.
    extend_seq_lens: Optional[torch.Tensor] = None  # [bs]
    extend_prefix_lens: Optional[torch.Tensor] = None  # [bs]
    extend_start_loc: Optional[torch.Tensor] = None  # [bs]
    extend_seq_lens_cpu: Optional[list[int]] = None
    extend_prefix_lens_cpu: Optional[list[int]] = None
    extend_logprob_start_lens_cpu: Optional[list[int]] = None
    extend_num_tokens: Optional[int] = None

    # Sampling and side outputs.
    sampling_info: Optional["SamplingBatchInfo"] = None
    return_logprob: bool = False
    top_logprobs_nums: Optional[list[int]] = None
    token_ids_logprobs: Optional[list[Optional[list[int]]]] = None
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
    # Speculative decoding (EAGLE): the draft's input features, or a verify tree's mask and positions
    spec_info: Optional[Any] = None

    # Attached by init_new from the ModelRunner.
    req_to_token_pool: Optional["ReqToTokenPool"] = None
    token_to_kv_pool: Optional["MHATokenToKVPool"] = None
    attn_backend: Optional["AttentionBackend"] = None

    @classmethod
    @tracing.traced(
        attrs=lambda cls, batch, runner: {"forward_mode": batch.forward_mode.name, "batch_size": len(batch.seq_lens)}
    )
    def init_new(cls, batch: "ModelWorkerBatch", model_runner: "ModelRunner") -> "ForwardBatch":
        device = model_runner.device
        seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int64, device=device)
        fb = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens),
            input_ids=torch.as_tensor(batch.input_ids, dtype=torch.int64, device=device),  # overlap: a tensor
            req_pool_indices=torch.tensor(batch.req_pool_indices, dtype=torch.int64, device=device),
            seq_lens=seq_lens,
            out_cache_loc=batch.out_cache_loc.to(device),
            positions=None,
            req_pool_indices_cpu=list(batch.req_pool_indices),
            seq_lens_cpu=list(batch.seq_lens),
            sampling_info=batch.sampling_info,
            return_logprob=batch.return_logprob,
            top_logprobs_nums=batch.top_logprobs_nums,
            token_ids_logprobs=batch.token_ids_logprobs,
            capture_hidden_mode=batch.capture_hidden_mode,
            spec_info=batch.spec_info,
            req_to_token_pool=model_runner.req_to_token_pool,
            token_to_kv_pool=model_runner.token_to_kv_pool,
            attn_backend=model_runner.attn_backend,
        )
        if not fb.forward_mode.is_decode():
            fb.extend_seq_lens_cpu = list(batch.extend_seq_lens)
            fb.extend_prefix_lens_cpu = list(batch.extend_prefix_lens)
            fb.extend_logprob_start_lens_cpu = list(batch.extend_logprob_start_lens)
            fb.extend_num_tokens = sum(batch.extend_seq_lens)
            fb.extend_seq_lens = torch.tensor(batch.extend_seq_lens, dtype=torch.int64, device=device)
            fb.extend_prefix_lens = torch.tensor(batch.extend_prefix_lens, dtype=torch.int64, device=device)
            fb.extend_start_loc = torch.cumsum(fb.extend_seq_lens, dim=0) - fb.extend_seq_lens
        tree_positions = getattr(batch.spec_info, "positions", None)
        if tree_positions is not None:  # a draft or verify tree: a node's depth, not its place in the row
            fb.positions = tree_positions.to(device)
        elif fb.forward_mode.is_decode():
            fb.positions = seq_lens - 1
        else:
            fb.positions = compute_position(fb.extend_prefix_lens, fb.extend_seq_lens, fb.extend_num_tokens)
        return fb


def compute_position(extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Absolute positions of the new tokens: prefix_len, prefix_len + 1, ... for each request."""
    starts = torch.repeat_interleave(extend_prefix_lens, extend_seq_lens, output_size=num_tokens)
    first_token = torch.repeat_interleave(
        torch.cumsum(extend_seq_lens, 0) - extend_seq_lens, extend_seq_lens, output_size=num_tokens
    )
    return starts + torch.arange(num_tokens, device=extend_seq_lens.device) - first_token
