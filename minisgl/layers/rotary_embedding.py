"""Rotary position embeddings with a precomputed cos/sin cache.

Mirrors python/sglang/srt/layers/rotary_embedding.py (RotaryEmbedding,
Llama3RotaryEmbedding, DeepseekScalingRotaryEmbedding, get_rope). SGLang also
implements plain YaRN, dynamic NTK, M-RoPE and fused kernels; minisgl has the
default, llama3 and DeepSeek-YaRN scalings, in the NeoX layout (rotate halves)
that Llama and Qwen checkpoints use or the GPT-J layout (rotate interleaved
pairs) of DeepSeek's.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

import torch

from minisgl.layers.custom_op import CustomOp


class RotaryEmbedding(CustomOp):
    # Scales cos and sin alike (YaRN's attention factor); 1 for the other scalings.
    mscale = 1.0

    def __init__(
        self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float, is_neox_style: bool = True
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.base = base
        self.is_neox_style = is_neox_style
        inv_freq = self._compute_inv_freq()
        t = torch.arange(max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_pos, rotary_dim / 2]
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * self.mscale
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _compute_inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float() / self.rotary_dim
        return 1.0 / (self.base**exponents)

    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # query: [num_tokens, num_heads * head_size], key: [num_tokens, num_kv_heads * head_size]
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [num_tokens, rotary_dim / 2] each
        apply = _apply_rotary if self.is_neox_style else _apply_rotary_interleaved
        return apply(query, cos, sin, self.head_size), apply(key, cos, sin, self.head_size)

    def forward_cpu(self, positions, query, key):
        if not self.is_neox_style:  # the C++ kernel rotates halves only
            return self.forward_native(positions, query, key)
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


class DeepseekScalingRotaryEmbedding(RotaryEmbedding):
    """YaRN as DeepSeek configures it: interpolate low frequencies by `factor`, keep high ones.

    Dimensions that turn fewer than beta_slow times over the original context are divided by
    `factor`, those that turn more than beta_fast times are kept, and a linear ramp blends the
    ones between. cos and sin are scaled by mscale(factor, mscale) / mscale(factor,
    mscale_all_dim); the model scales its softmax by mscale(factor, mscale_all_dim)**2.
    """

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, scaling: dict) -> None:
        self.scaling_factor = scaling["factor"]
        self.beta_fast = scaling.get("beta_fast", 32)
        self.beta_slow = scaling.get("beta_slow", 1)
        self.orig_max_position = scaling["original_max_position_embeddings"]
        self.mscale = yarn_get_mscale(self.scaling_factor, scaling.get("mscale", 1)) / yarn_get_mscale(
            self.scaling_factor, scaling.get("mscale_all_dim", 0)
        )
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style)

    def _compute_inv_freq(self) -> torch.Tensor:
        extrapolated = super()._compute_inv_freq()
        interpolated = extrapolated / self.scaling_factor

        def correction_dim(num_rotations: float) -> float:  # the dimension that turns num_rotations times
            return (
                self.rotary_dim
                * math.log(self.orig_max_position / (num_rotations * 2 * math.pi))
                / (2 * math.log(self.base))
            )

        low = max(math.floor(correction_dim(self.beta_fast)), 0)
        high = min(math.ceil(correction_dim(self.beta_slow)), self.rotary_dim - 1)
        if low == high:
            high += 0.001  # as SGLang and HF: no zero-width ramp
        ramp = ((torch.arange(self.rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
        return interpolated * (1 - keep) + extrapolated * keep


def yarn_get_mscale(scale: float = 1, mscale: float = 1) -> float:
    """YaRN's magnitude correction for a context stretched `scale` times."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int) -> torch.Tensor:
    num_tokens = x.shape[0]
    x = x.reshape(num_tokens, -1, head_size)  # [num_tokens, heads, head_size]
    rot = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot.float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return torch.cat((rotated, x_pass), dim=-1).reshape(num_tokens, -1)


def _apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int) -> torch.Tensor:
    """GPT-J layout: dimensions (0, 1), (2, 3), ... are the pairs each frequency rotates."""
    num_tokens = x.shape[0]
    x = x.reshape(num_tokens, -1, head_size)
    assert cos.shape[-1] * 2 == head_size, "interleaved rope rotates the whole head"
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return rotated.to(x.dtype).reshape(num_tokens, -1)


# As SGLang's _ROPE_DICT: one instance per distinct configuration, shared by every layer. Each
# holds a float32 cos/sin table of max_position rows (2 MiB for SmolLM2's 8,192 x 64); one per
# layer, with what building each left behind, cost SmolLM2 about 50 MB.
_ROPE_DICT: dict[tuple, RotaryEmbedding] = {}


def get_rope(
    head_size: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Optional[dict[str, Any]] = None,
    is_neox_style: bool = True,
) -> RotaryEmbedding:
    """The rotary embedding for this configuration, built once per device (see _ROPE_DICT)."""
    key = (head_size, rotary_dim, max_position, base, json.dumps(rope_scaling, sort_keys=True), is_neox_style)
    key += (str(torch.get_default_device()),)
    if key not in _ROPE_DICT:
        _ROPE_DICT[key] = _make_rope(head_size, rotary_dim, max_position, base, rope_scaling, is_neox_style)
    return _ROPE_DICT[key]


def _make_rope(head_size, rotary_dim, max_position, base, rope_scaling, is_neox_style) -> RotaryEmbedding:
    rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
    if rope_type == "default":
        return RotaryEmbedding(head_size, rotary_dim, max_position, base, is_neox_style)
    if rope_type == "llama3" and is_neox_style:
        return Llama3RotaryEmbedding(head_size, rotary_dim, max_position, base, rope_scaling)
    if rope_type in ("yarn", "deepseek_yarn"):
        # As SGLang: DeepSeek's YaRN is the only YaRN minisgl serves (its configs name it "yarn").
        return DeepseekScalingRotaryEmbedding(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling)
    raise ValueError(f"unsupported rope_scaling type {rope_type!r} (minisgl has default, llama3 and DeepSeek's yarn)")
