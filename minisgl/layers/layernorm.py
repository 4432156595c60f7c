"""RMSNorm, optionally fused with the residual add.

Mirrors python/sglang/srt/layers/layernorm.py (RMSNorm.forward_native /
forward_cuda / forward_cpu). SGLang dispatches to sgl-kernel; minisgl to its own
Triton kernel on the GPU and its own C++ kernel on the CPU. All compute in
float32 and round where the Hugging Face reference rounds.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from minisgl.layers.custom_op import CustomOp

# Only where CUDA is: importing triton maps about 65 MB of its libraries into the process, which a
# CPU engine never uses (as SGLang imports sgl_kernel only `if _is_cuda`).
if torch.cuda.is_available():
    from minisgl.layers.triton_ops.rmsnorm import fused_add_rmsnorm, rmsnorm


class RMSNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    # forward(x, residual=None) -> norm(x), or (norm(x + residual), x + residual): CustomOp dispatch

    def forward_cuda(self, x, residual=None):
        if residual is None:
            return rmsnorm(x, self.weight, self.variance_epsilon)
        return fused_add_rmsnorm(x, residual, self.weight, self.variance_epsilon)

    def forward_cpu(self, x, residual=None):
        if residual is None:
            return torch.ops.minisgl_kernel.rmsnorm_cpu(x, self.weight, self.variance_epsilon)
        return torch.ops.minisgl_kernel.fused_add_rmsnorm_cpu(x, residual, self.weight, self.variance_epsilon)

    def forward_native(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        if residual is not None:
            x = x + residual
            residual = x
        orig_dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = self.weight * h.to(orig_dtype)
        return out if residual is None else (out, residual)
