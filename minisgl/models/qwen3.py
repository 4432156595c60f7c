"""Qwen3: per-head RMSNorm on queries and keys, and a head_dim of its own.

Mirrors python/sglang/srt/models/qwen3.py (Qwen3Attention, Qwen3DecoderLayer,
Qwen3ForCausalLM). head_dim is read from the config, not derived from
hidden_size / num_heads, and q/k are normalized per head before RoPE.
"""

from __future__ import annotations

import torch

from minisgl.layers.layernorm import RMSNorm
from minisgl.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    def __init__(self, config, layer_id: int, bias: bool = False) -> None:
        super().__init__(config, layer_id, bias)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # Normalize each head's vector: view as [num_tokens * heads, head_dim].
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3ForCausalLM(LlamaForCausalLM):
    decoder_layer_type = Qwen3DecoderLayer


EntryClass = Qwen3ForCausalLM
