"""One op, one forward per platform.

Mirrors python/sglang/srt/custom_op.py (CustomOp): a layer writes ``forward_native`` in plain
PyTorch (the reference every kernel is tested against) and may add ``forward_cuda`` and
``forward_cpu`` fast paths. SGLang binds the path once at construction from the platform;
minisgl picks it per call from the input's device, so a module moved between devices keeps
working. The CPU path is taken only where minisgl's C++ kernels built (minisgl/kernels/cpu).
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.kernels.cpu import is_available as cpu_kernels_available


class CustomOp(nn.Module):
    def forward(self, *args, **kwargs):
        device = next(a for a in args if isinstance(a, torch.Tensor)).device
        if device.type == "cuda":
            return self.forward_cuda(*args, **kwargs)
        if device.type == "cpu" and cpu_kernels_available():
            return self.forward_cpu(*args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_cuda(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_cpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)
