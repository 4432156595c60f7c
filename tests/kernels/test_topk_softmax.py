"""topk_softmax_cpu (minisgl/kernels/cpu/topk.cpp), the MoE router's softmax top-k, against the torch
reference it replaces on CPUs (fused_topk_native: torch.softmax in float32, torch.topk, renormalized)."""

import pytest
import torch

from minisgl.kernels.cpu import is_available
from minisgl.layers.moe.topk import fused_topk_native

pytestmark = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("experts, top_k", [(4, 1), (8, 2), (60, 4), (128, 8)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_topk_softmax_matches_torch(dtype, experts, top_k, renormalize):
    torch.manual_seed(experts * 10 + top_k)
    logits = (torch.randn(37, experts) * 3).to(dtype)
    weights, ids = torch.ops.minisgl_kernel.topk_softmax_cpu(logits, top_k, renormalize)
    want_weights, want_ids = fused_topk_native(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)
    # The same experts, largest first; where probabilities tie (16-bit logits often do), torch.topk
    # picks any of the tied experts, the kernel the lowest id: then the chosen probabilities agree.
    probs = torch.softmax(logits.float(), dim=-1)
    assert torch.equal(probs.gather(1, ids), probs.gather(1, want_ids))
    assert all(len(set(row)) == top_k for row in ids.tolist())
    if dtype == torch.float32:
        assert torch.equal(ids, want_ids)


def test_a_tie_goes_to_the_lower_expert_and_rows_are_independent():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    weights, ids = torch.ops.minisgl_kernel.topk_softmax_cpu(logits, 2, True)
    assert ids.tolist() == [[1, 2], [0, 1]]
    assert weights.tolist() == [[0.5, 0.5], [0.5, 0.5]]
    alone = torch.ops.minisgl_kernel.topk_softmax_cpu(logits[1:], 2, True)
    assert torch.equal(alone[0], weights[1:]) and torch.equal(alone[1], ids[1:])


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(RuntimeError, match="topk=5 of 4 experts"):
        torch.ops.minisgl_kernel.topk_softmax_cpu(torch.zeros(2, 4), 5, True)
    with pytest.raises(RuntimeError, match=r"gating_output must be \[tokens, experts\]"):
        torch.ops.minisgl_kernel.topk_softmax_cpu(torch.zeros(2, 4, 1), 1, True)
