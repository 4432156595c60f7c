"""Mixture-of-experts in plain PyTorch: loop over the experts that were chosen.

Mirrors python/sglang/srt/layers/moe/fused_moe_native.py (moe_forward_native).
It is the CPU path and the reference the Triton fused MoE is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.layers.linear import apply_linear


def fused_experts_native(
    hidden_states: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H], gate rows then up rows
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k]
    topk_ids: torch.Tensor,  # [T, k]
) -> torch.Tensor:
    out = torch.zeros_like(hidden_states)
    for expert in torch.unique(topk_ids).tolist():
        token_idx, slot = torch.where(topk_ids == expert)
        gate, up = apply_linear(hidden_states[token_idx], w13[expert]).chunk(2, dim=-1)
        y = apply_linear(F.silu(gate) * up, w2[expert])
        out.index_add_(0, token_idx, (y * topk_weights[token_idx, slot, None]).to(out.dtype))
    return out
