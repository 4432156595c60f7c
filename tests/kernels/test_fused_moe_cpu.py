"""fused_experts_cpu (minisgl/kernels/cpu/moe.cpp), the C++ fused MoE, against a float32 loop over
experts (test_fused_moe.py's reference), in both layouts its experts may come in:

- float panels (convert_weight_packed) in float32, bf16 or fp16: FMA, on every CPU the kernels build on;
- bf16 in the matrix engines' VNNI layout (convert_weight_packed_vnni): vdpbf16ps where the CPU has
  avx512_bf16, AMX's brgemm where blocks average more than 4 rows and it has amx_bf16 (or
  MINISGL_BRGEMM=1 is set). Elsewhere those tests skip and name the missing feature.
"""

import pytest
import torch

from minisgl.kernels.cpu import is_available, packed_gemm_block_n
from minisgl.kernels.cpu.features import cpu_features
from tests.kernels.test_cpu_matrix_engines import force_brgemm
from tests.kernels.test_fused_moe import fused_moe_ref, make_moe_case

pytestmark = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")
ops = torch.ops.minisgl_kernel
# float32 products summed in float32 agree closely; bf16 and fp16 inputs are rounded before they multiply
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1.5e-2, torch.float16: 3e-3}


def needs(feature: str) -> None:
    if feature not in cpu_features():
        pytest.skip(f"needs {feature}; this CPU has {sorted(cpu_features())}")


def run_fused(case, layout, ids_dtype=torch.int64, weight_dtype=None):
    pack = ops.convert_weight_packed_vnni if layout == "vnni" else ops.convert_weight_packed
    w1, w2 = (case[w].to(weight_dtype or case[w].dtype) for w in ("w1", "w2"))
    return ops.fused_experts_cpu(
        case["hidden_states"], pack(w1), pack(w2), case["topk_weights"], case["topk_ids"].to(ids_dtype)
    )


# (T, H, I, E, k) in multiples of 32, so that both layouts (and AVX2's 16-column panels) take them.
SHAPES = [
    (0, 64, 32, 4, 2),  # an empty batch
    (1, 64, 32, 4, 2),  # one decode token: two experts of one row each, the others idle
    (5, 96, 64, 6, 2),  # H = 96: three panels of the second GEMM
    (9, 64, 64, 3, 3),  # top_k = num_experts: every token in every expert
    (100, 64, 32, 2, 2),  # 100 rows per expert: several blocks of 32 (and a remainder) per expert
    (70, 128, 96, 8, 4),  # I = 96: three gate/up panel pairs
]


@pytest.mark.parametrize("num_tokens, hidden, intermediate, num_experts, top_k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_experts_on_float_panels_match_float32_reference(
    num_tokens, hidden, intermediate, num_experts, top_k, dtype
):
    case = make_moe_case(num_tokens, hidden, intermediate, num_experts, top_k, dtype, seed=num_tokens + hidden)
    out = run_fused(case, "panels")
    assert out.shape == (num_tokens, hidden) and out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), fused_moe_ref(**case), atol=tol, rtol=tol)
    assert torch.equal(run_fused(case, "panels", torch.int32), out)  # Triton's int32 ids route the same way


def test_float32_experts_multiply_16_bit_activations():
    """A 16-bit model whose experts stayed float32 (as a dense layer's weight may): widened, not refused."""
    case = make_moe_case(7, 64, 32, 4, 2, torch.bfloat16, seed=3)
    torch.testing.assert_close(
        run_fused(case, "panels", weight_dtype=torch.float32).float(), fused_moe_ref(**case), atol=1.5e-2, rtol=1.5e-2
    )


@pytest.mark.parametrize("num_tokens, hidden, intermediate, num_experts, top_k", SHAPES)
def test_fused_experts_on_vnni_match_float32_reference(num_tokens, hidden, intermediate, num_experts, top_k):
    needs("avx512_bf16")
    case = make_moe_case(num_tokens, hidden, intermediate, num_experts, top_k, torch.bfloat16, seed=num_tokens + hidden)
    out = run_fused(case, "vnni")
    assert out.shape == (num_tokens, hidden) and out.dtype == torch.bfloat16
    # bf16 products summed in float32, silu(gate) * up rounded once to bf16, the k outputs summed in float32
    torch.testing.assert_close(out.float(), fused_moe_ref(**case), atol=1.5e-2, rtol=1.5e-2)


def test_fused_experts_on_brgemm(monkeypatch):
    """200 tokens over 4 experts average about 25 rows a block: brgemm's side of can_use_brgemm, AMX
    tiles where the CPU has amx_bf16, oneDNN's vdpbf16ps code elsewhere (MINISGL_BRGEMM=1)."""
    force_brgemm(monkeypatch, torch.bfloat16)
    case = make_moe_case(200, 64, 64, 4, 2, torch.bfloat16, seed=7)
    torch.testing.assert_close(run_fused(case, "vnni").float(), fused_moe_ref(**case), atol=1.5e-2, rtol=1.5e-2)


def test_fused_experts_refuse_what_they_cannot_route_or_read():
    case = make_moe_case(3, 64, 32, 4, 2, torch.float32, seed=1)
    bad = dict(case, topk_ids=torch.tensor([[0, 1], [2, 4], [1, 3]]))  # expert 4 of 4
    with pytest.raises(RuntimeError, match=r"expert 4, outside \[0, 4\)"):
        run_fused(bad, "panels")
    pack = ops.convert_weight_packed
    with pytest.raises(RuntimeError, match="packed whole"):  # the stack left as loaded
        ops.fused_experts_cpu(
            case["hidden_states"], case["w1"], pack(case["w2"]), case["topk_weights"], case["topk_ids"]
        )
    with pytest.raises(RuntimeError, match="Half experts multiply float32 or Half activations"):
        run_fused(case, "panels", weight_dtype=torch.float16)
    block_n = packed_gemm_block_n()
    odd = make_moe_case(3, 64, block_n + block_n // 2, 4, 2, torch.float32, seed=1)  # 2I packs, I does not
    with pytest.raises(RuntimeError, match="I a multiple of"):
        run_fused(odd, "panels")


def test_vnni_experts_refuse_other_activations():
    needs("avx512_bf16")
    case = make_moe_case(3, 64, 32, 4, 2, torch.bfloat16, seed=1)
    vnni = ops.convert_weight_packed_vnni
    with pytest.raises(RuntimeError, match="VNNI-packed experts are bf16 and multiply bf16 activations"):
        ops.fused_experts_cpu(
            case["hidden_states"].float(), vnni(case["w1"]), vnni(case["w2"]), case["topk_weights"], case["topk_ids"]
        )


@pytest.mark.parametrize("layout", ["vnni", "panels"])
def test_stacked_packing_is_each_experts_own(layout):
    pack = ops.convert_weight_packed_vnni if layout == "vnni" else ops.convert_weight_packed
    w = torch.randn(3, 64, 40).bfloat16()
    stacked = pack(w)
    assert stacked.dim() == (5 if layout == "vnni" else 4) and stacked.shape[0] == 3
    for e in range(3):
        assert torch.equal(stacked[e], pack(w[e]))
