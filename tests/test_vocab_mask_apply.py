"""The grammar mask's cost-saving parts against plain torch: the bitmask buffer reused from step to
step (constrained/xgrammar_backend.py) and the CPU kernel that applies it (kernels/cpu/sampling.cpp)."""

import pytest
import torch
import xgrammar as xgr

from minisgl.constrained.xgrammar_backend import XGrammarGrammar
from minisgl.kernels.cpu import is_available


def reference(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bits = (mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # bit j of word w: token 32 w + j
    return logits.masked_fill(~bits.bool().flatten(1)[:, : logits.shape[1]], float("-inf"))


@pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1000, 1024])  # a last word that is partly past the vocabulary, and none
def test_apply_token_bitmask_cpu_matches_torch(dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    mask = torch.randint(-(2**31), 2**31 - 1, (5, words), generator=g, dtype=torch.int32)
    mask[1] = -1  # a free row: every word skipped
    mask[2] = 0  # nothing allowed
    mask[3, ::2] = -1  # whole words allowed and random ones, alternating
    logits = torch.randn(5, vocab, generator=g).to(dtype)
    ours = logits.clone()
    torch.ops.minisgl_kernel.apply_token_bitmask_cpu(ours, mask)
    assert torch.equal(ours, reference(logits, mask))
    assert torch.equal(ours[1], logits[1]) and torch.isinf(ours[2]).all()
    with pytest.raises(RuntimeError, match="does not cover"):
        torch.ops.minisgl_kernel.apply_token_bitmask_cpu(ours, mask[:, :-1].contiguous())


def test_vocab_mask_buffer_is_reused_and_reset_every_step(monkeypatch):
    monkeypatch.setattr(XGrammarGrammar, "_bitmask", None)
    grammar = XGrammarGrammar.__new__(XGrammarGrammar)  # the mask methods use no matcher
    first = grammar.allocate_vocab_mask(1000, 4, "cpu")
    assert first.shape == (4, 32) and (first == -1).all()
    first.zero_()  # as a step's fills might leave it
    second = grammar.allocate_vocab_mask(1000, 3, "cpu")
    assert second.data_ptr() == first.data_ptr() and (second == -1).all()  # the same memory, all allowed again
    grown = grammar.allocate_vocab_mask(1000, 9, "cpu")
    assert grown.shape == (9, 32) and (grown == -1).all()
    assert grammar.allocate_vocab_mask(2000, 2, "cpu").shape == (2, xgr.get_bitmask_shape(1, 2000)[1])
