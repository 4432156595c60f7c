"""Rotary position embeddings with a precomputed cos/sin cache.

Mirrors python/sglang/srt/layers/rotary_embedding.py (RotaryEmbedding,
Llama3RotaryEmbedding, get_rope). SGLang also implements YaRN, dynamic NTK,
M-RoPE and fused kernels; minisgl has the default and llama3 scalings, in the
NeoX layout (rotate halves) that Llama and Qwen checkpoints use.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from minisgl.layers.custom_op import CustomOp


class RotaryEmbedding(CustomOp):
    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.base = base
        inv_freq = self._compute_inv_freq()
        t = torch.arange(max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_pos, rotary_dim / 2]
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False)

    def _compute_inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float() / self.rotary_dim
        return 1.0 / (self.base**exponents)

    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # query: [num_tokens, num_heads * head_size], key: [num_tokens, num_kv_heads * head_size]
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [num_tokens, rotary_dim / 2] each
        return _apply_rotary(query, cos, sin, self.head_size), _apply_rotary(key, cos, sin, self.head_size)

    def forward_cpu(self, positions, query, key):
        return torch.ops.minisgl_kernel.rotary_embedding_cpu(positions, query, key, self.head_size, self.cos_sin_cache)


class Llama3RotaryEmbedding(RotaryEmbedding):
    """Llama 3.1's frequency-dependent stretching: long wavelengths slowed by `factor`."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, scaling: dict[str, Any]) -> None:
        self.scaling_factor = scaling["factor"]
        self.low_freq_factor = scaling["low_freq_factor"]
        self.high_freq_factor = scaling["high_freq_factor"]
        self.orig_max_position = scaling["original_max_position_embeddings"]
        super().__init__(head_size, rotary_dim, max_position_embeddings, base)

    def _compute_inv_freq(self) -> torch.Tensor:
        inv_freq = super()._compute_inv_freq()
        low_freq_wavelen = self.orig_max_position / self.low_freq_factor
        high_freq_wavelen = self.orig_max_position / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.scaling_factor, inv_freq)
        smooth = (self.orig_max_position / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.scaling_factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int) -> torch.Tensor:
    num_tokens = x.shape[0]
    x = x.view(num_tokens, -1, head_size)  # [num_tokens, heads, head_size]
    rot = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot.float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return torch.cat((rotated, x_pass), dim=-1).reshape(num_tokens, -1)


def get_rope(
    head_size: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Optional[dict[str, Any]] = None,
) -> RotaryEmbedding:
    rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
    if rope_type == "default":
        return RotaryEmbedding(head_size, rotary_dim, max_position, base)
    if rope_type == "llama3":
        return Llama3RotaryEmbedding(head_size, rotary_dim, max_position, base, rope_scaling)
    raise ValueError(f"unsupported rope_scaling type {rope_type!r} (minisgl has default and llama3)")
