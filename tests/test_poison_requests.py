"""Nothing a client sends may kill the scheduler: every value that once did (or once slipped
through validation) gets a 4xx with OpenAI's error body, and after each one the server is still
healthy, still serving and its KV pool whole. The app runs in-process (fastapi's TestClient),
its scheduler on its own thread as in ``launch_server``."""

import json

import pytest
from fastapi.testclient import TestClient

from minisgl.entrypoints.http_server import create_app
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

MODEL = "tiny"
HOT = {"temperature": 1.0, "max_new_tokens": 2}

GENERATE = [
    ("temperature NaN", {"text": "hi", "sampling_params": {"temperature": float("nan")}}),
    ("temperature inf", {"text": "hi", "sampling_params": {"temperature": float("inf")}}),
    ("seed past int64", {"text": "hi", "sampling_params": {**HOT, "seed": 2**64}}),
    ("float seed", {"text": "hi", "sampling_params": {**HOT, "seed": 1.5}}),
    ("top_k 2^63", {"text": "hi", "sampling_params": {**HOT, "top_k": 2**63}}),
    ("logit_bias 1e39", {"text": "hi", "sampling_params": {"temperature": 0, "logit_bias": {"1": 1e39}}}),
    ("logit_bias inf", {"text": "hi", "sampling_params": {**HOT, "logit_bias": {"1": float("inf")}}}),
    ("greedy logit_bias NaN", {"text": "hi", "sampling_params": {"temperature": 0, "logit_bias": {"1": float("nan")}}}),
    ("logit_bias not an object", {"text": "hi", "sampling_params": {"logit_bias": [1, 2]}}),
    ("repetition_penalty 1e-300", {"text": "hi", "sampling_params": {**HOT, "repetition_penalty": 1e-300}}),
    ("lone surrogate stop", {"text": "hi", "sampling_params": {"stop": ["\ud800"]}}),
    ("skip_special_tokens not a bool", {"text": "hi", "sampling_params": {"skip_special_tokens": "yes"}}),
    ("max_new_tokens 1.5", {"text": "hi", "sampling_params": {"max_new_tokens": 1.5}}),
    ("logprob start past the prompt", {"input_ids": [5, 6], "return_logprob": True, "logprob_start_len": 50}),
    ("top_logprobs_num past the vocabulary", {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": 10**6}),
    ("token_ids_logprob outside", {"input_ids": [5, 6], "return_logprob": True, "token_ids_logprob": [10**6]}),
    ("token_ids_logprob -1", {"input_ids": [5, 6], "return_logprob": True, "token_ids_logprob": [-1]}),
    ("input_ids [true]", {"input_ids": [True]}),
    ("lone surrogate prompt", {"text": "hi \ud800"}),
    ("lone surrogate rid", {"text": "hi", "rid": "\udc00"}),
    ("unknown field", {"text": "hi", "no_such_field": 1}),
]  # fmt: skip


@pytest.fixture(scope="module")
def http(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, max_total_tokens=512), threaded=True)
    with TestClient(create_app(tm, MODEL)) as client:
        yield client


def _post(http, route: str, body: dict):
    # json.dumps writes NaN/Infinity and \\ud800 escapes, as a careless or hostile client would.
    return http.post(route, content=json.dumps(body), headers={"Content-Type": "application/json"})


def _assert_refused_and_still_serving(http, response) -> None:
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert http.get("/health").status_code == 200
    ok = _post(http, "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2
    assert http.post("/flush_cache").status_code == 200
    info = http.get("/get_server_info").json()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]


@pytest.mark.parametrize("name, body", GENERATE, ids=[c[0] for c in GENERATE])
def test_generate_refuses_the_value_and_keeps_serving(http, name, body):
    _assert_refused_and_still_serving(http, _post(http, "/generate", body))


OPENAI = [
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": "10"}),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "temperature": float("nan")}),
    ("/v1/completions", {"model": MODEL, "prompt": "hi \ud800"}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi \ud800"}]}),
    ("/v1/chat/completions", {"model": "\ud800", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "seed": 2**64}),
]


@pytest.mark.parametrize("route, body", OPENAI)
def test_openai_routes_refuse_the_value_and_keep_serving(http, route, body):
    _assert_refused_and_still_serving(http, _post(http, route, body))


def test_abort_request_ends_a_running_stream_and_frees_its_kv(http):
    body = {"text": "The river", "rid": "to-abort", "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}}  # fmt: skip
    with http.stream("POST", "/generate", content=json.dumps(body), headers={"Content-Type": "application/json"}) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert http.post("/abort_request", json={"rid": "to-abort"}).status_code == 200
        events = [json.loads(line[5:]) for line in lines if line.startswith("data:") and line != "data: [DONE]"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert http.post("/abort_request", json={"rid": 5}).status_code == 400
    assert http.post("/flush_cache").status_code == 200
    info = http.get("/get_server_info").json()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]
