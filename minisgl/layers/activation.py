"""Gated activations.

Mirrors python/sglang/srt/layers/activation.py (SiluAndMul). SGLang also has
GeluAndMul, quick-GELU and fused CUDA kernels; the models here only need SiLU.
"""

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """silu(gate) * up, where the input is [..., 2 * d] = [gate | up]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
