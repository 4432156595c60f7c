"""Qwen3-MoE: Qwen3 attention with a sparse mixture-of-experts MLP.

Mirrors python/sglang/srt/models/qwen3_moe.py (Qwen3MoeSparseMoeBlock,
Qwen3MoeDecoderLayer, Qwen3MoeForCausalLM, load_weights with the expert
params mapping). The router is a plain linear layer; choosing experts,
observing the choice and running the experts all live in FusedMoE (layers/).
SGLang also handles shared experts, expert parallelism and two-batch overlap.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from minisgl.layers.linear import ReplicatedLinear
from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE
from minisgl.models.llama import LlamaForCausalLM, LlamaMLP
from minisgl.models.qwen3 import Qwen3DecoderLayer


class Qwen3MoeSparseMoeBlock(nn.Module):
    """Router + experts. Mixtral's MoE block is the same computation (see mixtral.py)."""

    def __init__(
        self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int, renormalize: bool, layer_id: int
    ) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False, quant_config=None)  # never quantized
        self.experts = FusedMoE(
            num_experts=num_experts,
            top_k=top_k,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            layer_id=layer_id,
            renormalize=renormalize,
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        router_logits = self.gate(hidden_states)  # [num_tokens, num_experts]
        return self.experts(hidden_states, router_logits)


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def make_mlp(self, config, layer_id: int) -> nn.Module:
        is_sparse = layer_id not in getattr(config, "mlp_only_layers", []) and (
            (layer_id + 1) % getattr(config, "decoder_sparse_step", 1) == 0
        )
        if not is_sparse:
            return LlamaMLP(config.hidden_size, config.intermediate_size)
        return Qwen3MoeSparseMoeBlock(
            config.hidden_size,
            config.num_experts,
            config.num_experts_per_tok,
            config.moe_intermediate_size,
            config.norm_topk_prob,
            layer_id,
        )


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    decoder_layer_type = Qwen3MoeDecoderLayer

    # Checkpoint names of each expert's gate, down and up projections.
    expert_weight_names = {"gate": "gate_proj", "down": "down_proj", "up": "up_proj"}

    def __init__(self, config) -> None:
        super().__init__(config)
        num_experts = getattr(config, "num_experts", None) or config.num_local_experts
        self.expert_params_mapping = FusedMoE.make_expert_params_mapping(num_experts, **self.expert_weight_names)

    def _load_one(self, params: dict, name: str, tensor: torch.Tensor) -> Optional[str]:
        for param_name, ckpt_name, expert_id, shard_id in self.expert_params_mapping:
            if ckpt_name in name:
                fused = name.replace(ckpt_name, param_name)
                params[fused].weight_loader(params[fused], tensor, shard_id, expert_id)
                return fused
        return super()._load_one(params, name, tensor)


EntryClass = Qwen3MoeForCausalLM
