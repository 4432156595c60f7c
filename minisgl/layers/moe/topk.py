"""Router: pick each token's top-k experts, and tell the side-output hooks.

Mirrors python/sglang/srt/layers/moe/topk.py (select_experts, fused_topk_native).
After choosing, select_experts reports the choice to the expert distribution
recorder and the routed-experts capturer, the two observers of MoE routing
(claim C9). SGLang also has grouped/biased top-k (DeepSeek) and
expert-location remapping for EPLB; minisgl has softmax top-k.
"""

from __future__ import annotations

import torch

from minisgl.eplb.expert_distribution import get_global_expert_distribution_recorder
from minisgl.layers.moe.routed_experts_capturer import get_global_experts_capturer


def fused_topk_native(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [num_tokens, num_experts]
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:  # Qwen3-MoE's norm_topk_prob, Mixtral always
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, layer_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    topk_weights, topk_ids = fused_topk_native(router_logits, top_k, renormalize)
    get_global_expert_distribution_recorder().on_select_experts(topk_ids)
    get_global_experts_capturer().capture(layer_id, topk_ids)
    return topk_weights, topk_ids
