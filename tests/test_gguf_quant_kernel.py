"""The two GGUF GEMMs and minisgl's PyTorch dequantizer, each against its reference:

- the weight-only GEMM (kernels/cpu/gemm_gguf.cpp) against the `gguf` package's dequantize
  (llama.cpp's block formats in numpy) and a float64 matmul;
- the integer one for a few rows (kernels/cpu/gemm_gguf_vec.cpp), whose activations are rounded
  to int8 per block, against tests/_gguf.py's float64 arithmetic of the same rounding, and, to
  the rounding's error, against the float matmul too.

Weights come from gguf.quants.quantize of random matrices, so every block is one llama.cpp would
write. The kernels' sums run in float32 in another order than the references', so outputs agree
to float32 rounding (relative 1e-5 of the output's scale), not bit for bit; the dequantized weights
themselves agree exactly (Q8_0, Q4_0) or to one float32 rounding (Q4_1: d q + m, fused or not).
"""

import pytest
import torch
from gguf import GGMLQuantizationType as T

from minisgl.kernels.cpu import is_available
from minisgl.kernels.cpu.features import gguf_gemm_uses_avx2
from minisgl.layers.quantization.gguf_kernel import MMVQ_MAX_ROWS, fused_mul_mat_gguf, ggml_dequantize
from tests._gguf import blocks as _weights
from tests._gguf import vec_a8_reference

TYPES = [T.Q8_0, T.Q4_0, T.Q4_1]
# The kernel's two paths; the AVX2 one only where this CPU has AVX2, FMA and F16C.
PATHS = [
    pytest.param(True, marks=pytest.mark.skipif(not gguf_gemm_uses_avx2(), reason="no AVX2+FMA+F16C on this CPU")),
    False,
]
needs_kernels = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")


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
@pytest.mark.parametrize("weight_type", TYPES)
# K = 1056 crosses no chunk here but 33 blocks; M = 5 and 6 leave 1 and 2 rows after a group of 4;
# at M = 1 Q4 rows go in pairs, and N = 37 leaves one over (and splits oddly between threads); with
# AVX512-VNNI blocks go in pairs too where a row has an even number of them (576 and 1536, not 32 or 1056).
@pytest.mark.parametrize(
    "m,n,k",
    [(1, 7, 32), (1, 37, 576), (1, 50, 1536), (1, 3, 1056), (2, 9, 64), (3, 17, 1056), (5, 33, 96), (6, 4, 576)],
)
def test_vec_a8_gemm_matches_its_integer_arithmetic(weight_type, use_avx2, m, n, k):
    q, w = _weights(n, k, weight_type)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    x[0, :32] = 0  # an all-zero block: its scale must not divide by zero
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2))
    ref = vec_a8_reference(x, q, weight_type) + bias.double()
    out = torch.ops.minisgl_kernel.gguf_mul_mat_vec_a8(x, q, int(weight_type), bias, use_avx2)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    # The rounding of x to 8 bits is the only difference from the float product: under 2% of the
    # output's scale here (about 0.5% measured), where a wrong nibble or sign is tens of percent.
    exact = x.double() @ w.double().t() + bias.double()
    assert (out.double() - exact).abs().max() < 0.02 * exact.abs().max()


@needs_kernels
@pytest.mark.parametrize("use_avx2", PATHS)
def test_vec_a8_rounds_halves_to_even(use_avx2):
    """max|x| = 127 makes dx = 1, so x / dx lands on halves: both quantizers must round them to even
    (2.5 -> 2, -3.5 -> -4), as the reference's torch.round does."""
    q, _ = _weights(3, 32, T.Q8_0)
    x = torch.tensor([[127.0, 2.5, -3.5, 0.5, -0.5, 1.5, 126.5] + [0.0] * 25])
    ref = vec_a8_reference(x, q, T.Q8_0)
    out = torch.ops.minisgl_kernel.gguf_mul_mat_vec_a8(x, q, int(T.Q8_0), None, use_avx2)
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=0)


@needs_kernels
@pytest.mark.parametrize("use_avx2", PATHS)
@pytest.mark.parametrize("op", ["gguf_mul_mat", "gguf_mul_mat_vec_a8"])
def test_gemm_in_bfloat16(op, use_avx2):
    """A bf16 layer: the activations are widened to float32, the output rounded back once."""
    q, w = _weights(19, 64, T.Q4_1)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    out = getattr(torch.ops.minisgl_kernel, op)(x, q, int(T.Q4_1), None, use_avx2)
    assert out.dtype == torch.bfloat16
    ref = x.double() @ w.double().t() if op == "gguf_mul_mat" else vec_a8_reference(x, q, T.Q4_1)
    torch.testing.assert_close(out, ref.bfloat16(), rtol=1e-2, atol=1e-2)


@needs_kernels
@pytest.mark.parametrize("rows", [MMVQ_MAX_ROWS, MMVQ_MAX_ROWS + 1])
def test_layer_entry_point_picks_the_gemm_by_rows(rows):
    """Up to MMVQ_MAX_ROWS rows the integer GEMM, from one more the weight-only float one."""
    q, w = _weights(9, 64, T.Q8_0)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(4))
    ref = vec_a8_reference(x, q, T.Q8_0) if rows <= MMVQ_MAX_ROWS else x.double() @ w.double().t()
    torch.testing.assert_close(fused_mul_mat_gguf(x, q, T.Q8_0).double(), ref, rtol=1e-5, atol=1e-4)


def test_layer_entry_point_without_kernels(monkeypatch):
    """Where the kernels did not build, fused_mul_mat_gguf dequantizes slices in PyTorch."""
    q, w = _weights(9, 64, T.Q8_0)
    x = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(4))
    ref = x @ w.t()
    monkeypatch.setattr("minisgl.layers.quantization.gguf_kernel.TILE_ROWS", 4)  # several slices
    monkeypatch.setattr("minisgl.layers.quantization.gguf_kernel.use_gguf_kernel", lambda x: False)
    torch.testing.assert_close(fused_mul_mat_gguf(x, q, T.Q8_0), ref, rtol=1e-5, atol=1e-4)


@needs_kernels
@pytest.mark.parametrize("op", ["gguf_mul_mat", "gguf_mul_mat_vec_a8"])
def test_bad_shapes_and_types_are_refused(op):
    q, _ = _weights(4, 64, T.Q4_0)
    gemm = getattr(torch.ops.minisgl_kernel, op)
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
