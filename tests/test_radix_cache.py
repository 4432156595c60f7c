"""RadixCache and the scheduling built on it: prefix sharing, eviction, chunked prefill, LPM."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl import tracing
from minisgl.entrypoints.engine import Engine
from minisgl.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from minisgl.mem_cache.memory_pool import ReqToTokenPool
from minisgl.mem_cache.radix_cache import RadixCache
from tests._models import tiny_model_dir

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def _cache(page_size: int, size: int = 64) -> RadixCache:
    alloc_cls = TokenToKVPoolAllocator if page_size == 1 else PagedTokenToKVPoolAllocator
    args = (size, "cpu") if page_size == 1 else (size, page_size, "cpu")
    return RadixCache(ReqToTokenPool(4, 32, "cpu"), alloc_cls(*args), page_size)


@pytest.mark.parametrize("page_size", [1, 4])
def test_insert_match_split_evict(page_size):
    cache = _cache(page_size)
    alloc = cache.token_to_kv_pool_allocator
    a = alloc.alloc(8)
    assert cache.insert(list(range(8)), a) == 0
    b = alloc.alloc(8)
    # Shares the first 4 tokens: those are already cached, so 4 of b's slots are duplicates.
    assert cache.insert([0, 1, 2, 3, 9, 9, 9, 9], b) == 4
    alloc.free(b[:4])
    value, node = cache.match_prefix([0, 1, 2, 3, 9, 9, 9, 9, 7])
    assert torch.equal(value, torch.cat([a[:4], b[4:]]))
    assert cache.total_size() == 12 and cache.evictable_size() == 12
    cache.inc_lock_ref(node)
    assert cache.protected_size() == 8
    # Only the unlocked leaf (tokens 4..7 of a) can go.
    assert cache.evict(100) == 4
    assert cache.match_prefix(list(range(8)))[0].numel() == 4
    cache.dec_lock_ref(node)
    assert cache.flush() and alloc.available_size() == 64


def test_page_aligned_matching():
    cache = _cache(4)
    slots = cache.token_to_kv_pool_allocator.alloc(8)
    cache.insert(list(range(8)), slots)
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 9])[0].numel() == 4  # 6 matching tokens -> one page


def _extend_lens(events):
    return [e for e in events if e["event"] == "ForwardBatch.init_new" and e.get("forward_mode") == "EXTEND"]


def test_shared_prefix_is_computed_once_and_outputs_match(tiny_llama):
    prefix = [(7 * i) % 500 + 3 for i in range(200)]
    prompts = [prefix + [10 + i, 20 + i] for i in range(8)]
    cached = Engine(model_path=tiny_llama, max_total_tokens=4096)
    uncached = Engine(model_path=tiny_llama, max_total_tokens=4096, disable_radix_cache=True)
    with tracing.record() as events:
        got = cached.generate(input_ids=prompts, sampling_params=GREEDY)
    want = uncached.generate(input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    cached_tokens = [o["meta_info"]["cached_tokens"] for o in got]
    assert cached_tokens[0] == 0 and all(c >= 200 for c in cached_tokens[1:])
    # The prefix ran once: the first prefill had 202 tokens, every later one only what was new.
    stats = cached.get_server_info()
    assert stats["hit_rate"] > 0.85
    computed = sum(len(p) - c for p, c in zip(prompts, cached_tokens))
    assert computed == 202 + 7 * 2
    assert [o["meta_info"]["cached_tokens"] for o in want] == [0] * 8
    assert len(_extend_lens(events)) >= 2


def test_side_outputs_through_a_shared_prefix():
    """Routed experts of tokens whose KV came from another request's prefill are still right."""
    path = tiny_model_dir("qwen3_moe")
    engine = Engine(model_path=path, max_total_tokens=1024, enable_return_routed_experts=True)
    prefix = list(range(40, 80))
    first = engine.generate(input_ids=prefix + [5], sampling_params=GREEDY, return_routed_experts=True)
    second = engine.generate(input_ids=prefix + [6, 7], sampling_params=GREEDY, return_routed_experts=True)
    assert second["meta_info"]["cached_tokens"] >= 40
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for ids, out in ((prefix + [5], first), (prefix + [6, 7], second)):
        full = ids + out["output_ids"]
        with torch.no_grad():
            router_logits = hf(torch.tensor([full]), output_router_logits=True).router_logits
        got = out["meta_info"]["routed_experts"]
        for layer, logits in enumerate(router_logits):
            want = logits[: len(full) - 1].topk(2, dim=-1).indices.sort(dim=-1).values
            assert torch.equal(got[:, layer].long().sort(dim=-1).values, want)


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunked_prefill_matches_whole_prefill(tiny_llama, page_size):
    prompts = [list(range(3, 3 + n)) for n in (70, 5, 33)]
    whole = Engine(model_path=tiny_llama, max_total_tokens=2048, page_size=page_size, disable_radix_cache=True)
    chunked = Engine(model_path=tiny_llama, max_total_tokens=2048, page_size=page_size, chunked_prefill_size=16)
    want = whole.generate(input_ids=prompts, sampling_params=GREEDY)
    with tracing.record() as events:
        got = chunked.generate(input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    extend_tokens = _extend_lens(events)
    assert len(extend_tokens) >= 70 // 16  # the long prompt took several rounds
    assert chunked.flush_cache()
    assert chunked.scheduler.token_to_kv_pool_allocator.available_size() == 2048


def test_lpm_policy_same_outputs(tiny_llama):
    prefix = list(range(100, 160))
    prompts = [[1, 2, 3], prefix + [4], [5, 6], prefix + [7, 8]]
    fcfs = Engine(model_path=tiny_llama, max_total_tokens=2048)
    lpm = Engine(model_path=tiny_llama, max_total_tokens=2048, schedule_policy="lpm")
    fcfs.generate(input_ids=prefix + [9], sampling_params=GREEDY)
    lpm.generate(input_ids=prefix + [9], sampling_params=GREEDY)
    a = fcfs.generate(input_ids=prompts, sampling_params=GREEDY)
    b = lpm.generate(input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in a] == [o["output_ids"] for o in b]
    with pytest.raises(ValueError, match="schedule_policy"):
        Engine(model_path=tiny_llama, schedule_policy="random")


def test_eviction_under_pressure_keeps_results(tiny_llama):
    prompts = [[i % 7 + 1] * 3 + list(range(10 * i, 10 * i + 30)) for i in range(12)]
    small = Engine(model_path=tiny_llama, max_total_tokens=128)
    big = Engine(model_path=tiny_llama, max_total_tokens=4096, disable_radix_cache=True)
    got = small.generate(input_ids=prompts, sampling_params=GREEDY)
    want = big.generate(input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    cache = small.scheduler.tree_cache
    assert small.scheduler.token_to_kv_pool_allocator.available_size() + cache.total_size() == 128
