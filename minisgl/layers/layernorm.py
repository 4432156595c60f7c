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


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without residual: norm(x). With residual: (norm(x + residual), x + residual)."""
        if residual is not None:
            x = x + residual
            residual = x
        orig_dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = self.weight * h.to(orig_dtype)
        return out if residual is None else (out, residual)
