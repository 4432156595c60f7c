"""One op, one forward per platform.

Mirrors python/sglang/srt/layers/utils/multi_platform.py:24 (MultiPlatformOp; SGLang has no
srt/custom_op.py, and its utils/custom_op.py registers torch custom ops instead): a layer
writes ``forward_native`` in plain PyTorch (the reference every kernel is tested against) and
may add ``forward_cuda`` and ``forward_cpu`` fast paths. SGLang binds the path once at
construction from the platform (MultiPlatformOp.dispatch_forward); minisgl picks it per call
from the input's device, so a module moved between devices keeps working. The CPU path is
taken only where minisgl's C++ kernels built (minisgl/kernels/cpu).
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.kernels.cpu import is_available as cpu_kernels_available


class CustomOp(nn.Module):
    def forward(self, x: torch.Tensor, *args, **kwargs):
        # Called ~10 times per layer per step: keep the dispatch to two attribute reads.
        device = x.device.type
        if device == "cuda":
            return self.forward_cuda(x, *args, **kwargs)
        if device == "cpu" and cpu_kernels_available():
            return self.forward_cpu(x, *args, **kwargs)
        return self.forward_native(x, *args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_cuda(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_cpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)
