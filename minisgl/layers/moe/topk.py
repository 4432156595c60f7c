"""Router: pick each token's top-k experts, and tell the side-output hooks.

Mirrors python/sglang/srt/layers/moe/topk.py (TopKConfig, select_experts, fused_topk,
fused_topk_native, grouped_topk, biased_grouped_topk). Three routers:

- softmax top-k (Qwen3-MoE, Mixtral, DeepSeek-V2's "greedy");
- grouped top-k (DeepSeek-V2's "group_limited_greedy"): experts form n_group groups,
  a group scores its best expert, and only the topk_group best groups may be chosen;
- biased grouped top-k (DeepSeek-V3's "noaux_tc"): sigmoid scores plus a learned
  correction bias choose, a group scores its two best experts, and the weights are
  the sigmoid scores without the bias.

After choosing, select_experts reports the choice to the expert distribution
recorder and the routed-experts capturer, the two observers of MoE routing
(claim C9). SGLang also fuses shared experts into the routed ones, masks padded
tokens, remaps expert ids for EPLB and has fused kernels for the grouped routers; omitted.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from minisgl.eplb.expert_distribution import get_global_expert_distribution_recorder
from minisgl.kernels.cpu import is_available as cpu_kernels_available
from minisgl.layers.moe.routed_experts_capturer import get_global_experts_capturer


@dataclasses.dataclass
class TopKConfig:
    top_k: int
    renormalize: bool = True  # Qwen3-MoE's and DeepSeek's norm_topk_prob, Mixtral always
    use_grouped_topk: bool = False
    num_expert_group: Optional[int] = None
    topk_group: Optional[int] = None
    correction_bias: Optional[torch.Tensor] = None  # [num_experts], DeepSeek-V3's e_score_correction_bias


def fused_topk_native(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference the kernels are checked against, and the path of GPUs and of CPUs without the
    kernels."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [num_tokens, num_experts]
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def _mask_to_top_groups(scores: torch.Tensor, group_scores: torch.Tensor, topk_group: int, fill: float):
    """scores [T, E] with every expert outside each token's topk_group best groups set to `fill`."""
    num_tokens, num_groups = group_scores.shape
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]  # [T, topk_group]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)  # [T, n_group]
    score_mask = group_mask[:, :, None].expand(num_tokens, num_groups, scores.shape[-1] // num_groups)
    return scores.masked_fill(~score_mask.reshape(num_tokens, -1).bool(), fill)


def grouped_topk(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, num_expert_group: int, topk_group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E]
    group_scores = scores.view(scores.shape[0], num_expert_group, -1).max(dim=-1).values  # [T, n_group]
    # Masked experts score 0, below every softmax probability, so they are never chosen.
    masked = _mask_to_top_groups(scores, group_scores, topk_group, 0.0)
    topk_weights, topk_ids = torch.topk(masked, k=top_k, dim=-1, sorted=False)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def biased_grouped_topk(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    renormalize: bool,
    num_expert_group: int,
    topk_group: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = router_logits.float().sigmoid()  # [T, E]
    scores_for_choice = scores + correction_bias.float()[None, :]
    # A group's score is the sum of its two best biased scores (DeepSeek-V3's noaux_tc).
    group_scores = scores_for_choice.view(scores.shape[0], num_expert_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
    masked = _mask_to_top_groups(scores_for_choice, group_scores, topk_group, float("-inf"))
    topk_ids = torch.topk(masked, k=top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_ids)  # the bias chooses; it does not weigh
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def fused_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k: on a CPU with minisgl's kernels, topk_softmax_cpu, as SGLang's fused_topk is
    fused_topk_cpu there, so that eager and CPUGraphRunner's graphs compute the same bits (written in
    torch ops, inductor compiles the softmax into a loop of its own that rounds differently)."""
    if router_logits.is_cpu and cpu_kernels_available():
        return torch.ops.minisgl_kernel.topk_softmax_cpu(router_logits, top_k, renormalize)
    return fused_topk_native(router_logits, top_k, renormalize)


def select_experts(router_logits: torch.Tensor, config: TopKConfig, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_tokens, num_experts] logits -> (float32 weights, ids), both [num_tokens, top_k]."""
    if not config.use_grouped_topk:
        topk_weights, topk_ids = fused_topk(router_logits, config.top_k, config.renormalize)
    elif config.correction_bias is None:
        topk_weights, topk_ids = grouped_topk(
            router_logits, config.top_k, config.renormalize, config.num_expert_group, config.topk_group
        )
    else:
        topk_weights, topk_ids = biased_grouped_topk(
            router_logits, config.correction_bias, config.top_k, config.renormalize,
            config.num_expert_group, config.topk_group,
        )  # fmt: skip
    get_global_expert_distribution_recorder().on_select_experts(topk_ids)
    get_global_experts_capturer().capture(layer_id, topk_ids)
    return topk_weights, topk_ids
