"""Fault isolation in Scheduler.step: a batch that fails aborts its own requests, frees their KV,
and the scheduler goes on serving; an error outside any batch propagates.

Failures are injected by monkeypatching one call for one batch: the worker's forward, the
write of req_to_token while a batch is prepared, and the radix cache's publication of a
prefill while its result is processed.
"""

import pytest

from minisgl.entrypoints.engine import Engine
from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.sampling.sampling_params import SamplingParams
from tests.test_kv_pressure import assert_kv_accounted, assert_pool_whole

GREEDY = {"temperature": 0, "ignore_eos": True}
PROMPTS = {"a": [5, 6, 7, 8, 9, 10], "b": [11, 12, 13], "c": [14, 15, 16, 17]}


class Boom(RuntimeError):
    pass


def fail_once(monkeypatch, obj, name: str, when=lambda *a, **k: True) -> list:
    """Make obj.name raise Boom the first time `when(args)` holds; returns the calls that failed."""
    original = getattr(obj, name)
    failed = []

    def patched(*args, **kwargs):
        if not failed and when(*args, **kwargs):
            failed.append(args)
            raise Boom("injected failure")
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, patched)
    return failed


@pytest.fixture(scope="module")
def reference(tiny_llama):
    engine = Engine(model_path=tiny_llama, max_total_tokens=1024)
    return {
        rid: engine.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 12})["output_ids"]
        for rid, p in PROMPTS.items()
    }


@pytest.fixture(params=[1, 4], ids=["page1", "page4"])
def engine(tiny_llama, request):
    return Engine(model_path=tiny_llama, max_total_tokens=512, page_size=request.param)


def submit(sched, rid: str) -> None:
    params = SamplingParams(**GREEDY, max_new_tokens=12)
    sched.handle_generate_request(TokenizedGenerateReqInput(rid, None, PROMPTS[rid], params))


def drain(sched, outputs: dict) -> dict:
    """Step until idle, collecting output ids and finish reasons; check the accounting each step."""
    for _ in range(500):
        for out in sched.step():
            ids, _ = outputs.get(out.rid, ([], None))
            outputs[out.rid] = (ids + out.new_output_ids, out.meta_info["finish_reason"] if out.finished else None)
        assert_kv_accounted(sched)
        if sched.is_idle():
            return outputs
    raise AssertionError("the scheduler did not become idle")


def test_a_failed_decode_aborts_its_batch_and_the_next_requests_are_served(engine, reference, monkeypatch):
    sched = engine.scheduler
    worker = sched.tp_worker
    submit(sched, "a")
    submit(sched, "b")
    outputs = {}
    for _ in range(3):  # the prefill and two decodes
        for out in sched.step():
            outputs[out.rid] = (outputs.get(out.rid, ([], None))[0] + out.new_output_ids, None)
    failed = fail_once(monkeypatch, worker, "forward_batch_generation")
    drain(sched, outputs)
    assert failed
    for rid in "ab":
        reason = outputs[rid][1]
        assert reason["type"] == "abort" and "Boom: injected failure" in reason["message"], reason
    assert_pool_whole(sched)
    # The scheduler serves the next requests, with the outputs they have on a fresh engine.
    submit(sched, "c")
    submit(sched, "a")
    after = drain(sched, {})
    assert after["c"] == (reference["c"], {"type": "length", "length": 12})
    assert after["a"][0] == reference["a"]
    assert_pool_whole(sched)


def test_a_failed_prefill_spares_the_running_requests(engine, reference, monkeypatch):
    sched = engine.scheduler
    submit(sched, "a")
    sched.step()
    sched.step()  # a is decoding
    # The next extend batch (b's prefill) fails in the forward; a's decode batches do not.
    fail_once(monkeypatch, sched.tp_worker, "forward_batch_generation", lambda b: b.forward_mode.is_extend())
    submit(sched, "b")
    outputs = drain(sched, {"a": ([], None)})
    assert outputs["b"][1]["type"] == "abort"
    assert outputs["a"][1] == {"type": "length", "length": 12}
    assert_pool_whole(sched)


def test_a_failure_while_preparing_frees_the_slots_it_allocated(engine, reference, monkeypatch):
    """Slots taken for the batch but not yet written to req_to_token come back too."""
    sched = engine.scheduler
    submit(sched, "a")
    sched.step()
    fail_once(monkeypatch, sched.req_to_token_pool, "write")
    outputs = drain(sched, {})
    assert outputs["a"][1]["type"] == "abort"
    assert_pool_whole(sched)
    submit(sched, "b")
    assert drain(sched, {})["b"][0] == reference["b"]


def test_a_failure_before_a_request_has_a_row_unlocks_its_cached_prefix(engine, reference, monkeypatch):
    """Admission locked the cached prefix; the batch failed before req_to_token gave it a row."""
    sched = engine.scheduler
    submit(sched, "a")
    drain(sched, {})  # a's KV is now cached
    fail_once(monkeypatch, sched.req_to_token_pool, "alloc")
    submit(sched, "a")
    outputs = drain(sched, {})
    assert outputs["a"][1]["type"] == "abort"
    assert_pool_whole(sched)  # nothing left locked
    submit(sched, "a")
    assert drain(sched, {})["a"][0] == reference["a"]


def test_a_failure_while_processing_a_prefill_result(engine, reference, monkeypatch):
    sched = engine.scheduler
    fail_once(monkeypatch, sched.tree_cache, "cache_unfinished_req")
    submit(sched, "a")
    submit(sched, "b")
    outputs = drain(sched, {})
    assert outputs["a"][1]["type"] == outputs["b"][1]["type"] == "abort"
    assert_pool_whole(sched)
    submit(sched, "c")
    assert drain(sched, {})["c"][0] == reference["c"]


def test_an_error_outside_any_batch_propagates(engine, monkeypatch):
    sched = engine.scheduler
    fail_once(monkeypatch, sched.policy, "calc_priority")
    submit(sched, "a")
    with pytest.raises(Boom):
        sched.step()


@pytest.mark.parametrize("tp_size", [1, 2])
def test_a_request_the_scheduler_cannot_queue_fails_alone(tiny_llama, monkeypatch, tp_size):
    """Every rank applies requests through Scheduler.process_input_requests, which isolates each
    one. A seed past 64 bits fails torch.Generator.manual_seed on every rank; the front door is
    made to let it through (its check switched off in this process only, the ranks run their own)."""
    import json

    from fastapi.testclient import TestClient

    from minisgl.entrypoints.http_server import create_app
    from minisgl.managers.tokenizer_manager import TokenizerManager
    from minisgl.server_args import ServerArgs

    monkeypatch.setattr("minisgl.sampling.sampling_params._INT64_MAX", 1 << 70)
    args = ServerArgs(model_path=tiny_llama, max_total_tokens=256, tp_size=tp_size, attention_backend="torch_native")
    tm = TokenizerManager(args, threaded=True)
    try:
        with TestClient(create_app(tm, "tiny")) as http:
            poison, good = {"temperature": 1.0, "seed": 1 << 64, "max_new_tokens": 2}, {**GREEDY, "max_new_tokens": 3}
            body = {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": [poison, good]}
            out = http.post("/generate", content=json.dumps(body), headers={"Content-Type": "application/json"})
            assert out.status_code == 200, out.text
            refused, served = out.json()
            assert refused["meta_info"]["finish_reason"]["type"] == "abort"
            assert "could not be queued" in refused["meta_info"]["finish_reason"]["message"]
            assert served["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
            assert http.get("/health").status_code == 200
            again = http.post("/generate", json={"input_ids": [5, 6], "sampling_params": good})
            assert again.json()["meta_info"]["completion_tokens"] == 3
            assert http.post("/flush_cache").status_code == 200
            info = http.get("/get_server_info").json()
            assert info["available_kv_tokens"] == info["max_total_num_tokens"]
    finally:
        tm.shutdown()
