"""GGUF blocks: which types minisgl multiplies, their dequantization, and the weight-only GEMM on them.

Mirrors the kernel half of python/sglang/srt/layers/quantization/gguf.py (fused_mul_mat_gguf,
apply_gguf_embedding and sgl-kernel's ggml_dequantize), whose kernels are CUDA-only. A GGUF weight
stays as the file stores it, ``qweight`` uint8 [N, K / 32 * block bytes]: each row is K / 32 blocks,
each block one or two fp16 numbers and 32 small integers (ggml-common.h):

- Q8_0 (34 bytes): d, int8 q[32];                 w = q d
- Q4_0 (18 bytes): d, 16 bytes of 4-bit q;        w = (q - 8) d
- Q4_1 (20 bytes): d, m, 16 bytes of 4-bit q;     w = q d + m

where byte j holds weight j in its low nibble and weight j + 16 in its high one. Where the CPU
kernels built, a GEMM of up to MMVQ_MAX_ROWS rows quantizes the activations to int8 per block
and multiplies integers (kernels/cpu/gemm_gguf_vec.cpp, SGLang's ggml_mul_mat_vec_a8 "MMVQ" path,
and llama.cpp's for every batch); more rows keep their float activations and the blocks are
dequantized inside the tile loop (kernels/cpu/gemm_gguf.cpp, weight-only). Elsewhere (a GPU, or no
compiler) the weight is dequantized here, TILE_ROWS rows at a time, so no whole float copy of it
ever exists.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from minisgl.kernels.cpu import is_available as cpu_kernels_available
from minisgl.kernels.cpu.features import gguf_gemm_uses_avx2

# SGLang dequantizes every standard, K- and I-quant type on CUDA; minisgl's kernel does these three.
SUPPORTED_TYPES = (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)
# A matrix a GGUF file keeps in float is held as its bytes too, and multiplied in PyTorch.
UNQUANTIZED_TYPES = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}
BLOCK_SIZE = 32  # weights per block, for all three
TILE_ROWS = 1024  # rows per dequantized slice on the PyTorch path
# Up to this many rows the integer path is the faster, from 16 on the float one (bench_gguf_gemm.py on
# SmolLM2's shapes, AMD EPYC with AVX2: Q4_1 at 1.8x the float path's speed at one row, 1.2x at 12, 0.9x
# at 16, where gemm_gguf.cpp switches to its transposed-x loop). SGLang's CUDA bound is 6 rows
# (mmvq_safe, python/sglang/srt/layers/quantization/gguf.py:150); its larger batches are int8 too.
MMVQ_MAX_ROWS = 15


def check_supported(weight_type: int, name: str) -> GGMLQuantizationType:
    weight_type = GGMLQuantizationType(weight_type)
    if weight_type not in SUPPORTED_TYPES and weight_type not in UNQUANTIZED_TYPES:
        raise NotImplementedError(
            f"{name}: GGUF type {weight_type.name} is not supported by minisgl's GGUF kernel "
            f"(it multiplies {', '.join(t.name for t in SUPPORTED_TYPES)}); convert the file to float with "
            "minisgl.model_loader.gguf.convert_gguf and load that folder instead"
        )
    return weight_type


def row_bytes(weight_type: int, k: int) -> int:
    """Bytes per row of K weights; K must be a whole number of blocks."""
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(weight_type)]
    if k % block:
        raise ValueError(
            f"a GGUF row of {k} weights is not a whole number of {block}-weight blocks "
            "(with tensor parallelism: a row-parallel layer's share of its input would cut a block)"
        )
    return k // block * type_size


def ggml_dequantize(qweight: torch.Tensor, weight_type: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[N, bytes] uint8 blocks -> [N, K] float (SGLang's ggml_dequantize, in PyTorch)."""
    weight_type = GGMLQuantizationType(weight_type)
    if weight_type in UNQUANTIZED_TYPES:
        return qweight.view(UNQUANTIZED_TYPES[weight_type]).to(dtype)
    type_size = GGML_QUANT_SIZES[weight_type][1]
    n = qweight.shape[0]
    blocks = qweight.reshape(n, -1, type_size)  # [N, K / 32, bytes per block]
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [N, K / 32, 1]
    if weight_type == GGMLQuantizationType.Q8_0:
        w = blocks[..., 2:].contiguous().view(torch.int8).float() * d
    else:
        qs = blocks[..., -16:].int()
        q = torch.cat([qs & 15, qs >> 4], dim=-1).float()  # weights 0-15 (low nibbles), 16-31 (high)
        if weight_type == GGMLQuantizationType.Q4_0:
            w = (q - 8) * d
        else:
            w = q * d + blocks[..., 2:4].contiguous().view(torch.float16).float()
    return w.reshape(n, -1).to(dtype)


def use_gguf_kernel(x: torch.Tensor) -> bool:
    return x.is_cpu and cpu_kernels_available()


def fused_mul_mat_gguf(
    x: torch.Tensor, qweight: torch.Tensor, weight_type: int, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """y = x W^T (+ bias) for W in GGUF blocks, in x's dtype, for x of any leading shape."""
    x2d = x.reshape(-1, x.shape[-1])
    if weight_type in UNQUANTIZED_TYPES:
        y = F.linear(x2d, qweight.view(UNQUANTIZED_TYPES[weight_type]).to(x.dtype), bias)
    elif use_gguf_kernel(x):
        ops = torch.ops.minisgl_kernel
        gemm = ops.gguf_mul_mat_vec_a8 if x2d.shape[0] <= MMVQ_MAX_ROWS else ops.gguf_mul_mat
        y = gemm(x2d.contiguous(), qweight, int(weight_type), bias, gguf_gemm_uses_avx2())
    else:
        y = torch.cat(
            [x2d @ ggml_dequantize(rows, weight_type, x.dtype).t() for rows in qweight.split(TILE_ROWS)], dim=-1
        )
        if bias is not None:
            y = y + bias
    return y.view(*x.shape[:-1], y.shape[-1])


def apply_gguf_embedding(
    ids: torch.Tensor, qweight: torch.Tensor, weight_type: int, dtype: torch.dtype
) -> torch.Tensor:
    """The embedding rows of ids, dequantized: only the rows looked up ever exist in float."""
    rows = torch.index_select(qweight, 0, ids.reshape(-1))
    return ggml_dequantize(rows, weight_type, dtype).view(*ids.shape, -1)
