"""The sampler's row operations against plain torch: the top-k / top-p / min-p cut keeps exactly
the tokens a full sort keeps (minisgl sorts only each row's head), and the inverse-CDF draw
follows the row's probabilities, never picks a token of probability 0, and does not depend
on the other rows of its batch."""

from types import SimpleNamespace

import pytest
import torch

from minisgl.layers.sampler import (
    sample_per_request,
    top_k_top_p_min_p_renorm,
    top_k_top_p_min_p_sample,
)


def _full_sort_reference(probs, top_ks, top_ps, min_ps):
    """The rule as SGLang's torch fallback states it, over a whole sorted row."""
    sorted_probs, sorted_idx = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1])
    drop = rank[None, :] >= top_ks[:, None]
    drop |= sorted_probs.cumsum(dim=-1) - sorted_probs > top_ps[:, None]
    drop |= sorted_probs < sorted_probs[:, :1] * min_ps[:, None]
    drop[:, 0] = False
    filtered = torch.zeros_like(probs).scatter_(-1, sorted_idx, sorted_probs.masked_fill(drop, 0.0))
    return filtered / filtered.sum(dim=-1, keepdim=True)


def _info(bs, vocab, **columns):
    top_ks = columns.get("top_ks", torch.full((bs,), vocab))
    top_ps = columns.get("top_ps", torch.ones(bs))
    min_ps = columns.get("min_ps", torch.zeros(bs))
    return SimpleNamespace(
        top_ks=top_ks,
        top_ps=top_ps,
        min_ps=min_ps,
        need_top_k_sampling=bool((top_ks < vocab).any()),
        need_top_p_sampling=bool((top_ps < 1).any()),
        need_min_p_sampling=bool((min_ps > 0).any()),
        generators=[None] * bs,
    )


@pytest.mark.parametrize("scale", [0.3, 2.0, 8.0])  # flat rows make the head grow to a whole sort
def test_cut_keeps_what_a_full_sort_keeps(scale):
    torch.manual_seed(0)
    bs, vocab = 12, 5000
    probs = torch.softmax(torch.randn(bs, vocab) * scale, dim=-1)
    # Each row its own parameters, as a batch of different requests has.
    info = _info(
        bs,
        vocab,
        top_ks=torch.tensor([vocab, 1, 7, 300, vocab, vocab, 50, vocab, vocab, 2, vocab, 4000]),
        top_ps=torch.tensor([0.95, 1.0, 0.5, 0.99, 1.0, 0.999, 0.9, 1.0, 0.3, 1.0, 0.999, 0.9]),
        min_ps=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.0, 0.1, 0.5, 0.0, 0.0, 0.001, 0.0]),
    )
    ours = top_k_top_p_min_p_renorm(probs, info)
    reference = _full_sort_reference(probs, info.top_ks, info.top_ps, info.min_ps)
    assert torch.equal(ours > 0, reference > 0)
    torch.testing.assert_close(ours, reference)


def test_draws_follow_the_cut_distribution():
    # 4,000 seeded draws of one row: each kept token within 4 sigma of its renormalized mass,
    # and no token outside the top-p set, or of probability 0, ever drawn.
    probs = torch.tensor([[0.4, 0.0, 0.25, 0.2, 0.0, 0.1, 0.05]])
    info = _info(1, 7, top_ps=torch.tensor([0.8]))
    kept = _full_sort_reference(probs, info.top_ks, info.top_ps, info.min_ps)[0]
    counts = torch.zeros(7)
    for seed in range(4000):
        info.generators = [torch.Generator().manual_seed(seed)]
        counts[top_k_top_p_min_p_sample(probs, info)[0]] += 1
    assert counts[kept == 0].sum() == 0
    for token in torch.nonzero(kept).flatten().tolist():
        p = kept[token].item()
        assert abs(counts[token].item() - 4000 * p) <= 4 * (4000 * p * (1 - p)) ** 0.5 + 1, (token, counts)


def test_a_draw_does_not_depend_on_the_other_rows():
    torch.manual_seed(1)
    probs = torch.softmax(torch.randn(6, 300), dim=-1)
    alone = [sample_per_request(probs[i : i + 1], [torch.Generator().manual_seed(i)])[0] for i in range(6)]
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    gens[3] = None  # a greedy row in the batch takes the argmax and no random draw
    batched = sample_per_request(probs, gens)
    assert batched[3] == probs[3].argmax()
    assert all(batched[i] == alone[i] for i in (0, 1, 2, 4, 5))


def test_the_last_token_with_mass_bounds_a_draw(monkeypatch):
    # A uniform that rounds u * total up to total must not land on the zero tail after the cut.
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: torch.ones(1))  # the largest draw, rounded up
    assert sample_per_request(torch.tensor([[0.7, 0.3, 0.0, 0.0]]), [torch.Generator()])[0] == 1


def test_rows_with_and_without_a_cut_share_a_batch():
    # A temperature-only row beside top-p and greedy rows: each draws what it draws alone.
    torch.manual_seed(2)
    vocab = 2000
    probs = torch.softmax(torch.randn(4, vocab) * 3, dim=-1)
    columns = dict(top_ks=torch.tensor([vocab, vocab, 1, 40]), top_ps=torch.tensor([1.0, 0.9, 1.0, 1.0]))
    info = _info(4, vocab, **columns)
    info.generators = [torch.Generator().manual_seed(i) for i in range(4)]
    info.generators[2] = None  # the greedy row
    batched = top_k_top_p_min_p_sample(probs, info)
    for row in range(4):
        alone = _info(1, vocab, **{name: column[row : row + 1] for name, column in columns.items()})
        alone.generators = [None if row == 2 else torch.Generator().manual_seed(row)]
        assert batched[row] == top_k_top_p_min_p_sample(probs[row : row + 1], alone)[0]
    assert batched[2] == probs[2].argmax()
