"""fused_experts_int8_cpu (minisgl/kernels/cpu/moe_int8.cpp), the fused MoE for W8A8-int8 experts,
against the W8A8 loop over experts it replaces (fused_experts_native over the int8 GEMM) and against
a float32 loop on the unquantized experts. It runs where the CPU has avx512_vnni; elsewhere the
W8A8 method keeps the loop and these tests skip, naming the feature."""

import pytest
import torch
from torch import nn

from minisgl.kernels.cpu import is_available
from minisgl.kernels.cpu.features import cpu_features
from minisgl.layers.quantization import w8a8_int8
from minisgl.layers.quantization.w8a8_int8 import W8A8Int8Config, W8A8Int8MoEMethod
from tests.kernels.test_fused_moe import fused_moe_ref, make_moe_case

pytestmark = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")


def w8a8_moe(case, num_experts, hidden, intermediate, dtype) -> tuple[nn.Module, W8A8Int8MoEMethod]:
    """A W8A8 MoE layer quantized from the case's float experts, as --quantization w8a8_int8 does."""
    layer, method = nn.Module(), W8A8Int8MoEMethod(W8A8Int8Config(is_checkpoint_int8_serialized=False))
    method.create_weights(layer, num_experts, hidden, intermediate, dtype, weight_loader=None)
    layer.w13_weight.data.copy_(case["w1"])
    layer.w2_weight.data.copy_(case["w2"])
    method.process_weights_after_loading(layer)
    return layer, method


@pytest.mark.parametrize(
    "num_tokens, hidden, intermediate, num_experts, top_k",
    [(0, 64, 32, 4, 2), (1, 64, 32, 4, 2), (5, 96, 64, 6, 2), (100, 64, 32, 2, 2), (70, 128, 96, 8, 4)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("brgemm", ["0", "1"])  # 1: blocks averaging over 4 rows on oneDNN's brgemm (AMX-int8's path)
def test_fused_int8_experts_match_the_w8a8_loop(
    num_tokens, hidden, intermediate, num_experts, top_k, dtype, brgemm, monkeypatch
):
    if "avx512_vnni" not in cpu_features():
        pytest.skip(f"needs avx512_vnni; this CPU has {sorted(cpu_features())}")
    monkeypatch.setenv("MINISGL_BRGEMM", brgemm)
    case = make_moe_case(num_tokens, hidden, intermediate, num_experts, top_k, dtype, seed=num_tokens + hidden)
    args = (case["hidden_states"], case["topk_weights"], case["topk_ids"])
    layer, method = w8a8_moe(case, num_experts, hidden, intermediate, dtype)
    assert isinstance(layer.w13_int8, tuple)  # stacks for the fused kernel
    fused = method.apply(layer, *args)
    monkeypatch.setattr(w8a8_int8, "_fused_experts_int8_runs", lambda *a: False)
    layer, method = w8a8_moe(case, num_experts, hidden, intermediate, dtype)
    assert isinstance(layer.w13_int8, list)  # (weight, scales) pairs for the loop
    loop = method.apply(layer, *args)
    assert fused.shape == loop.shape and fused.dtype == dtype
    # The same int8 sums and scales: float32 agrees to its last bits; bf16 differs where the loop
    # rounds each GEMM's output to bf16 and the fused kernel keeps float32.
    tol = 1e-5 if dtype == torch.float32 else 6e-2
    torch.testing.assert_close(fused.float(), loop.float(), atol=tol, rtol=tol)
    if num_tokens:  # int8 on both sides of two GEMMs: a few percent of the output's scale
        ref = fused_moe_ref(**case)
        assert (fused.float() - ref).abs().max() <= 0.02 * ref.abs().max() + 2e-2


def test_fused_int8_experts_refuse_an_unpacked_stack():
    if "avx512_vnni" not in cpu_features():
        pytest.skip(f"needs avx512_vnni; this CPU has {sorted(cpu_features())}")
    case = make_moe_case(3, 64, 32, 4, 2, torch.float32, seed=1)
    layer, _ = w8a8_moe(case, 4, 64, 32, torch.float32)
    (w13, s13), (w2, s2) = layer.w13_int8, layer.w2_int8
    with pytest.raises(RuntimeError, match="packed by convert_weight_packed_int8_vnni"):
        torch.ops.minisgl_kernel.fused_experts_int8_cpu(
            case["hidden_states"], case["w1"].to(torch.int8), s13, w2, s2, case["topk_weights"], case["topk_ids"]
        )
    with pytest.raises(RuntimeError, match="scales must be float32"):
        torch.ops.minisgl_kernel.fused_experts_int8_cpu(
            case["hidden_states"], w13, s13[:, :3].contiguous(), w2, s2, case["topk_weights"], case["topk_ids"]
        )
