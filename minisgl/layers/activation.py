"""Gated activations.

Mirrors python/sglang/srt/layers/activation.py (SiluAndMul). SGLang also has
GeluAndMul, quick-GELU and fused CUDA kernels; the models here only need SiLU,
and minisgl's fused kernel is the CPU one.
"""

import torch
import torch.nn.functional as F

from minisgl.layers.custom_op import CustomOp


class SiluAndMul(CustomOp):
    """silu(gate) * up, where the input is [..., 2 * d] = [gate | up]."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self.forward_native(x)
        return torch.ops.minisgl_kernel.silu_and_mul_cpu(x)
