"""Weights on huge pages (minisgl/huge_pages.py): after the move every large weight lives in one
2 MiB-aligned arena, with its values, its ties and its views intact, and the old memory is freed."""

import gc
import pathlib

import pytest
import torch
from torch import nn

from minisgl import huge_pages
from minisgl.entrypoints.engine import Engine
from minisgl.huge_pages import HUGE_PAGE, MIN_BYTES, move_to_huge_pages, smaps_rollup_bytes


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Module()
    m.embed = nn.Embedding(300, 64)  # 75 KiB: moved
    m.head = nn.Module()
    m.head.weight = m.embed.weight  # tied: one parameter, two owners
    m.norm = nn.LayerNorm(64)  # a few hundred bytes: stays
    m.proj = nn.Linear(64, 512, bias=False)
    stack = torch.randn(1, 8, 64, 64)
    m.proj.packed = stack.squeeze(0)  # a view: its base holds the memory too (as a packed 2-D weight's does)
    m.proj.shards = [torch.randn(128, 256), torch.randn(256, 128)]  # tensors in a list attribute
    m.register_buffer("table", torch.randn(100, 200))
    return m


def _assert_in_one_arena(tensors: list[torch.Tensor], size: int) -> None:
    """Each weight on a storage of its own, as before the move, all inside one span of memory
    that starts on a 2 MiB boundary."""
    starts = [t.untyped_storage().data_ptr() for t in tensors]
    ends = [t.untyped_storage().data_ptr() + t.untyped_storage().nbytes() for t in tensors]
    assert min(starts) % HUGE_PAGE == 0 and max(ends) - min(starts) <= size


def test_large_weights_move_into_one_aligned_arena_with_values_ties_and_views_kept():
    m = _model()
    before = {name: t.clone() for name, t in m.state_dict().items()}
    packed, shards, norm_ptr = m.proj.packed.clone(), [s.clone() for s in m.proj.shards], m.norm.weight.data_ptr()
    moved = move_to_huge_pages(m)

    large = [m.embed.weight, m.proj.weight, m.proj.packed, *m.proj.shards, m.table]
    assert moved >= sum(t.nbytes for t in large)
    _assert_in_one_arena(large, moved)
    assert len({t.untyped_storage().data_ptr() for t in large}) == len(large)  # six weights, six storages
    assert m.norm.weight.data_ptr() == norm_ptr and m.norm.weight.nbytes < MIN_BYTES  # small: left alone
    assert m.head.weight is m.embed.weight  # the tie is the same parameter still
    assert m.proj.packed._base.untyped_storage().data_ptr() == m.proj.packed.untyped_storage().data_ptr()
    for name, t in m.state_dict().items():
        assert torch.equal(t, before[name]), name
    assert torch.equal(m.proj.packed, packed) and all(torch.equal(a, b) for a, b in zip(m.proj.shards, shards))
    assert all(t.data_ptr() % huge_pages.ALIGN == 0 for t in large)
    # Still ordinary parameters: a forward works, and no tensor was replaced, only re-pointed.
    assert isinstance(m.proj.weight, nn.Parameter) and m.proj(torch.randn(2, 64)).shape == (2, 512)


@pytest.mark.skipif(not pathlib.Path("/proc/self/smaps_rollup").exists(), reason="needs Linux's smaps_rollup")
def test_the_old_memory_is_freed_views_included():
    # 96 MiB of weights, a third of it a view whose base is the only other holder of its memory
    # (the packed LM head's case): were any old copy kept, RSS would rise by its size.
    m = nn.Module()
    m.a = nn.Parameter(torch.ones(8 << 20), requires_grad=False)
    m.b = torch.ones(1, 8 << 20).squeeze(0)
    m.c = [torch.ones(4 << 20), torch.ones(4 << 20)]
    gc.collect()
    before = smaps_rollup_bytes("Rss")
    assert move_to_huge_pages(m) >= 96 << 20
    gc.collect()
    assert smaps_rollup_bytes("Rss") - before < 16 << 20
    _assert_in_one_arena([m.a, m.b, m.b._base, *m.c], 96 << 20)


def test_an_engine_on_a_cpu_serves_from_the_arena(tiny_llama):
    engine = Engine(model_path=tiny_llama, max_total_tokens=512)
    model = engine.scheduler.tp_worker.model_runner.model
    large = [t for t in huge_pages._tensors(model) if t.is_cpu and t.untyped_storage().nbytes() >= MIN_BYTES]
    assert len(large) >= 4
    _assert_in_one_arena(
        large,
        sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in large}.values()) + 64 * len(large),
    )
    out = engine.generate(
        input_ids=[[5, 6, 7, 8]], sampling_params={"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
    )
    assert len(out[0]["output_ids"]) == 4
