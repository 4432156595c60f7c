"""--enable-metrics: a Prometheus /metrics route with SGLang's metric names (collector.py at 64bca53),
absent without the flag; its counters and histograms move when requests run."""

import json
import re

import pytest
from fastapi.testclient import TestClient

from minisgl.entrypoints.http_server import create_app
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

pytest.importorskip("prometheus_client")

ARGS = dict(max_total_tokens=2048, context_length=256)
GREEDY = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}

# Names as SGLang's TokenizerMetricsCollector and SchedulerMetricsCollector register them.
SGLANG_NAMES = [
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:num_requests_total",
    "sglang:num_aborted_requests_total",
    "sglang:time_to_first_token_seconds_bucket",
    "sglang:inter_token_latency_seconds_bucket",
    "sglang:e2e_request_latency_seconds_bucket",
    "sglang:num_running_reqs",
    "sglang:num_used_tokens",
    "sglang:token_usage",
    "sglang:num_queue_reqs",
    "sglang:cache_hit_rate",
    "sglang:max_total_num_tokens",
    "sglang:num_retracted_reqs",
]


def _samples(text: str) -> dict[str, float]:
    """name{labels} -> value, for every sample line of the exposition."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _value(samples: dict[str, float], name: str) -> float:
    (value,) = [v for k, v in samples.items() if re.fullmatch(re.escape(name) + r"\{[^}]*\}", k)]
    return value


@pytest.fixture(scope="module")
def http(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, enable_metrics=True, **ARGS), threaded=True)
    with TestClient(create_app(tm, served_model_name="tiny")) as client:
        yield client


def test_no_metrics_route_without_the_flag(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, **ARGS), threaded=True)
    with TestClient(create_app(tm)) as client:
        assert client.get("/metrics").status_code == 404
        assert tm.metrics is None


def test_names_match_sglang(http):
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    for name in SGLANG_NAMES:
        assert any(k.startswith(name + "{") for k in samples), name
    assert all('model_name="tiny"' in k for k in samples if k.startswith("sglang:"))
    assert _value(samples, "sglang:max_total_num_tokens") == http.get("/get_server_info").json()["max_total_num_tokens"]


def test_counters_move_after_requests(http):
    before = _samples(http.get("/metrics").text)
    prompt = "The quick brown fox jumps over the lazy dog"
    results = [http.post("/generate", json={"text": prompt, "sampling_params": GREEDY}).json() for _ in range(2)]
    streamed = http.post("/generate", json={"text": prompt, "sampling_params": GREEDY, "stream": True})
    assert streamed.status_code == 200
    after = _samples(http.get("/metrics").text)

    def delta(name: str) -> float:
        return _value(after, name) - _value(before, name)

    prompt_tokens = results[0]["meta_info"]["prompt_tokens"]
    assert delta("sglang:num_requests_total") == 3
    assert delta("sglang:prompt_tokens_total") == 3 * prompt_tokens
    assert delta("sglang:generation_tokens_total") == 3 * GREEDY["max_new_tokens"]
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    metas = [r["meta_info"] for r in results] + [chunks[-1]["meta_info"]]
    # The second and third requests find the first one's prompt in the radix cache.
    assert delta("sglang:cached_tokens_total") == sum(m["cached_tokens"] for m in metas) > 0
    assert delta("sglang:time_to_first_token_seconds_count") == 3
    assert delta("sglang:e2e_request_latency_seconds_count") == 3
    # Every token after the first of each request is one inter-token interval.
    assert delta("sglang:inter_token_latency_seconds_count") == 3 * (GREEDY["max_new_tokens"] - 1)
    assert 0 < _value(after, "sglang:cache_hit_rate") <= 1
    assert _value(after, "sglang:num_running_reqs") == 0
    assert _value(after, "sglang:num_queue_reqs") == 0
