"""hypothesis over every /generate field and sampling param, in valid and hostile shapes: whatever
a client sends, the answer is a 200 or a 4xx with OpenAI's error body, never a 5xx, and the
server stays healthy with its KV pool whole. (tests/test_sampling_params_fuzz.py does the same
for SamplingParams alone, down to the sampler.)"""

import json
import math

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minisgl.entrypoints.http_server import create_app
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

SAMPLING_KEYS = ["max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "stop", "stop_token_ids", "ignore_eos",
                 "skip_special_tokens", "logit_bias", "seed", "n"]  # fmt: skip
REQUEST_KEYS = ["rid", "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
                "return_hidden_states", "return_routed_experts", "stream"]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 40),
    st.sampled_from([-(2**63) - 1, 2**63, 2**64, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.sampled_from(["\ud800", "10", "", "x\udc00y"]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=3), scalars, max_size=2))
prompts = st.one_of(
    st.text(max_size=12),
    st.lists(st.integers(-2, 300), min_size=0, max_size=6),
    st.lists(st.lists(st.integers(0, 300), max_size=4), max_size=3),
    values,
)


@pytest.fixture(scope="module")
def http(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, max_total_tokens=512, context_length=64), threaded=True)
    with TestClient(create_app(tm)) as client:
        yield client


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt_key=st.sampled_from(["text", "input_ids"]),
    prompt=prompts,
    sampling=st.dictionaries(st.sampled_from(SAMPLING_KEYS), values, max_size=4),
    extra=st.dictionaries(st.sampled_from(REQUEST_KEYS), values, max_size=3),
)
def test_no_request_gets_a_5xx(http, prompt_key, prompt, sampling, extra):
    sampling.setdefault("max_new_tokens", 3)  # keep the valid ones quick
    body = {prompt_key: prompt, "sampling_params": sampling, **extra}
    # allow_nan: JSON has no NaN, but Python's encoder (and many a client) writes one anyway.
    response = http.post("/generate", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code < 500, (body, response.text)
    if response.status_code != 200:
        assert response.json()["error"]["message"]
    assert http.get("/health").status_code == 200


def test_after_the_fuzz_the_pool_is_whole(http):
    assert http.post("/flush_cache").status_code == 200
    info = http.get("/get_server_info").json()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"] and info["is_idle"]
    assert not math.isnan(info["hit_rate"])
