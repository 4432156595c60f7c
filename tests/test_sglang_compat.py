"""SGLang wire compatibility: every refused field is refused by name, every new field does what SGLang's does.

Runs the server app in-process (FastAPI's TestClient) over one threaded TokenizerManager on the
tiny Llama, with --enable-custom-logit-processor so the processor can be exercised too.
"""

import json

import pytest
from fastapi.testclient import TestClient

from minisgl.entrypoints.http_server import create_app
from minisgl.entrypoints.openai.protocol import UNSUPPORTED_OPENAI_FIELDS
from minisgl.launch_server import main as launch_main
from minisgl.managers.io_struct import UNSUPPORTED_REQUEST_FIELDS, UNSUPPORTED_SAMPLING_PARAMS
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor
from minisgl.server_args import ServerArgs

MODEL = "tiny-llama"
GREEDY = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 12}


@pytest.fixture(scope="module")
def tm(tiny_llama):
    args = ServerArgs(model_path=tiny_llama, max_total_tokens=2048, enable_custom_logit_processor=True)
    manager = TokenizerManager(args, threaded=True)
    yield manager
    manager.shutdown()


@pytest.fixture(scope="module")
def http(tm):
    return TestClient(create_app(tm, MODEL))


def _gen(http, **body):
    r = http.post("/generate", json={"text": "The river rose", **body})
    assert r.status_code == 200, r.text
    return r.json()


def _stream(http, body) -> list[dict]:
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    return [json.loads(line[len("data: ") :]) for line in lines]


def _error(r) -> str:
    assert r.status_code == 400, r.text
    return r.json()["error"]["message"]


# ---- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_REQUEST_FIELDS))
def test_generate_refuses_sglang_fields_by_name(http, name):
    assert f"minisgl does not support {name}" in _error(http.post("/generate", json={"text": "Hi", name: "x"}))


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_SAMPLING_PARAMS))
def test_generate_refuses_sglang_sampling_params_by_name(http, name):
    r = http.post("/generate", json={"text": "Hi", "sampling_params": {name: "x"}})
    assert f"minisgl does not support {name}" in _error(r)


def test_refused_fields_at_their_defaults_pass(http):
    # SGLang's own clients (its frontend language) send these with their default values.
    body = {name: default for name, (default, _) in UNSUPPORTED_REQUEST_FIELDS.items()}
    params = {**GREEDY, **{name: default for name, (default, _) in UNSUPPORTED_SAMPLING_PARAMS.items()}}
    assert _gen(http, sampling_params=params, **body)["meta_info"]["completion_tokens"] == 12


def test_unknown_fields_are_400s(http):
    assert "'colour'" in _error(http.post("/generate", json={"text": "Hi", "colour": 1}))
    assert "colour" in _error(http.post("/generate", json={"text": "Hi", "sampling_params": {"colour": 1}}))


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_OPENAI_FIELDS))
def test_openai_refuses_sglang_fields_by_name(http, name):
    body = {"model": MODEL, "prompt": "Hi", name: "x"}
    assert f"minisgl does not support {name}" in _error(http.post("/v1/completions", json=body))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], name: "x"}
    assert f"minisgl does not support {name}" in _error(http.post("/v1/chat/completions", json=chat))


def test_openai_models_are_strict_and_closed(http):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": "10"}
    assert "max_tokens" in _error(http.post("/v1/completions", json=body))
    assert "colour" in _error(http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "colour": 1}))
    body = {"model": MODEL, "prompt": "Hi", "n": 2, "best_of": 3}
    assert "best_of must equal n" in _error(http.post("/v1/completions", json=body))


def test_grammar_fields_are_supported_and_structural_tags_refused():
    assert not {"regex", "json_schema", "ebnf"} & (set(UNSUPPORTED_SAMPLING_PARAMS) | set(UNSUPPORTED_OPENAI_FIELDS))
    assert "structural_tag" in UNSUPPORTED_SAMPLING_PARAMS


# ---- /generate streaming and the new fields ------------------------------------------------


def test_stream_is_cumulative_with_logprobs_per_chunk(http):
    body = {"text": "The river rose", "sampling_params": GREEDY, "return_logprob": True}
    whole = _gen(http, sampling_params=GREEDY, return_logprob=True)
    chunks = _stream(http, body)
    assert len(chunks) > 2
    for c in chunks:
        n = len(c["output_ids"])
        assert c["output_ids"] == whole["output_ids"][:n] and whole["text"].startswith(c["text"])
        assert len(c["meta_info"]["output_token_logprobs"]) == n
    assert chunks[-1]["text"] == whole["text"]
    streamed = [lp for lp, _, _ in chunks[-1]["meta_info"]["output_token_logprobs"]]
    assert streamed == pytest.approx([lp for lp, _, _ in whole["meta_info"]["output_token_logprobs"]], abs=1e-4)


def test_stream_deltas_carry_only_the_new_logprobs(tm):
    import asyncio

    from minisgl.managers.io_struct import GenerateReqInput

    async def run():
        obj = GenerateReqInput(text="The river", sampling_params=GREEDY, stream=True, return_logprob=True)
        return [c async for c in tm.generate_request(obj, stream_deltas=True)]

    chunks = asyncio.run(run())
    assert sum(len(c["meta_info"]["output_token_logprobs"]) for c in chunks) == 12
    assert all(len(c["meta_info"]["output_token_logprobs"]) == len(c["output_ids"]) for c in chunks)


def test_meta_info_has_sglang_names(http):
    meta = _gen(http, sampling_params=GREEDY)["meta_info"]
    assert {"total_retractions", "e2e_latency", "cached_tokens"} <= set(meta) and "num_retractions" not in meta


def test_return_text_in_logprobs_fills_the_text_slot(http, tm):
    meta = _gen(http, sampling_params=GREEDY, return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True)[
        "meta_info"
    ]
    for _, token_id, text in meta["output_token_logprobs"]:
        assert text == tm.tokenizer.decode([token_id])
    assert all(text is not None for top in meta["output_top_logprobs"] for _, _, text in top)
    plain = _gen(http, sampling_params=GREEDY, return_logprob=True)["meta_info"]
    assert all(text is None for _, _, text in plain["output_token_logprobs"])


def test_min_new_tokens_holds_back_stop_tokens(http):
    first = _gen(http, sampling_params={**GREEDY, "max_new_tokens": 1})["output_ids"][0]
    params = {"temperature": 0, "max_new_tokens": 8, "stop_token_ids": [first]}
    assert _gen(http, sampling_params=params)["output_ids"] == [first]
    held = _gen(http, sampling_params={**params, "min_new_tokens": 3})["output_ids"]
    assert len(held) >= 3 and first not in held[:3]


def test_stop_regex_no_stop_trim_and_sampling_seed(http):
    whole = _gen(http, sampling_params=GREEDY)
    stop = whole["text"][len(whole["text"]) // 2 :][:3]
    assert stop.strip(), whole["text"]
    regex = _gen(http, sampling_params={**GREEDY, "stop_regex": json.dumps(stop)[1:-1].replace(".", r"\.")})
    assert regex["meta_info"]["finish_reason"]["type"] == "stop"
    assert len(regex["output_ids"]) < 12
    trimmed = _gen(http, sampling_params={**GREEDY, "stop": stop})["text"]
    kept = _gen(http, sampling_params={**GREEDY, "stop": stop, "no_stop_trim": True})["text"]
    assert stop not in trimmed and kept.startswith(trimmed + stop)
    sampled = {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True, "sampling_seed": 5}
    assert _gen(http, sampling_params=sampled)["output_ids"] == _gen(http, sampling_params=sampled)["output_ids"]
    both = {"text": "Hi", "sampling_params": {"seed": 1, "sampling_seed": 1}}
    assert "not both" in _error(http.post("/generate", json=both))


def test_spaces_between_special_tokens_is_accepted(http):
    out = _gen(http, sampling_params={**GREEDY, "spaces_between_special_tokens": False, "skip_special_tokens": False})
    assert out["meta_info"]["completion_tokens"] == 12
    assert "boolean" in _error(http.post("/generate", json={"text": "Hi", "sampling_params": {"no_stop_trim": 1}}))


def test_per_prompt_lists_in_a_batch(http):
    body = {
        "text": ["The river", "A serving engine"],
        "rid": ["a", "b"],
        "sampling_params": [{**GREEDY, "max_new_tokens": 3}, {**GREEDY, "max_new_tokens": 5}],
        "return_logprob": [True, False],
    }
    a, b = http.post("/generate", json=body).json()
    assert (a["meta_info"]["id"], b["meta_info"]["id"]) == ("a", "b")
    assert (len(a["output_ids"]), len(b["output_ids"])) == (3, 5)
    assert "output_token_logprobs" in a["meta_info"] and "output_token_logprobs" not in b["meta_info"]


def test_custom_logit_processor_and_params(http, tm, monkeypatch):
    first = _gen(http, sampling_params={**GREEDY, "max_new_tokens": 1})["output_ids"][0]
    params = {**GREEDY, "max_new_tokens": 4, "custom_params": {"token_ids": [first]}}
    out = _gen(http, sampling_params=params, custom_logit_processor=DisallowedTokensLogitsProcessor.to_str())
    assert first not in out["output_ids"]
    assert "could not be deserialized" in _error(
        http.post("/generate", json={"text": "Hi", "custom_logit_processor": '{"callable": "00"}'})
    )
    monkeypatch.setattr(tm.server_args, "enable_custom_logit_processor", False)
    r = http.post("/generate", json={"text": "Hi", "sampling_params": {"custom_params": {}}})
    assert "--enable-custom-logit-processor" in _error(r)


# ---- OpenAI: echo, streaming logprobs, chat chunk fields ---------------------------------------


def test_completions_echo_and_streamed_logprobs(http):
    body = {"model": MODEL, "prompt": "The river rose", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = http.post("/v1/completions", json=body).json()["choices"][0]
    echoed = http.post("/v1/completions", json={**body, "echo": True, "logprobs": 1}).json()["choices"][0]
    assert echoed["text"] == "The river rose" + plain["text"]
    prompt_len = len(echoed["logprobs"]["tokens"]) - 6
    assert prompt_len >= 3 and echoed["logprobs"]["token_logprobs"][0] is None
    with http.stream("POST", "/v1/completions", json={**body, "logprobs": 1, "stream": True}) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    tokens = [t for e in events for c in e["choices"] for t in (c["logprobs"] or {}).get("tokens", [])]
    assert len(tokens) == 6 and "".join(c["text"] for e in events for c in e["choices"]) == plain["text"]


def test_chat_stream_chunks_carry_sglang_fields_and_logprobs(http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "stream": True}  # fmt: skip
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    deltas = [c["delta"] for e in events for c in e["choices"]]
    assert all("reasoning_content" in d and d["reasoning_content"] is None for d in deltas)
    assert sum(len((c["logprobs"] or {}).get("content", [])) for e in events for c in e["choices"]) == 5


# ---- routes -------------------------------------------------------------------------------------


def test_model_info_tokenize_detokenize_models_and_health_generate(http, tm):
    info = http.get("/get_model_info").json()
    assert info["is_generation"] and info["model_path"] == tm.server_args.model_path
    assert http.get("/model_info").json() == info
    tok = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert tok["tokens"] == tm.tokenizer.encode("Hello world") and tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == tm.context_len
    batch = http.post("/tokenize", json={"prompt": ["a", "b c"], "add_special_tokens": False}).json()
    assert batch["count"] == [len(t) for t in batch["tokens"]]
    text = http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["text"]
    assert text == tm.tokenizer.decode(tok["tokens"], skip_special_tokens=True)
    assert http.post("/detokenize", json={"tokens": [tok["tokens"], [5]]}).json()["text"][1] == tm.tokenizer.decode([5])
    assert http.post("/detokenize", json={"tokens": [10**9]}).status_code == 400
    assert http.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert http.get("/v1/models/other").status_code == 404
    assert http.get("/health_generate").status_code == 200


# ---- launch flags -------------------------------------------------------------------------------


def test_launch_flags(tiny_llama, capsys):
    with pytest.raises(SystemExit):
        launch_main(["--model-path", tiny_llama, "--max-runing-requests", "4"])
    assert "did you mean --max-running-requests?" in capsys.readouterr().err
    args = ServerArgs(model_path=tiny_llama, chunked_prefill_size=-1)
    assert args.chunked_prefill_size is None  # SGLang's -1: chunked prefill off
    import argparse

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parsed = parser.parse_args(["--model", "m", "--tensor-parallel-size", "2", "--stream-output"])
    assert (parsed.model_path, parsed.tp_size, parsed.stream_output) == ("m", 2, True)
