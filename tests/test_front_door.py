"""One front door: the Engine and the HTTP server take every request through the same
TokenizerManager, so the same input gets the same outcome from both: the same result, or a
ValueError from the Engine and a 400 from the server carrying the same message.

Also the Engine's SGLang API: n, stream=True, async_generate, ``minisgl.Engine``."""

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

import minisgl
from minisgl.entrypoints.engine import Engine
from minisgl.entrypoints.http_server import create_app
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

ARGS = dict(max_total_tokens=2048, context_length=256)
SEEDED = {"temperature": 1.0, "seed": 11, "max_new_tokens": 6, "ignore_eos": True}
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}

# (name, GenerateReqInput fields, None for success or the error message both must give)
CASES = [
    ("n=3", dict(text="The river", sampling_params={**SEEDED, "n": 3}), None),
    ("batch", dict(input_ids=[[5, 6, 7], [8, 9]], sampling_params=GREEDY), None),
    ("max_new_tokens None", dict(input_ids=[5] * 250, sampling_params={**GREEDY, "max_new_tokens": None}), None),
    ("stop string", dict(text="The river", sampling_params={**SEEDED, "max_new_tokens": 16, "stop": ["e"]}), None),
    ("empty prompt", dict(text=""), "the prompt is empty"),
    ("prompt longer than the context", dict(input_ids=[5] * 300), "longer than the model's context length"),
    ("max_new_tokens past the context", dict(input_ids=[5] * 250, sampling_params={"max_new_tokens": 10}),
     "maximum context length"),
    ("stop ['']", dict(text="hi", sampling_params={"stop": [""]}), "stop must be a non-empty string"),
    ("bad temperature", dict(text="hi", sampling_params={"temperature": -1}), "temperature"),
    ("unknown sampling param", dict(text="hi", sampling_params={"bogus": 1}), "bogus"),
    ("n out of range", dict(text="hi", sampling_params={"n": 17}), "n must be an integer"),
    ("hidden states not enabled", dict(text="hi", return_hidden_states=True), "--enable-return-hidden-states"),
    ("routed experts not enabled", dict(text="hi", return_routed_experts=True), "--enable-return-routed-experts"),
    ("out-of-vocab id", dict(input_ids=[1, 10**7]), "input_ids must be token ids"),
    ("a bool is not an id", dict(input_ids=[True, 2]), "input_ids must be of type int"),
    ("logprob start past the prompt", dict(input_ids=[5, 6], return_logprob=True, logprob_start_len=5),
     "logprob_start_len"),
    ("lone surrogate", dict(text="hi \ud800"), "not valid UTF-8"),
    ("text and ids", dict(text="hi", input_ids=[1]), "exactly one of text and input_ids"),
]  # fmt: skip


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(model_path=tiny_llama, **ARGS) as e:
        yield e


@pytest.fixture(scope="module")
def http(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, **ARGS), threaded=True)
    with TestClient(create_app(tm)) as client:  # the app's lifespan shuts the manager down
        yield client


def _engine_kwargs(fields: dict) -> dict:
    return {("prompt" if k == "text" else k): v for k, v in fields.items()}


def _comparable(result):
    if isinstance(result, list):
        return [_comparable(r) for r in result]
    meta = result["meta_info"]
    return result["text"], result["output_ids"], meta["finish_reason"], meta["completion_tokens"]


@pytest.mark.parametrize("name, fields, error", CASES, ids=[c[0] for c in CASES])
def test_engine_and_server_agree(engine, http, name, fields, error):
    # As a client's JSON encoder sends it (a lone surrogate travels as the escape \\ud800).
    response = http.post("/generate", content=json.dumps(fields), headers={"Content-Type": "application/json"})
    if error is None:
        assert response.status_code == 200, response.text
        assert _comparable(engine.generate(**_engine_kwargs(fields))) == _comparable(response.json())
        return
    with pytest.raises(ValueError) as raised:
        engine.generate(**_engine_kwargs(fields))
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert error in str(raised.value) and message == str(raised.value)


def test_n_gives_n_results_that_differ_and_repeat_under_a_seed(engine):
    results = engine.generate("The river", {**SEEDED, "n": 3})
    assert len(results) == 3 and [r["index"] for r in results] == [0, 1, 2]
    assert len({tuple(r["output_ids"]) for r in results}) > 1
    assert [r["output_ids"] for r in engine.generate("The river", {**SEEDED, "n": 3})] == [
        r["output_ids"] for r in results
    ]


def test_stream_chunks_hold_everything_so_far(engine):
    # SGLang 0.5.9's Engine: each chunk's text and output_ids are the whole output so far.
    params = {**SEEDED, "max_new_tokens": 12}
    whole = engine.generate(["The river", "A serving engine"], params)
    chunks = list(engine.generate(["The river", "A serving engine"], params, stream=True))
    assert len(chunks) > 2
    for i, result in enumerate(whole):
        mine = [c for c in chunks if c["index"] == i]
        assert all(result["text"].startswith(c["text"]) for c in mine) and mine[-1]["text"] == result["text"]
        assert mine[-1]["output_ids"] == result["output_ids"]
        assert mine[-1]["meta_info"]["finish_reason"] == result["meta_info"]["finish_reason"]


def test_sglang_stream_and_merge_gives_the_whole_text(engine):
    # SGLang's documented helpers merge the chunks by their overlap: they need text so far.
    from sglang.utils import async_stream_and_merge, stream_and_merge

    prompt, params = "The river", {**GREEDY, "max_new_tokens": 40}
    whole = engine.generate(prompt, params)["text"]
    assert stream_and_merge(engine, prompt, params) == whole

    async def merged():
        return "".join([piece async for piece in async_stream_and_merge(engine, prompt, params)])

    assert asyncio.run(merged()) == whole


def test_stream_output_makes_only_the_ids_deltas(tiny_llama):
    with Engine(model_path=tiny_llama, max_total_tokens=256, stream_output=True) as e:
        whole = e.generate("The river", {**GREEDY, "max_new_tokens": 8})
        chunks = list(e.generate("The river", {**GREEDY, "max_new_tokens": 8}, stream=True))
    assert sum((c["output_ids"] for c in chunks), []) == whole["output_ids"]
    assert chunks[-1]["text"] == whole["text"]


def test_a_stream_left_early_aborts_and_frees_the_kv(engine):
    chunks = engine.generate("The river", {**GREEDY, "max_new_tokens": 200}, stream=True)
    next(chunks)
    chunks.close()
    assert engine.flush_cache()
    info = engine.get_server_info()
    assert info["is_idle"] and info["available_kv_tokens"] == info["max_total_num_tokens"]


def test_async_generate_runs_concurrent_requests_in_one_batch(engine):
    expected = [engine.generate(p, GREEDY)["output_ids"] for p in ("The river", "A serving engine")]

    async def both():
        return await asyncio.gather(*(engine.async_generate(p, GREEDY) for p in ("The river", "A serving engine")))

    assert [r["output_ids"] for r in asyncio.run(both())] == expected

    async def streamed():
        return [c async for c in await engine.async_generate("The river", GREEDY, stream=True)]

    assert asyncio.run(streamed())[-1]["output_ids"] == expected[0]


def test_minisgl_engine_is_the_engine(tiny_llama):
    assert minisgl.Engine is Engine
    with minisgl.Engine(model_path=tiny_llama, max_total_tokens=256) as e:
        assert e.generate(input_ids=[5, 6], sampling_params=GREEDY)["meta_info"]["completion_tokens"] == 6


def test_a_rid_in_flight_is_refused_and_free_once_its_end_is_reported(engine):
    chunks = engine.generate("The river", {**GREEDY, "max_new_tokens": 50}, stream=True, rid="mine")
    next(chunks)
    with pytest.raises(ValueError, match="'mine' is already in use"):
        engine.generate("The river", GREEDY, rid="mine")
    chunks.close()  # aborts it; the scheduler reports the abort at its next step
    engine.generate("Another prompt", GREEDY)
    out = engine.generate("The river", GREEDY, rid="mine")
    assert out["meta_info"]["id"] == "mine" and out["meta_info"]["completion_tokens"] == 6
