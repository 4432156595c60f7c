"""Mixture-of-experts in plain PyTorch: loop over the experts that were chosen.

Mirrors python/sglang/srt/layers/moe/fused_moe_native.py (moe_forward_native).
It is the CPU path and the reference the Triton fused MoE is tested against. ``linear`` runs one
expert's projection on ``w13[e]`` or ``w2[e]``: apply_linear on float weights, the int8 GEMM on
(weight, scale) pairs under W8A8 (the quant methods in layers/quantization/ pass it).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F


def fused_experts_native(
    hidden_states: torch.Tensor,  # [T, H]
    w13: torch.Tensor | Sequence,  # [E, 2 * I, H], gate rows then up rows
    w2: torch.Tensor | Sequence,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k]
    topk_ids: torch.Tensor,  # [T, k]
    linear: Callable[[torch.Tensor, object], torch.Tensor],  # x, w13[e] or w2[e] -> x w^T
) -> torch.Tensor:
    out = torch.zeros_like(hidden_states)
    for expert in torch.unique(topk_ids).tolist():
        token_idx, slot = torch.where(topk_ids == expert)
        gate, up = linear(hidden_states[token_idx], w13[expert]).chunk(2, dim=-1)
        y = linear(F.silu(gate) * up, w2[expert])
        out.index_add_(0, token_idx, (y * topk_weights[token_idx, slot, None]).to(out.dtype))
    return out
