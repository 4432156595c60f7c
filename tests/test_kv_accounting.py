"""The KV pool is accounted exactly: every slot comes back, through finish, retraction and abort."""

import pytest

from minisgl.entrypoints.engine import Engine
from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.sampling.sampling_params import SamplingParams

GREEDY = {"temperature": 0, "ignore_eos": True}


def _assert_pool_full(engine: Engine) -> None:
    sched = engine.scheduler
    allocator, cache = sched.token_to_kv_pool_allocator, sched.tree_cache
    # Every slot is free or held, unlocked, by the radix cache; flushing the cache frees the rest.
    assert allocator.available_size() + cache.total_size() == sched.worker_info.max_total_num_tokens
    assert cache.protected_size() == 0 and cache.evictable_size() == cache.total_size()
    assert sched.flush_cache()
    assert allocator.available_size() == sched.worker_info.max_total_num_tokens
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size


@pytest.mark.parametrize("page_size", [1, 4])
def test_pool_is_full_after_a_batch(tiny_llama, page_size):
    engine = Engine(model_path=tiny_llama, max_total_tokens=1024, page_size=page_size)
    prompts = [list(range(1, 2 + i * 3)) for i in range(10)]
    outs = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 7})
    assert all(o["meta_info"]["completion_tokens"] == 7 for o in outs)
    _assert_pool_full(engine)


@pytest.mark.parametrize("page_size", [1, 4])
def test_retraction_keeps_outputs_and_frees_everything(tiny_llama, page_size):
    prompts = [[3 + i, 4 + i] for i in range(4)]
    params = {**GREEDY, "max_new_tokens": 40}
    reference = Engine(model_path=tiny_llama, max_total_tokens=4096)
    expected = [reference.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]

    # Admission reserves room for 70% of max_new_tokens, so two requests start, and two
    # times 42 tokens do not fit in 64 slots: decode must retract one and re-prefill it later.
    small = Engine(model_path=tiny_llama, max_total_tokens=64, page_size=page_size)
    outs = small.generate(input_ids=prompts, sampling_params=params)
    assert small.scheduler.num_retracted_reqs > 0
    assert [o["output_ids"] for o in outs] == expected
    _assert_pool_full(small)


def test_abort_frees_slots_at_once(tiny_llama):
    engine = Engine(model_path=tiny_llama, max_total_tokens=256)
    sched = engine.scheduler
    for rid, ids in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8])):
        sched.handle_generate_request(
            TokenizedGenerateReqInput(
                rid=rid,
                input_text=None,
                input_ids=ids,
                sampling_params=SamplingParams(max_new_tokens=50, ignore_eos=True),
            )
        )
    for _ in range(4):
        sched.step()

    def used():  # slots held by running requests (a finished request's KV may stay cached, unlocked)
        return 256 - sched.token_to_kv_pool_allocator.available_size() - sched.tree_cache.evictable_size()

    used_before = used()
    sched.abort_request("a")
    outputs = sched.step()
    aborted = [o for o in outputs if o.rid == "a"]
    assert aborted and aborted[0].meta_info["finish_reason"]["type"] == "abort"
    used_after = used()
    assert used_after < used_before - 4  # a's prompt and outputs are back; b grew by one
    sched.abort_request("b")
    sched.step()
    _assert_pool_full(engine)
    assert sched.is_idle()


def test_request_that_can_never_fit_is_ended_not_hung(tiny_llama):
    engine = Engine(model_path=tiny_llama, max_total_tokens=16)
    out = engine.generate(input_ids=[1, 2, 3], sampling_params={**GREEDY, "max_new_tokens": 100})
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert "too small" in out["meta_info"]["finish_reason"]["message"]
    _assert_pool_full(engine)
