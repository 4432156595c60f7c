"""minisgl's float GEMM (minisgl/kernels/cpu/gemm.cpp, gemm_vnni.cpp: convert_weight_packed,
weight_packed_linear) against float64 F.linear: every tile height and row chunk, 16-bit weights,
a strided input, any number of threads, and the shapes it refuses. The int8 GEMM is
test_int8_gemm.py's, the matrix-engine paths test_cpu_matrix_engines.py's."""

import pytest
import torch
import torch.nn.functional as F

from minisgl.kernels.cpu import is_available
from tests.kernels.test_cpu_kernels import TOLERANCE

pytestmark = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")
ops = torch.ops.minisgl_kernel


def block_n() -> int:
    return ops.weight_packed_block_n()  # 32 with AVX-512, 16 with AVX2


@pytest.mark.parametrize(
    "dtype,weight_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.float32),
    ],
)
@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 11, 12, 13, 64, 128, 129, 300])  # none, tile edges, row chunks
@pytest.mark.parametrize("with_bias", [False, True])
def test_weight_packed_linear_matches_float64(dtype, weight_dtype, rows, with_bias):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 70, generator=g).to(dtype).to(weight_dtype)  # 3 or 6 panels; K not a multiple of anything
    bias = torch.randn(96, generator=g).to(dtype) if with_bias else None
    x = torch.randn(rows, 80, generator=g).to(dtype)[:, 3:73]  # a strided view, as a split QKV output is
    packed = ops.convert_weight_packed(weight)
    assert packed.shape == (96 // block_n(), 70, block_n()) and packed.dtype == weight_dtype  # kept in its dtype
    y = ops.weight_packed_linear(x, packed, bias)
    ref = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert y.dtype == dtype and y.shape == (rows, 96)
    # float32 accumulation; a 16-bit result is additionally rounded once
    torch.testing.assert_close(y.double(), ref, atol=TOLERANCE[dtype] * 10, rtol=TOLERANCE[dtype])
    if dtype != torch.float32:
        # 16-bit weights are widened exactly in registers and the result is rounded as it is stored:
        # bit-identical to multiplying float32 copies in float32 and rounding that.
        y32 = ops.weight_packed_linear(
            x.float(), ops.convert_weight_packed(weight.float()), None if bias is None else bias.float()
        )
        assert torch.equal(y, y32.to(dtype))


@pytest.mark.parametrize("rows", [3, 300])  # one row chunk split by panels; three chunks
def test_weight_packed_linear_gives_the_same_bits_on_any_number_of_threads(rows):
    """Threads take units of work from a shared counter, so which thread computes which rows and
    panels changes from call to call; the result must not."""
    g = torch.Generator().manual_seed(0)
    packed = ops.convert_weight_packed(torch.randn(40 * block_n(), 70, generator=g))
    x = torch.randn(rows, 70, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = ops.weight_packed_linear(x, packed, None)
        torch.set_num_threads(4)  # more threads than this machine may have cores: units still all run once
        together = [ops.weight_packed_linear(x, packed, None) for _ in range(3)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(alone, y) for y in together)


def test_weight_packed_linear_rejects_bad_shapes_and_dtypes():
    with pytest.raises(RuntimeError, match=f"multiple of {block_n()}"):
        ops.convert_weight_packed(torch.randn(72, 64))
    packed = ops.convert_weight_packed(torch.randn(64, 64))
    with pytest.raises(RuntimeError, match="K=48"):
        ops.weight_packed_linear(torch.randn(3, 48), packed, None)
    with pytest.raises(RuntimeError, match="bias has 63 values"):
        ops.weight_packed_linear(torch.randn(3, 64), packed, torch.randn(63))
    with pytest.raises(RuntimeError, match="bias is BFloat16"):
        ops.weight_packed_linear(torch.randn(3, 64), packed, torch.randn(64).bfloat16())
    with pytest.raises(RuntimeError, match="BFloat16 weight multiplies"):
        ops.weight_packed_linear(
            torch.randn(3, 64).half(), ops.convert_weight_packed(torch.randn(64, 64).bfloat16()), None
        )
