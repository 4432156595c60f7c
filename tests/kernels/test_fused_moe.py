"""Triton fused MoE against a per-expert loop in plain torch."""

import pytest
import torch
import torch.nn.functional as F

import minisgl  # noqa: F401  (sets TRITON_INTERPRET on CPU before any kernel is decorated)
from minisgl.layers.moe.fused_moe_triton.fused_moe import fused_moe, moe_align_block_size

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def make_moe_case(num_tokens, hidden, intermediate, num_experts, top_k, dtype, seed, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g)
    topk_weights, topk_ids = logits.softmax(-1).topk(top_k, dim=-1)
    return dict(
        hidden_states=torch.randn(num_tokens, hidden, generator=g).to(dtype).to(device),
        # Scaled so that activations stay O(1) through both GEMMs.
        w1=(torch.randn(num_experts, 2 * intermediate, hidden, generator=g) * hidden**-0.5).to(dtype).to(device),
        w2=(torch.randn(num_experts, hidden, intermediate, generator=g) * intermediate**-0.5).to(dtype).to(device),
        topk_weights=topk_weights.to(device),
        topk_ids=topk_ids.to(torch.int32).to(device),
    )


def fused_moe_ref(hidden_states, w1, w2, topk_weights, topk_ids):
    """Loop over experts: each runs its SiLU-gated MLP on the tokens routed to it, in fp32."""
    x = hidden_states.float()
    out = torch.zeros_like(x)
    intermediate = w2.shape[2]
    for e in range(w1.shape[0]):
        token, slot = (topk_ids == e).nonzero(as_tuple=True)
        h = x[token] @ w1[e].float().T  # [n, 2I]
        act = F.silu(h[:, :intermediate]) * h[:, intermediate:]
        y = act @ w2[e].float().T  # [n, H]
        out.index_add_(0, token, y * topk_weights[token, slot, None].float())
    return out


@pytest.mark.parametrize(
    "num_tokens, hidden, intermediate, num_experts, top_k, dtype",
    [
        (1, 32, 16, 4, 2, torch.float32),  # a single decode token
        (10, 48, 24, 8, 2, torch.float32),  # K = 48 and K = 24: neither a multiple of BLOCK_SIZE_K
        (100, 64, 32, 2, 2, torch.float32),  # 100 rows per expert: several M-blocks per expert
        (9, 40, 20, 3, 3, torch.float32),  # top_k = num_experts
        (7, 64, 48, 6, 3, torch.bfloat16),
        (5, 40, 72, 4, 1, torch.float16),  # 2I = 144: several N-blocks in the first GEMM
    ],
)
def test_fused_moe(num_tokens, hidden, intermediate, num_experts, top_k, dtype):
    case = make_moe_case(num_tokens, hidden, intermediate, num_experts, top_k, dtype, seed=num_tokens + hidden)
    out = fused_moe(**case)
    assert out.shape == case["hidden_states"].shape and out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), fused_moe_ref(**case), atol=tol, rtol=tol)


def test_moe_align_block_size():
    # Routed tokens (t * k + j) by expert: e0 <- 1, 2; e1 <- 3, 5; e2 <- 0, 4; e3 <- none.
    topk_ids = torch.tensor([[2, 0], [0, 1], [2, 1]], dtype=torch.int32, device=DEVICE)
    sorted_token_ids, expert_ids, num_tokens_post_padded = moe_align_block_size(topk_ids, block_size=4, num_experts=4)
    pad = 6  # = T * k, past the last routed token
    assert num_tokens_post_padded.tolist() == [12]
    assert sorted_token_ids[:12].tolist() == [1, 2, pad, pad, 3, 5, pad, pad, 0, 4, pad, pad]
    assert (sorted_token_ids[12:] == pad).all()
    assert expert_ids[:3].tolist() == [0, 1, 2]
    assert sorted_token_ids.dtype == expert_ids.dtype == torch.int32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("intermediate", [64, 40])  # 2I = 128 packs; 2I = 80 is no multiple of a panel
def test_cpu_moe_method_packs_every_expert(dtype, intermediate):
    """UnquantizedFusedMoEMethod on CPU: each stack of experts packed whole for fused_experts_cpu where
    I and H are multiples of its panels (the VNNI layout for bf16 on the matrix engines, else float
    panels), else each expert as a dense layer of its shape is, for the loop; no plain copy kept."""
    from torch import nn

    from minisgl.kernels.cpu import has_packed_gemm, packed_gemm_block_n
    from minisgl.kernels.cpu.features import vnni_gemm_engine
    from minisgl.layers.linear import pack_linear_weight
    from minisgl.layers.quantization.unquant import UnquantizedFusedMoEMethod

    case = make_moe_case(12, 96, intermediate, 6, 2, dtype, seed=intermediate, device="cpu")
    layer, method = nn.Module(), UnquantizedFusedMoEMethod()
    method.create_weights(layer, 6, 96, intermediate, dtype, weight_loader=None)
    layer.w13_weight.data.copy_(case["w1"])
    layer.w2_weight.data.copy_(case["w2"])
    method.process_weights_after_loading(layer)
    assert not hasattr(layer, "w13_weight") and not hasattr(layer, "w2_weight")  # no second copy kept
    vnni = dtype == torch.bfloat16 and vnni_gemm_engine(dtype) is not None
    fused = has_packed_gemm() and intermediate % (32 if vnni else packed_gemm_block_n()) == 0
    assert isinstance(layer.w13_packed, torch.Tensor) == fused
    ops = torch.ops.minisgl_kernel
    for packed, w in zip([*layer.w13_packed, *layer.w2_packed], [*case["w1"], *case["w2"]]):
        if fused:  # a stack's experts are each one's own layout
            assert torch.equal(packed, ops.convert_weight_packed_vnni(w) if vnni else ops.convert_weight_packed(w))
        else:  # the layout a dense layer of this shape and dtype gets here
            expected = pack_linear_weight(w)
            assert packed.is_mkldnn == expected.is_mkldnn and packed.shape == expected.shape
    out = method.apply(layer, case["hidden_states"], case["topk_weights"], case["topk_ids"])
    assert out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), fused_moe_ref(**case), atol=tol, rtol=tol)
