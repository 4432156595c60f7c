"""The W8A8-int8 kernels (minisgl/kernels/cpu/gemm_int8.cpp, gemm_int8_vnni.cpp) against PyTorch's int8 arithmetic.

The reference quantizes in torch (round(x / scale), scale = max|x| / 127) and multiplies with
exact int64 sums, so the kernel must give the same int8 activations and scales bit for bit and
the same outputs up to float32 rounding of the epilogue; and the whole W8A8 product must stay
near the float one.
"""

import os
import subprocess
import sys

import pytest
import torch

from minisgl.kernels.cpu import is_available
from minisgl.kernels.cpu.features import cpu_features, int8_gemm_engine
from minisgl.layers.quantization.int8_kernel import (
    int8_scaled_mm_native,
    int8_scaled_mm_with_quant,
    pack_int8_weight,
    per_token_quant_int8,
    quantize_weight_int8,
)
from tests.kernels.test_cpu_matrix_engines import force_brgemm

pytestmark = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")
ops = torch.ops.minisgl_kernel


def _exact_reference(x, w_q, w_scale, bias):
    x_q, x_scale = per_token_quant_int8(x)
    acc = (x_q.long() @ w_q.long().t()).float()  # int64 sums: no overflow, no rounding
    y = acc * x_scale * w_scale.view(1, -1)
    return (y + bias.float() if bias is not None else y).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_per_token_quant_int8_matches_torch(dtype):
    x = (torch.randn(13, 77, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    x[3] = 0  # an all-zero row: scale clamped, values zero
    q, scale = ops.per_token_quant_int8(x)
    q_ref, scale_ref = per_token_quant_int8(x)
    assert torch.equal(q, q_ref) and torch.equal(scale, scale_ref)


# M covers decode (1, 3) and prefill-sized row counts, not a multiple of the 4-row tile; N and K
# include sizes that are not multiples of the 16-column panel or of the k-pairs.
@pytest.mark.parametrize("M,N,K", [(1, 16, 64), (3, 40, 33), (9, 576, 576), (70, 100, 130), (300, 72, 70)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_scaled_mm_with_quant(M, N, K, dtype, with_bias):
    g = torch.Generator().manual_seed(M * 1000 + N)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g) * K**-0.5
    bias = torch.randn(N, generator=g).to(dtype) if with_bias else None
    w_q, w_scale = quantize_weight_int8(w)
    packed = pack_int8_weight(w_q)  # in the layout of this CPU's fastest engine
    assert packed.dim() == 3, "the kernel path must be the one under test"
    assert packed.shape[2] == {"avx512_vnni": 64, "avx2": 32}[int8_gemm_engine()]
    out = int8_scaled_mm_with_quant(x, packed, w_scale, bias)
    ref = _exact_reference(x, w_q, w_scale, bias)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    # The unpacked-weight path of the same op packs on the fly and agrees.
    unpacked = ops.int8_scaled_mm_with_quant(x, w_q, w_scale.view(-1), bias, dtype, False)
    torch.testing.assert_close(unpacked, out, atol=0, rtol=0)
    # The torch fallback (engines where the kernels did not build) is the same arithmetic.
    x_q, x_scale = per_token_quant_int8(x)
    torch.testing.assert_close(int8_scaled_mm_native(x_q, w_q, x_scale, w_scale, dtype, bias), ref, atol=tol, rtol=tol)
    # And W8A8 is close to the float product: per-row relative error of a few 1e-2 at most.
    exact = x.float() @ w.t() + (bias.float() if with_bias else 0)
    rel = (out.float() - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert rel.max() < 0.05


def test_bad_shapes_are_refused():
    w_q, w_scale = quantize_weight_int8(torch.randn(32, 64))
    packed = pack_int8_weight(w_q)
    with pytest.raises(RuntimeError, match="packed for K=64"):
        ops.int8_scaled_mm_with_quant(torch.randn(2, 48), packed, w_scale.view(-1), None, torch.float32, True)
    with pytest.raises(RuntimeError, match="scales for a weight packed"):
        ops.int8_scaled_mm_with_quant(torch.randn(2, 64), packed, w_scale[:8].reshape(-1), None, torch.float32, True)
    with pytest.raises(RuntimeError, match="2-D int8 weight"):
        ops.convert_weight_packed_int8(torch.randn(32, 64))


def _vnni_layout_reference(w_q: torch.Tensor) -> torch.Tensor:
    """convert_weight_packed_int8_vnni in torch: 16-column panels of k-quads, then 128 x each column's sum."""
    N, K = w_q.shape
    panels, K4 = -(-N // 16), -(-K // 4)
    w = torch.zeros(panels * 16, K4 * 4, dtype=torch.int8)
    w[:N, :K] = w_q
    quads = w.view(panels, 16, K4, 4).transpose(1, 2).reshape(panels, K4, 64)
    comp = (128 * w.long().sum(dim=1)).to(torch.int32).view(panels, 16).view(torch.int8).view(panels, 1, 64)
    return torch.cat([quads, comp], dim=1)


@pytest.mark.parametrize("N,K", [(16, 64), (40, 33), (100, 130), (17, 5)])
def test_vnni_int8_layout_and_compensation(N, K):
    """Pure data movement and integer sums: checked on every CPU, VNNI or not."""
    w_q, _ = quantize_weight_int8(torch.randn(N, K, generator=torch.Generator().manual_seed(N)))
    assert torch.equal(ops.convert_weight_packed_int8_vnni(w_q), _vnni_layout_reference(w_q))


@pytest.mark.parametrize(
    "M,N,K",
    [
        (1, 16, 64),
        (3, 40, 33),
        (4, 576, 576),
        (6, 576, 576),  # 5-8 rows: one run of pairs per thread
        (8, 48, 64),
        (9, 576, 576),
        (33, 80, 128),
        (70, 100, 130),
        (200, 96, 1536),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("brgemm", ["0", "1", None])
def test_vnni_int8_gemm_equals_the_avx2_one_bit_for_bit(M, N, K, dtype, with_bias, brgemm, monkeypatch):
    """vpdpbusd's sums (activations shifted by 128, the shift taken back out exactly) are the same
    integers as vpmaddwd's, and the epilogue is the same float32 arithmetic: identical outputs.
    M covers 1 and 2 panels per tile, 1-8 rows per tile and more than one 128-row chunk; 4 rows by
    576 columns, each thread's long run of panel pairs, every tile prefetching the next pair. With
    MINISGL_BRGEMM=1 blocks over 4 rows take the AMX-int8 path's oneDNN brgemm (u8 x s8 -> s32, on
    vpdpbusd where the CPU has no AMX): the same exact sums, so the same outputs. Unset (None), a CPU
    with amx_int8 multiplies them on minisgl's own tiles (gemm_amx.h) where K is a multiple of 64:
    one or two 16-row groups, the last padded (33 rows), one or two panels (80 columns: 5 panels)."""
    if "avx512_vnni" not in cpu_features():
        pytest.skip(f"needs avx512_vnni; this CPU has {sorted(cpu_features())}")
    if brgemm == "1":
        force_brgemm(monkeypatch, torch.int8)
    elif brgemm is None:
        monkeypatch.delenv("MINISGL_BRGEMM", raising=False)
    else:
        monkeypatch.setenv("MINISGL_BRGEMM", "0")
    g = torch.Generator().manual_seed(M + N + K)
    x = (torch.randn(M, K, generator=g) * 4).to(dtype)
    x[0, : K // 2] = 0  # a half-zero row; and a row of one large value among small ones
    if M > 1:
        x[1, 0] = 100.0
    w_q, w_scale = quantize_weight_int8(torch.randn(N, K, generator=g))
    bias = torch.randn(N, generator=g).to(dtype) if with_bias else None
    vnni = int8_scaled_mm_with_quant(x, pack_int8_weight(w_q, "avx512_vnni"), w_scale, bias)
    avx2 = int8_scaled_mm_with_quant(x, pack_int8_weight(w_q, "avx2"), w_scale, bias)
    assert torch.equal(vnni, avx2)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(vnni, _exact_reference(x, w_q, w_scale, bias), atol=tol, rtol=tol)


def test_vnni_int8_shapes_are_checked():
    w_q, w_scale = quantize_weight_int8(torch.randn(32, 64))
    packed = ops.convert_weight_packed_int8_vnni(w_q)
    with pytest.raises(RuntimeError, match="packed for K=64"):
        ops.int8_scaled_mm_with_quant(torch.randn(2, 56), packed, w_scale.view(-1), None, torch.float32, True)
    with pytest.raises(RuntimeError, match="2-D int8 weight"):
        ops.convert_weight_packed_int8_vnni(torch.randn(32, 64))
    if "avx512_vnni" not in cpu_features():  # the kernel refuses, by the feature's name, rather than crash
        with pytest.raises(RuntimeError, match="needs avx512_vnni"):
            ops.int8_scaled_mm_with_quant(torch.randn(2, 64), packed, w_scale.view(-1), None, torch.float32, True)


def test_the_torch_fallback_is_exact_where_onednn_saturates():
    """oneDNN's int8 GEMM without VNNI (an AVX2 CPU, here imitated with ONEDNN_MAX_CPU_ISA=AVX2)
    saturates int16 pair sums, so torch._int_mm is wrong there; int8_scaled_mm_native must not be."""
    code = """
import torch
from minisgl.layers.quantization.int8_kernel import int8_scaled_mm_native
g = torch.Generator().manual_seed(0)
a = torch.randint(-127, 128, (17, 64), generator=g, dtype=torch.int8)
w = torch.randint(-127, 128, (40, 64), generator=g, dtype=torch.int8)
exact = (a.long() @ w.long().t()).double()
print("int_mm off by", (torch._int_mm(a, w.t()).double() - exact).abs().max().item())
ones = torch.ones(17, 1), torch.ones(40, 1)
assert torch.equal(int8_scaled_mm_native(a, w, *ones, torch.float64), exact)
"""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
