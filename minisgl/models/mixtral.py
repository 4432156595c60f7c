"""Mixtral: Llama attention with a top-2 mixture of experts in every layer.

Mirrors python/sglang/srt/models/mixtral.py (MixtralMoE, MixtralDecoderLayer,
MixtralForCausalLM). The MoE block computes exactly what Qwen3-MoE's does
(softmax router, renormalized top-k, SiLU-gated experts), so it reuses that
block; what differs is the checkpoint's naming: ``block_sparse_moe`` and
experts' ``w1`` (gate), ``w3`` (up), ``w2`` (down).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from minisgl.models.llama import LlamaDecoderLayer
from minisgl.models.qwen3_moe import Qwen3MoeForCausalLM, Qwen3MoeSparseMoeBlock


class MixtralDecoderLayer(LlamaDecoderLayer):
    def make_mlp(self, config, layer_id: int) -> nn.Module:
        return Qwen3MoeSparseMoeBlock(
            config.hidden_size,
            config.num_local_experts,
            config.num_experts_per_tok,
            config.intermediate_size,
            True,  # Mixtral always renormalizes its top-k weights
            layer_id,
        )


class MixtralForCausalLM(Qwen3MoeForCausalLM):
    decoder_layer_type = MixtralDecoderLayer
    expert_weight_names = {"gate": "w1", "down": "w2", "up": "w3"}

    def _load_one(self, params: dict, name: str, tensor: torch.Tensor) -> Optional[str]:
        return super()._load_one(params, name.replace(".block_sparse_moe.", ".mlp."), tensor)


EntryClass = MixtralForCausalLM
