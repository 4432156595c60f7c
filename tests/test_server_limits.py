"""/tokenize and /detokenize under /generate's limits and off the event loop, /health that sees
a dead tensor-parallel rank, abort counts of real rids only, and a truthful 503 once the
scheduler has stopped (issue 33). In-process servers (create_app + TestClient) on the tiny Llama."""

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient

from minisgl.entrypoints.http_server import create_app
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

ARGS = dict(max_total_tokens=2048, context_length=256)


@pytest.fixture(scope="module")
def tm(tiny_llama):
    return TokenizerManager(ServerArgs(model_path=tiny_llama, **ARGS), threaded=True)


@pytest.fixture(scope="module")
def http(tm):
    with TestClient(create_app(tm)) as client:  # the app's lifespan shuts the manager down
        yield client


def test_tokenize_runs_off_the_event_loop(tm, http, monkeypatch):
    """While a tokenization is stuck, /health still answers: the loop is free."""
    started, release = threading.Event(), threading.Event()

    def gated(encode):
        def run(*args, **kwargs):
            started.set()
            release.wait(60)
            return encode(*args, **kwargs)

        return run

    # Both tokenizers: on the loop (the old route) the stuck call would freeze /health too.
    for tokenizer in {id(tm.tokenizer): tm.tokenizer, id(tm._tokenizing_tokenizer): tm._tokenizing_tokenizer}.values():
        monkeypatch.setattr(tokenizer, "encode", gated(tokenizer.encode))
    replies = {}
    worker = threading.Thread(target=lambda: replies.update(tok=http.post("/tokenize", json={"prompt": "hi there"})))
    worker.start()
    assert started.wait(60)
    health = threading.Thread(target=lambda: replies.update(health=http.get("/health")))
    health.start()
    health.join(30)
    release.set()
    worker.join(60)
    assert "health" in replies and replies["health"].status_code == 200
    assert replies["tok"].status_code == 200 and replies["tok"].json()["count"] >= 2


def test_detokenize_round_trips(tm, http):
    ids = tm.tokenizer.encode("the river bank", add_special_tokens=False)
    assert http.post("/detokenize", json={"tokens": ids}).json()["text"] == tm.tokenizer.decode(ids)


@pytest.mark.parametrize(
    "prompt, message",
    [("hi \ud800", "prompt is not valid UTF-8"), (["ok", "x \udfff"], "prompt is not valid UTF-8")],
)
def test_a_lone_surrogate_is_a_400(http, prompt, message):
    body = json.dumps({"prompt": prompt})  # escaped: UTF-8 cannot carry the surrogate itself
    out = http.post("/tokenize", content=body, headers={"Content-Type": "application/json"})
    assert out.status_code == 400 and message in out.json()["error"]["message"]


def test_a_text_longer_than_the_context_could_hold_is_refused_before_tokenizing(tm, http, monkeypatch):
    monkeypatch.setattr(tm._tokenizing_tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    monkeypatch.setattr(tm, "_encode", lambda *a, **k: pytest.fail("tokenized"))
    huge = "a" * (tm.context_len * tm._max_token_chars * 4 + 1)
    for route, body in [("/tokenize", {"prompt": huge}), ("/generate", {"text": huge})]:
        out = http.post(route, json=body)
        assert out.status_code == 400 and "more than the 256-token context can hold" in out.json()["error"]["message"]


def test_aborting_an_unknown_rid_counts_nothing(http):
    before = http.get("/get_server_info").json()["num_aborted_requests"]
    assert http.post("/abort_request", json={"rid": "no-such-request"}).status_code == 200
    assert http.get("/get_server_info").json()["num_aborted_requests"] == before


def test_a_stopped_scheduler_is_a_503_not_a_500(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, **ARGS), threaded=True)
    with TestClient(create_app(tm), raise_server_exceptions=False) as http:
        tm.shutdown()  # what the drain's end does to requests still in flight
        out = http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert out.status_code == 503 and "the scheduler has stopped" in out.json()["error"]["message"]
        assert http.get("/health").status_code == 503


def test_health_sees_a_dead_tp_rank_while_idle(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, tp_size=2, **ARGS), threaded=True)
    with TestClient(create_app(tm)) as http:
        assert http.get("/health").status_code == 200
        procs = tm.scheduler._procs
        procs[1].kill()
        deadline = time.monotonic() + 60
        while (out := http.get("/health")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert out.status_code == 503 and "minisgl-scheduler-TP1 has exited" in out.json()["error"]["message"]
        procs[0].kill()  # rank 0 would wait for its peer at shutdown
