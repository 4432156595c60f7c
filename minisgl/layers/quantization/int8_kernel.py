"""int8 quantization of weights (per output channel) and activations (per token), and the int8 GEMM.

Mirrors python/sglang/srt/layers/quantization/int8_kernel.py (per_token_quant_int8) and the
CPU calls of w8a8_int8.py. Both scales are symmetric: q = round(x / s) with s = max|x| / 127, so
zero stays exactly zero and no zero-point enters the integer sums. The sums are exact int32;
the only rounding is in the quantization and the float32 epilogue. :func:`int8_scaled_mm_with_quant`
runs minisgl's C++ kernel (kernels/cpu/gemm_int8.cpp, and gemm_int8_vnni.cpp where the CPU has
AVX512-VNNI) where it built, else the same arithmetic
in PyTorch (int8_scaled_mm_native), which the kernel tests also use as their reference.
"""

from __future__ import annotations

from typing import Optional

import torch

from minisgl.kernels.cpu import is_available as cpu_kernels_available
from minisgl.kernels.cpu.features import int8_gemm_engine


def _symmetric_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of x as int8 times one float32 scale: (q [..., K], scale [..., 1])."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / 127.0
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def quantize_weight_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (int8 [N, K], float32 weight_scale [N, 1]): SGLang's w8a8_int8 checkpoint layout."""
    return _symmetric_int8(weight)


def per_token_quant_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] float -> (int8 [M, K], float32 scale [M, 1]), computed when the tokens arrive."""
    return _symmetric_int8(x)


def use_int8_kernel(x: torch.Tensor) -> bool:
    return x.is_cpu and cpu_kernels_available()


def pack_int8_weight(weight: torch.Tensor, engine: Optional[str] = None) -> torch.Tensor:
    """The weight as int8_scaled_mm_with_quant reads it: packed for the C++ kernel where it runs,
    in the layout of ``engine`` (default: the fastest this CPU has, features.int8_gemm_engine)."""
    if not use_int8_kernel(weight):
        return weight
    if (engine or int8_gemm_engine()) == "avx512_vnni":
        return torch.ops.minisgl_kernel.convert_weight_packed_int8_vnni(weight)
    return torch.ops.minisgl_kernel.convert_weight_packed_int8(weight)


def int8_scaled_mm_native(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """(x_q @ w_q^T) as exact integers, times x_scale [M, 1] and w_scale [N, 1], plus bias, in out_dtype.

    On a GPU torch._int_mm sums in int32. On a CPU it is oneDNN's int8 GEMM, which is exact only
    where oneDNN multiplies with VNNI: on AVX2 (and AVX-512 without VNNI) it uses vpmaddubsw, whose
    int16 pair sums saturate once the activations are shifted into u8 (255 x 127 x 2 > 32,767); with
    ONEDNN_MAX_CPU_ISA=AVX2 a 17 x 64 x 40 product came out up to 38,508 off. So the CPU sums in
    float64, which holds every int8 dot product of any realistic K exactly."""
    acc = torch._int_mm(x_q, w_q.t()) if x_q.is_cuda else x_q.double() @ w_q.double().t()
    y = acc.float() * x_scale * w_scale.view(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def int8_scaled_mm_with_quant(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """y = x W^T + bias with x quantized per token on the fly; weight as pack_int8_weight left it."""
    x2d = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if weight.dim() == 3:  # packed: the C++ kernel (quantization, GEMM and epilogue in one call)
        # weight_scale [N, 1] goes in as it is (the kernel reads N contiguous floats), and the
        # models' [tokens, hidden] without a reshape and a view: as apply_linear's 2-D path, for
        # 120 calls a decode step in SmolLM2.
        y = torch.ops.minisgl_kernel.int8_scaled_mm_with_quant(
            x2d.contiguous(), weight, weight_scale, bias, x.dtype, True
        )
    else:
        x_q, x_scale = per_token_quant_int8(x2d)
        y = int8_scaled_mm_native(x_q, weight, x_scale, weight_scale, x.dtype, bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])
