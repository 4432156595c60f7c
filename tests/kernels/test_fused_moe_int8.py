"""fused_experts_int8_cpu (minisgl/kernels/cpu/moe_int8.cpp), the fused MoE for W8A8-int8 experts,
against the W8A8 loop over experts it replaces (fused_experts_native over the int8 GEMM) and against
a float32 loop on the unquantized experts, in both int8 layouts: k-pairs for AVX2's vpmaddwd (any
CPU the kernels build on) and k-quads for vpdpbusd (where the CPU has avx512_vnni; elsewhere those
cases skip, naming the feature), the latter also with its blocks on oneDNN's brgemm (AMX-int8's path)."""

import pytest
import torch
from torch import nn

from minisgl.kernels.cpu import is_available
from minisgl.kernels.cpu.features import cpu_features
from minisgl.layers.quantization import int8_kernel, w8a8_int8
from minisgl.layers.quantization.w8a8_int8 import W8A8Int8Config, W8A8Int8MoEMethod
from tests.kernels.test_cpu_matrix_engines import force_brgemm
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


def use_layout(engine: str, monkeypatch) -> None:
    """Pack the W8A8 weights built after this for `engine`'s GEMM, as on a CPU whose best int8 engine it is."""
    if engine != "avx2" and engine not in cpu_features():
        pytest.skip(f"needs {engine}; this CPU has {sorted(cpu_features())}")
    monkeypatch.setattr(int8_kernel, "int8_gemm_engine", lambda: engine)


# Each layout, and the VNNI one with blocks averaging over 4 rows on oneDNN's brgemm (MINISGL_BRGEMM=1).
LAYOUTS = [("avx2", "0"), ("avx512_vnni", "0"), ("avx512_vnni", "1")]


@pytest.mark.parametrize(
    "num_tokens, hidden, intermediate, num_experts, top_k",
    [(0, 64, 32, 4, 2), (1, 64, 32, 4, 2), (5, 96, 64, 6, 2), (100, 64, 32, 2, 2), (70, 128, 96, 8, 4)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("engine, brgemm", LAYOUTS)
def test_fused_int8_experts_match_the_w8a8_loop(
    num_tokens, hidden, intermediate, num_experts, top_k, dtype, engine, brgemm, monkeypatch
):
    use_layout(engine, monkeypatch)
    if brgemm == "1":
        force_brgemm(monkeypatch, torch.int8)
    else:
        monkeypatch.setenv("MINISGL_BRGEMM", "0")
    case = make_moe_case(num_tokens, hidden, intermediate, num_experts, top_k, dtype, seed=num_tokens + hidden)
    args = (case["hidden_states"], case["topk_weights"], case["topk_ids"])
    layer, method = w8a8_moe(case, num_experts, hidden, intermediate, dtype)
    assert isinstance(layer.w13_int8, tuple)  # stacks for the fused kernel
    assert layer.w13_int8[0].shape[-1] == (64 if engine == "avx512_vnni" else 32)  # k-quads or k-pairs
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_layouts_give_the_same_outputs_bit_for_bit(dtype, monkeypatch):
    """vpmaddwd's and vpdpbusd's sums are the same integers, the activations quantize to the same
    values, and the epilogues do the same float32 operations in the same order."""
    use_layout("avx512_vnni", monkeypatch)
    case = make_moe_case(70, 128, 96, 8, 4, dtype, seed=5)
    args = (case["hidden_states"], case["topk_weights"], case["topk_ids"])
    outputs = []
    for engine in ("avx2", "avx512_vnni"):
        use_layout(engine, monkeypatch)
        layer, method = w8a8_moe(case, 8, 128, 96, dtype)
        outputs.append(method.apply(layer, *args))
    assert torch.equal(*outputs)


def test_fused_int8_experts_refuse_an_unpacked_stack(monkeypatch):
    use_layout("avx2", monkeypatch)  # a layout every CPU the kernels build on multiplies
    case = make_moe_case(3, 64, 32, 4, 2, torch.float32, seed=1)
    layer, _ = w8a8_moe(case, 4, 64, 32, torch.float32)
    (w13, s13), (w2, s2) = layer.w13_int8, layer.w2_int8
    fused = torch.ops.minisgl_kernel.fused_experts_int8_cpu
    route = (case["topk_weights"], case["topk_ids"])

    def vnni(stack):  # each expert packed in k-quads, as on an AVX512-VNNI CPU
        return torch.stack([torch.ops.minisgl_kernel.convert_weight_packed_int8_vnni(w) for w in stack.to(torch.int8)])

    with pytest.raises(RuntimeError, match="packed alike"):  # the stack left as loaded
        fused(case["hidden_states"], case["w1"].to(torch.int8), s13, w2, s2, *route)
    with pytest.raises(RuntimeError, match="packed alike"):  # w13 in k-pairs, w2 in k-quads
        fused(case["hidden_states"], w13, s13, vnni(case["w2"]), s2, *route)
    with pytest.raises(RuntimeError, match="scales must be float32"):
        fused(case["hidden_states"], w13, s13[:, :3].contiguous(), w2, s2, *route)
    if "avx512_vnni" not in cpu_features():  # k-quads are refused by the feature's name rather than run
        with pytest.raises(RuntimeError, match="need avx512_vnni"):
            fused(case["hidden_states"], vnni(case["w1"]), s13, vnni(case["w2"]), s2, *route)
