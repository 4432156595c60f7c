"""RMSNorm, optionally fused with the residual add.

Mirrors python/sglang/srt/layers/layernorm.py (RMSNorm.forward_native /
forward_cuda). SGLang dispatches to sgl-kernel on GPU; minisgl dispatches to
its own Triton kernel there and to plain torch elsewhere. Both compute in
float32 and round once, exactly like the Hugging Face reference.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from minisgl.layers.triton_ops.rmsnorm import fused_add_rmsnorm, rmsnorm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without residual: norm(x). With residual: (norm(x + residual), x + residual)."""
        # SGLang's CustomOp dispatch: a fused kernel on the GPU, plain torch elsewhere.
        return self.forward_cuda(x, residual) if x.is_cuda else self.forward_native(x, residual)

    def forward_cuda(self, x, residual=None):
        if residual is None:
            return rmsnorm(x, self.weight, self.variance_epsilon)
        return fused_add_rmsnorm(x, residual, self.weight, self.variance_epsilon)

    def forward_native(self, x, residual=None):
        if residual is not None:
            x = x + residual
            residual = x
        orig_dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = self.weight * h.to(orig_dtype)
        return out if residual is None else (out, residual)
