"""KV pressure: many requests on a tiny pool, with the radix cache on and off, page_size 1 and 16.

Every request completes with the greedy output it has alone, decode has to retract, and
after every scheduler step each KV slot is accounted for exactly once:

    available + evictable + protected (locked by the tree) + owned by requests == total

(the issue's ``available + evictable + locked == total``, with the slots a running request
holds beyond its cached prefix counted as its own). After flush_cache the pool is whole.
"""

import random

import pytest

from minisgl.entrypoints.engine import Engine
from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.managers.scheduler import Scheduler
from minisgl.sampling.sampling_params import SamplingParams

GREEDY = {"temperature": 0, "ignore_eos": True}
POOL = 304  # 19 pages of 16


def live_reqs(sched: Scheduler) -> list:
    """Every request that may hold KV after a step: running, waiting (a chunked or retracted
    one), or prefilled this step and not yet merged into the running batch."""
    reqs = sched.running_batch.reqs + sched.waiting_queue
    if sched.last_batch is not None and sched.last_batch is not sched.running_batch:
        reqs = reqs + sched.last_batch.reqs
    # Overlap loop: requests of a launched batch (a chunk, one finished but still read by it).
    in_flight = [r for b, _ in sched.result_queue for r in b.reqs] + [r for _, r, _ in sched.deferred_releases]
    seen = {id(r) for r in reqs}
    reqs = reqs + list({id(r): r for r in in_flight if id(r) not in seen}.values())
    return [r for r in reqs if r.req_pool_idx is not None]


def assert_kv_accounted(sched: Scheduler) -> None:
    allocator, cache = sched.token_to_kv_pool_allocator, sched.tree_cache
    page = allocator.page_size
    reqs = live_reqs(sched)
    assert len({id(r) for r in reqs}) == len(reqs), "a request is in two places"
    # A request owns whole pages from the end of its cached (page-aligned) prefix to its KV's end.
    owned = sum(-(-r.kv_len // page) * page - len(r.prefix_indices) for r in reqs)
    total = sched.worker_info.max_total_num_tokens
    assert allocator.available_size() + cache.evictable_size() + cache.protected_size() + owned == total
    assert cache.evictable_size() + cache.protected_size() == cache.total_size()
    locked = sum(len(n.key) for n in cache._all_nodes() if n.lock_ref > 0)
    assert cache.protected_size() == locked
    assert sched.req_to_token_pool.available_size() + len(reqs) == sched.req_to_token_pool.size


def assert_pool_whole(sched: Scheduler) -> None:
    assert sched.is_idle() and not live_reqs(sched)
    assert sched.tree_cache.protected_size() == 0
    assert sched.flush_cache()
    assert sched.token_to_kv_pool_allocator.available_size() == sched.worker_info.max_total_num_tokens
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size


def run_checked(sched: Scheduler, reqs: list[TokenizedGenerateReqInput]) -> dict[str, dict]:
    """Drive the scheduler step by step, checking the accounting after every step."""
    for req in reqs:
        sched.handle_generate_request(req)
    output_ids = {r.rid: [] for r in reqs}
    done: dict[str, dict] = {}
    for _ in range(20_000):
        for out in sched.step():
            output_ids[out.rid] += out.new_output_ids
            if out.finished:
                done[out.rid] = {"output_ids": output_ids[out.rid], "meta_info": out.meta_info}
        assert_kv_accounted(sched)
        if len(done) == len(reqs):
            return done
    raise AssertionError("the requests did not finish")


def make_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1, 500) for _ in range(40)]
    prompts = []
    for i in range(12):
        tail = [rng.randrange(1, 500) for _ in range(rng.randrange(3, 30))]
        # Half share a 40-token head (cache hits, and prefixes locked under pressure).
        prompts.append(shared + tail if i % 2 else tail)
    prompts += [prompts[1]] * 2  # identical prompts too
    return prompts


@pytest.fixture(scope="module")
def solo_outputs(tiny_llama):
    engine = Engine(model_path=tiny_llama, max_total_tokens=4096, disable_radix_cache=True)
    return [
        engine.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 32})["output_ids"]
        for p in make_prompts()
    ]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("disable_radix_cache", [False, True], ids=["radix", "no-radix"])
def test_kv_pressure_completes_exactly_and_keeps_the_pool_accounted(
    tiny_llama, solo_outputs, page_size, disable_radix_cache
):
    engine = Engine(
        model_path=tiny_llama, max_total_tokens=POOL, page_size=page_size, disable_radix_cache=disable_radix_cache
    )
    sched = engine.scheduler
    reqs = [
        TokenizedGenerateReqInput(
            rid=f"r{i}", input_text=None, input_ids=p, sampling_params=SamplingParams(**GREEDY, max_new_tokens=32)
        )
        for i, p in enumerate(make_prompts())
    ]
    done = run_checked(sched, reqs)
    assert sched.num_retracted_reqs > 0
    for i, expected in enumerate(solo_outputs):
        meta = done[f"r{i}"]["meta_info"]
        assert meta["finish_reason"]["type"] == "length", meta
        assert done[f"r{i}"]["output_ids"] == expected, i
    assert_pool_whole(sched)


WORDS = "the river runs past old stone walls where children play and merchants call out their prices".split()


@pytest.mark.slow
def test_100_long_requests_on_smollm2s_default_pool(smollm2):
    """The issue's load: 100 requests of 300 words and 300 new tokens, radix cache on, the
    default pool. All complete; a sample's greedy outputs equal solo runs (all 100 solo would
    take 30,000 more decode steps); the accounting holds at every step; the pool is whole."""
    engine = Engine(model_path=smollm2)
    sched = engine.scheduler
    prompts = []
    for i in range(100):
        rng = random.Random(i)
        prompts.append(engine.tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(300))))
    params = {**GREEDY, "max_new_tokens": 300}
    reqs = [TokenizedGenerateReqInput(f"r{i}", None, p, SamplingParams(**params)) for i, p in enumerate(prompts)]
    done = run_checked(sched, reqs)
    assert all(d["meta_info"]["finish_reason"]["type"] == "length" for d in done.values())
    print(f"pool {sched.worker_info.max_total_num_tokens} tokens, {sched.num_retracted_reqs} retractions")
    assert_pool_whole(sched)
    solo = Engine(model_path=smollm2, disable_radix_cache=True)
    for i in (0, 37, 99):
        assert solo.generate(input_ids=prompts[i], sampling_params=params)["output_ids"] == done[f"r{i}"]["output_ids"]
