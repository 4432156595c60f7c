"""fused_experts_cpu (minisgl/kernels/cpu/moe.cpp), the C++ fused MoE for bf16 experts packed for the
matrix engines, against a float32 loop over experts (test_fused_moe.py's reference).

It runs where the CPU has vdpbf16ps (avx512_bf16) and takes AMX's brgemm where blocks average more
than 4 rows and the CPU has amx_bf16; elsewhere these tests skip and name the missing feature.
"""

import pytest
import torch

from minisgl.kernels.cpu import is_available
from minisgl.kernels.cpu.features import cpu_features
from tests.kernels.test_fused_moe import fused_moe_ref, make_moe_case

pytestmark = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")
ops = torch.ops.minisgl_kernel


def needs(feature: str) -> None:
    if feature not in cpu_features():
        pytest.skip(f"needs {feature}; this CPU has {sorted(cpu_features())}")


def run_fused(case, ids_dtype=torch.int64):
    pack = ops.convert_weight_packed_vnni
    return ops.fused_experts_cpu(
        case["hidden_states"], pack(case["w1"]), pack(case["w2"]), case["topk_weights"], case["topk_ids"].to(ids_dtype)
    )


@pytest.mark.parametrize(
    "num_tokens, hidden, intermediate, num_experts, top_k",
    [
        (0, 64, 32, 4, 2),  # an empty batch
        (1, 64, 32, 4, 2),  # one decode token: two experts of one row each, the others idle
        (5, 96, 64, 6, 2),  # H = 96: three panels of the second GEMM
        (9, 64, 64, 3, 3),  # top_k = num_experts: every token in every expert
        (100, 64, 32, 2, 2),  # 100 rows per expert: several blocks of 32 (and a remainder) per expert
        (70, 128, 96, 8, 4),  # I = 96: three gate/up panel pairs
    ],
)
def test_fused_experts_cpu_matches_float32_reference(num_tokens, hidden, intermediate, num_experts, top_k):
    needs("avx512_bf16")
    case = make_moe_case(num_tokens, hidden, intermediate, num_experts, top_k, torch.bfloat16, seed=num_tokens + hidden)
    out = run_fused(case)
    assert out.shape == (num_tokens, hidden) and out.dtype == torch.bfloat16
    # bf16 products summed in float32, silu(gate) * up rounded once, the k outputs summed in float32
    torch.testing.assert_close(out.float(), fused_moe_ref(**case), atol=1.5e-2, rtol=1.5e-2)
    assert torch.equal(run_fused(case, torch.int32), out)  # Triton's int32 ids route the same way


def test_fused_experts_cpu_on_amx_tiles():
    """200 tokens over 4 experts average about 25 rows a block: brgemm's side of can_use_brgemm."""
    needs("amx_bf16")
    case = make_moe_case(200, 64, 64, 4, 2, torch.bfloat16, seed=7)
    torch.testing.assert_close(run_fused(case).float(), fused_moe_ref(**case), atol=1.5e-2, rtol=1.5e-2)


def test_fused_experts_cpu_refuses_what_it_cannot_route_or_read():
    needs("avx512_bf16")
    case = make_moe_case(3, 64, 32, 4, 2, torch.bfloat16, seed=1)
    bad = dict(case, topk_ids=torch.tensor([[0, 1], [2, 4], [1, 3]]))  # expert 4 of 4
    with pytest.raises(RuntimeError, match=r"expert 4, outside \[0, 4\)"):
        run_fused(bad)
    pack = ops.convert_weight_packed_vnni
    with pytest.raises(RuntimeError, match="convert_weight_packed_vnni"):  # the stack left unpacked
        ops.fused_experts_cpu(
            case["hidden_states"], case["w1"], pack(case["w2"]), case["topk_weights"], case["topk_ids"]
        )
    with pytest.raises(RuntimeError, match="hidden_states must be"):
        ops.fused_experts_cpu(
            case["hidden_states"].float(), pack(case["w1"]), pack(case["w2"]), case["topk_weights"], case["topk_ids"]
        )
    odd = make_moe_case(3, 64, 48, 4, 2, torch.bfloat16, seed=1)  # I = 48: a gate panel without its up panel
    with pytest.raises(RuntimeError, match="I a multiple of 32"):
        run_fused(odd)


def test_stacked_vnni_packing_is_each_experts_own():
    w = torch.randn(3, 64, 40).bfloat16()
    stacked = ops.convert_weight_packed_vnni(w)
    assert stacked.shape == (3, 2, 20, 32, 2)
    for e in range(3):
        assert torch.equal(stacked[e], ops.convert_weight_packed_vnni(w[e]))
