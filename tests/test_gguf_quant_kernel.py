"""The GGUF weight-only GEMM (minisgl/kernels/cpu/gemm_gguf.cpp) and minisgl's PyTorch dequantizer,
against the `gguf` package's reference dequantize (llama.cpp's block formats in numpy) and a float64
matmul.

Weights come from gguf.quants.quantize of random matrices, so every block is one llama.cpp would
write. The kernel's sums run in float32 in another order than the reference's, so outputs agree to
float32 rounding (relative 1e-5 of the output's scale), not bit for bit; the dequantized weights
themselves agree exactly (Q8_0, Q4_0) or to one float32 rounding (Q4_1: d q + m, fused or not).
"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from minisgl.kernels.cpu import is_available
from minisgl.kernels.cpu.features import gguf_gemm_uses_avx2
from minisgl.layers.quantization.gguf_kernel import fused_mul_mat_gguf, ggml_dequantize

TYPES = [T.Q8_0, T.Q4_0, T.Q4_1]
# The kernel's two paths; the AVX2 one only where this CPU has AVX2, FMA and F16C.
PATHS = [
    pytest.param(True, marks=pytest.mark.skipif(not gguf_gemm_uses_avx2(), reason="no AVX2+FMA+F16C on this CPU")),
    False,
]
needs_kernels = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")


def _weights(n: int, k: int, weight_type: T, seed: int = 0):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    q = quantize(w, weight_type)
    return torch.from_numpy(q), torch.from_numpy(dequantize(q, weight_type).astype(np.float32))


@pytest.mark.parametrize("weight_type", TYPES)
def test_torch_dequantize_matches_gguf(weight_type):
    q, ref = _weights(7, 96, weight_type)
    out = ggml_dequantize(q, weight_type)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("use_avx2", PATHS)
@pytest.mark.parametrize("weight_type", TYPES)
# K = 544 and 1056 cross 256-wide chunks; M = 16 and 20 take the batched (x^T) AVX2 path, 20 with
# a last panel of 8 rows (4 of them padding); N = 13, 25 and 33 leave part of a 12-row tile.
@pytest.mark.parametrize("m,n,k", [(1, 7, 32), (2, 9, 64), (5, 33, 96), (3, 17, 1056), (16, 13, 64), (20, 25, 544)])
def test_gemm_matches_dequantize_then_matmul(weight_type, use_avx2, m, n, k):
    q, w = _weights(n, k, weight_type)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2))
    ref = x.double() @ w.double().t() + bias.double()
    out = torch.ops.minisgl_kernel.gguf_mul_mat(x, q, int(weight_type), bias, use_avx2)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@needs_kernels
@pytest.mark.parametrize("use_avx2", PATHS)
def test_gemm_in_bfloat16(use_avx2):
    """A bf16 layer: the activations are widened to float32, the output rounded back once."""
    q, w = _weights(19, 64, T.Q4_1)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    out = torch.ops.minisgl_kernel.gguf_mul_mat(x, q, int(T.Q4_1), None, use_avx2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, (x.double() @ w.double().t()).bfloat16(), rtol=1e-2, atol=1e-2)


def test_layer_entry_point_with_and_without_kernels(monkeypatch):
    """fused_mul_mat_gguf takes the kernel where it built, else dequantizes slices in PyTorch."""
    q, w = _weights(9, 64, T.Q8_0)
    x = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(4))
    ref = x @ w.t()
    torch.testing.assert_close(fused_mul_mat_gguf(x, q, T.Q8_0), ref, rtol=1e-5, atol=1e-4)
    monkeypatch.setattr("minisgl.layers.quantization.gguf_kernel.TILE_ROWS", 4)  # several slices
    monkeypatch.setattr("minisgl.layers.quantization.gguf_kernel.use_gguf_kernel", lambda x: False)
    torch.testing.assert_close(fused_mul_mat_gguf(x, q, T.Q8_0), ref, rtol=1e-5, atol=1e-4)


@needs_kernels
def test_bad_shapes_and_types_are_refused():
    q, _ = _weights(4, 64, T.Q4_0)
    gemm = torch.ops.minisgl_kernel.gguf_mul_mat
    with pytest.raises(RuntimeError, match="x has K=32, qweight rows hold 64 weights"):
        gemm(torch.randn(2, 32), q, int(T.Q4_0), None, False)
    with pytest.raises(RuntimeError, match="not a whole number of 18-byte blocks"):
        gemm(torch.randn(2, 64), q[:, :35].contiguous(), int(T.Q4_0), None, False)
    with pytest.raises(RuntimeError, match="ggml type 6 is not one of"):  # Q5_0
        gemm(torch.randn(2, 64), q, int(T.Q5_0), None, False)
    with pytest.raises(RuntimeError, match="x must be 2-D"):
        gemm(torch.randn(64), q, int(T.Q4_0), None, False)
    with pytest.raises(RuntimeError, match="bias has 3 values for N=4"):
        gemm(torch.randn(2, 64), q, int(T.Q4_0), torch.zeros(3), False)
