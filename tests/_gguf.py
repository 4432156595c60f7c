"""GGUF test helpers: blocks as llama.cpp writes them, and the integer path's arithmetic in float64.

The reference for kernels/cpu/gemm_gguf_vec.cpp (MMVQ): x quantized per 32-block exactly as the
kernel does it (float32 division, ties to even), then every integer dot product and scaling of
that file's header formulas, in float64.
"""

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize


def blocks(n: int, k: int, weight_type: T, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random [n, k] matrix in GGUF blocks, and those blocks dequantized (float32)."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    q = quantize(w, weight_type)
    return torch.from_numpy(q), torch.from_numpy(dequantize(q, weight_type).astype(np.float32))


def vec_a8_reference(x: torch.Tensor, qweight: torch.Tensor, weight_type: T) -> torch.Tensor:
    """y = x W^T with x rounded to int8 per block first, as gguf_mul_mat_vec_a8; float64 [M, N]."""
    m, k = x.shape
    nb, n = k // 32, qweight.shape[0]
    xb = x.float().reshape(m, nb, 32)
    dx = xb.abs().amax(-1).clamp(min=1e-10) / 127  # float32, as the kernel
    xq = torch.round(xb / dx[..., None]).clamp(-127, 127).double()
    sx = xq.sum(-1)
    blk = qweight.reshape(n, nb, -1)
    d = blk[..., 0:2].contiguous().view(torch.float16).double()[..., 0]
    if weight_type == T.Q8_0:
        wq = blk[..., 2:].contiguous().view(torch.int8).double()
    else:
        qs = blk[..., -16:].int()
        wq = torch.cat([qs & 15, qs >> 4], dim=-1).double()  # nibbles: weights 0-15, then 16-31
    dot = torch.einsum("mbj,nbj->mnb", xq, wq)  # exact integers
    if weight_type == T.Q4_0:
        dot = dot - 8 * sx[:, None, :]
    y = (dot * d[None] * dx.double()[:, None, :]).sum(-1)
    if weight_type == T.Q4_1:
        mins = blk[..., 2:4].contiguous().view(torch.float16).double()[..., 0]
        y = y + (mins[None] * (dx.double() * sx)[:, None, :]).sum(-1)
    return y
