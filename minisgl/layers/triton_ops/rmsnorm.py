"""RMSNorm and fused residual-add + RMSNorm as Triton kernels, one program per row.

Stands in for the `rmsnorm` / `fused_add_rmsnorm` CUDA ops (from sgl_kernel, derived
from flashinfer) that `RMSNorm.forward_cuda` in SGLang's
`python/sglang/srt/layers/layernorm.py` calls. SGLang's fused_add_rmsnorm works in
place: x becomes the normalised output and residual becomes x + residual. minisgl's is
functional and returns both as new tensors, so no caller (or test) sees its inputs
change underneath it; the price is one allocation per call. The Gemma variant (weight
stored as w - 1) is omitted.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    X,
    Residual,
    W,
    Out,
    Residual_Out,
    stride_x,
    stride_r,
    stride_out,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden_size

    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(Residual + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        # The sum is rounded to the input dtype and the norm is taken of the rounded
        # value, so out == rmsnorm(residual_out): exactly what the next layer, which
        # only ever sees the stored residual, would compute (and what HF computes).
        x = (x + r).to(Residual_Out.dtype.element_ty)
        tl.store(Residual_Out + row * stride_out + offs, x, mask=mask)
        x = x.to(tl.float32)

    variance = tl.sum(x * x, axis=0) / hidden_size
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    out = x * tl.rsqrt(variance + eps) * w
    tl.store(Out + row * stride_out + offs, out.to(Out.dtype.element_ty), mask=mask)


def _launch(x, residual, weight, eps):
    assert x.ndim == 2 and x.stride(-1) == 1 and weight.shape == (x.shape[1],)
    n, hidden_size = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    residual_out = torch.empty_like(out) if residual is not None else None
    BLOCK = triton.next_power_of_2(hidden_size)
    _rmsnorm_kernel[(n,)](
        x,
        residual,
        weight,
        out,
        residual_out,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),  # residual_out is laid out like out
        hidden_size,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=BLOCK,
        num_warps=8 if BLOCK >= 4096 else 4,
    )
    return out, residual_out


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight per row, in fp32, stored in x's dtype.

    x: [n, hidden] (rows may be strided, the last dim must be contiguous); weight: [hidden].
    """
    out, _ = _launch(x, None, weight, eps)
    return out


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual), x + residual); the sum is taken in fp32 and stored in x's dtype.

    x, residual: [n, hidden] of the same dtype; weight: [hidden]. Returns new tensors.
    """
    assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(-1) == 1
    return _launch(x, residual, weight, eps)
