"""Constrained decoding (json_schema, regex, ebnf) through the xgrammar backend, and C7's mask path.

With the real SmolLM2-135M, radix cache and chunked prefill on: every JSON output parses and
validates against its schema (the jsonschema package), every regex output fullmatches, every
EBNF output parses (Python's own parser, for an arithmetic grammar); free requests batched
with constrained ones give exactly their solo greedy outputs; bad grammars are a ValueError
from the Engine and a 400 from the server, which goes on serving; the KV pool is whole after.
The tiny Llama covers the scheduler's edges: a grammar that fails to compile, an abort while
compiling, retraction, speculative decoding. Where the mask is applied (C7, a golden trace) is
test_c6_c7_c8_forward_sample.py's.
"""

import ast
import json
import re
import threading

import jsonschema
import pytest
import torch

from minisgl.entrypoints.engine import Engine

GREEDY = {"temperature": 0}

SCHEMAS = [
    # required fields, an integer range
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
    },
    # an enum, an optional field
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "enum": ["France", "Japan", "Brazil"]},
            "population": {"type": "integer"},
        },
        "required": ["city", "country"],
    },
    # an array with bounds
    {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 30},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        },
        "required": ["title", "tags"],
    },
    # a nested object, a boolean
    {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "first": {"type": "string", "maxLength": 15},
                    "last": {"type": "string", "maxLength": 15},
                },
                "required": ["first", "last"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["person", "active"],
    },
]
SCHEMA_QUESTIONS = [
    "Describe a person as JSON with name and age.",
    "Give a city as JSON.",
    "Give a blog post title and tags as JSON.",
    "Give a person and whether they are active, as JSON.",
]
REGEXES = [
    (r"\(\d{3}\) \d{3}-\d{4}", "What is your phone number?"),
    (r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", "When were you born? Answer as YYYY-MM-DD."),
    (r"(yes|no)", "Is the sky blue?"),
]
ARITHMETIC = """root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9] | [1-9] [0-9] | [1-9] [0-9] [0-9]
"""


@pytest.fixture(scope="module")
def engine(smollm2):
    # A chunk of 32 tokens splits every chat prompt (the template alone is ~30); the radix cache is on.
    engine = Engine(model_path=smollm2, max_total_tokens=4096, chunked_prefill_size=32)
    yield engine
    engine.shutdown()


def chat(engine, question: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


def assert_pool_whole(engine) -> None:
    scheduler = engine.scheduler
    assert scheduler.is_idle() and not scheduler.grammar_manager.has_waiting_grammars()
    assert scheduler.flush_cache()
    stats = scheduler.get_internal_state()
    assert stats["available_kv_tokens"] == stats["max_total_num_tokens"], stats
    assert scheduler.req_to_token_pool.available_size() == scheduler.req_to_token_pool.size


def assert_ended_by_its_grammar(out: dict, engine) -> None:
    # A grammar ends by accepting a stop token; the text leaves it out.
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out["meta_info"]
    assert out["output_ids"][-1] in engine.scheduler.eos_token_ids


# ---- SmolLM2: outputs follow their constraint ---------------------------------------------------


def test_json_schema_outputs_parse_and_validate(engine):
    # The offline Engine also takes a schema as a dict (the last one here).
    schemas = [json.dumps(s) for s in SCHEMAS[:-1]] + [SCHEMAS[-1]]
    outs = engine.generate(
        prompt=[chat(engine, q) for q in SCHEMA_QUESTIONS],
        sampling_params=[{**GREEDY, "max_new_tokens": 128, "json_schema": s} for s in schemas],
    )
    for schema, out in zip(SCHEMAS, outs):
        assert_ended_by_its_grammar(out, engine)
        jsonschema.validate(json.loads(out["text"]), schema)
    # The first prompts were prefilled in chunks and later ones share the template's prefix.
    assert engine.scheduler.get_internal_state()["cached_tokens"] > 0
    assert_pool_whole(engine)


def test_regex_outputs_fullmatch(engine):
    outs = engine.generate(
        prompt=[chat(engine, q) for _, q in REGEXES],
        sampling_params=[{**GREEDY, "max_new_tokens": 32, "regex": r} for r, _ in REGEXES],
    )
    for (regex, _), out in zip(REGEXES, outs):
        assert_ended_by_its_grammar(out, engine)
        assert re.fullmatch(regex, out["text"]), (regex, out["text"])


def test_ebnf_outputs_parse(engine):
    questions = ["Write the expression (2+3)*4 again.", "What is 12 times 7? Write it as an expression."]
    outs = engine.generate(
        prompt=[chat(engine, q) for q in questions],
        sampling_params={**GREEDY, "max_new_tokens": 24, "ebnf": ARITHMETIC},
    )
    for out in outs:
        assert_ended_by_its_grammar(out, engine)
        # Python's parser reads the grammar's language; only numbers and + - * / may appear.
        tree = ast.parse(out["text"], mode="eval")
        allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)
        assert all(isinstance(node, allowed) for node in ast.walk(tree)), out["text"]


def test_free_requests_batched_with_constrained_ones_match_their_solo_outputs(engine):
    free_prompts = [chat(engine, "Name three colors."), chat(engine, "What is the capital of France?")]
    free = {**GREEDY, "max_new_tokens": 16, "ignore_eos": True}
    solo = [engine.generate(prompt=p, sampling_params=free)["output_ids"] for p in free_prompts]
    prompts = [chat(engine, SCHEMA_QUESTIONS[0]), free_prompts[0], chat(engine, REGEXES[0][1]), free_prompts[1]]
    params = [
        {**GREEDY, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMAS[0])},
        free,
        {**GREEDY, "max_new_tokens": 32, "regex": REGEXES[0][0]},
        free,
    ]
    outs = engine.generate(prompt=prompts, sampling_params=params)
    assert [outs[1]["output_ids"], outs[3]["output_ids"]] == solo
    jsonschema.validate(json.loads(outs[0]["text"]), SCHEMAS[0])
    assert re.fullmatch(REGEXES[0][0], outs[2]["text"])
    assert_pool_whole(engine)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"regex": "(ab"}, "invalid regex: Regex parsing error at position 4: The parenthesis is not closed"),
        ({"json_schema": "{not json"}, "invalid json_schema: not JSON"),
        ({"json_schema": '{"type": "foo"}'}, 'invalid json_schema: Unsupported type "foo"'),
        ({"ebnf": "root ::= foo"}, 'invalid ebnf: .*Rule "foo" is not defined'),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "at most one of json_schema, regex and ebnf may be set, got regex"),
        ({"regex": 7}, "regex must be a string, got int"),
    ],
)
def test_bad_grammars_are_a_value_error_from_the_engine(engine, params, message):
    with pytest.raises(ValueError, match=re.escape(message) if ".*" not in message else message):
        engine.generate(prompt="hi", sampling_params={"max_new_tokens": 4, **params})
    assert_pool_whole(engine)  # refused before anything was queued


def test_server_maps_response_format_and_refuses_bad_grammars_with_a_400(engine, smollm2):
    from fastapi.testclient import TestClient

    from minisgl.entrypoints.http_server import create_app
    from minisgl.managers.tokenizer_manager import TokenizerManager
    from minisgl.server_args import ServerArgs

    tokenizer_manager = TokenizerManager(ServerArgs(model_path=smollm2, max_total_tokens=2048))
    with TestClient(create_app(tokenizer_manager, served_model_name="smol")) as http:

        def chat_completion(**fields):
            messages = [{"role": "user", "content": SCHEMA_QUESTIONS[0]}]
            body = {"model": "smol", "messages": messages, "temperature": 0, "max_tokens": 64, **fields}
            return http.post("/v1/chat/completions", json=body)

        schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMAS[0], "strict": True}}
        response = chat_completion(response_format=schema_format)
        assert response.status_code == 200, response.text
        jsonschema.validate(json.loads(response.json()["choices"][0]["message"]["content"]), SCHEMAS[0])
        response = chat_completion(response_format={"type": "json_object"})
        assert response.status_code == 200, response.text
        assert isinstance(json.loads(response.json()["choices"][0]["message"]["content"]), dict)
        answer = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
        completion = {"model": "smol", "prompt": "Is water wet? Answer in JSON.", "temperature": 0, "max_tokens": 32}
        answer_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": answer}}
        response = http.post("/v1/completions", json={**completion, "response_format": answer_format})
        assert response.status_code == 200, response.text
        jsonschema.validate(json.loads(response.json()["choices"][0]["text"]), answer)

        no_schema = {"type": "json_schema", "json_schema": {"name": "x"}}
        bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}
        for response_format in (no_schema, bad_schema):
            response = chat_completion(response_format=response_format)
            assert response.status_code == 400, response.text
            assert "json_schema" in response.json()["error"]["message"]
        response = http.post("/generate", json={"text": "hi", "sampling_params": {"regex": "(ab"}})
        assert response.status_code == 400 and "invalid regex" in response.json()["error"]["message"]
        body = {"text": "hi", "sampling_params": {"ebnf": "root ::= foo"}, "stream": True}
        response = http.post("/generate", json=body)
        assert response.status_code == 400 and "invalid ebnf" in response.json()["error"]["message"]

        # Still serving, constrained and streamed; and the pool is whole afterwards.
        body = {"text": "Is the sky blue?", "sampling_params": {**GREEDY, "regex": "(yes|no)"}, "stream": True}
        with http.stream("POST", "/generate", json=body) as response:
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        assert re.fullmatch("(yes|no)", events[-1]["text"])  # /generate streams the text so far
        assert http.post("/flush_cache").status_code == 200
        info = http.get("/get_server_info").json()
        assert info["available_kv_tokens"] == info["max_total_num_tokens"], info


# ---- the tiny Llama: the scheduler's edges --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama):
    return Engine(model_path=tiny_llama, max_total_tokens=512)


def test_a_grammar_that_fails_to_compile_ends_only_its_request(tiny_engine, monkeypatch):
    backend = tiny_engine.scheduler.grammar_manager._get_backend()
    compile_regex = backend.dispatch_regex

    def failing(spec):
        if spec == "[a-c]+":
            raise ValueError("invalid regex: refused by the test")
        return compile_regex(spec)

    monkeypatch.setattr(backend, "dispatch_regex", failing)
    outs = tiny_engine.generate(
        input_ids=[[5, 6, 7], [8, 9, 10], [11, 12]],
        sampling_params=[
            {**GREEDY, "max_new_tokens": 4, "regex": "[a-c]+"},
            {**GREEDY, "max_new_tokens": 4, "regex": "[d-f]+"},
            {**GREEDY, "max_new_tokens": 4, "ignore_eos": True},
        ],
    )
    assert outs[0]["meta_info"]["finish_reason"] == {"type": "abort", "message": "invalid regex: refused by the test"}
    assert outs[0]["output_ids"] == []
    assert re.fullmatch("[d-f]+", outs[1]["text"]) and len(outs[2]["output_ids"]) == 4
    assert_pool_whole(tiny_engine)


def test_abort_while_the_grammar_compiles(tiny_engine, monkeypatch):
    from minisgl.managers.io_struct import TokenizedGenerateReqInput
    from minisgl.sampling.sampling_params import SamplingParams

    scheduler = tiny_engine.scheduler
    backend = scheduler.grammar_manager._get_backend()
    compile_regex, release = backend.dispatch_regex, threading.Event()
    monkeypatch.setattr(backend, "dispatch_regex", lambda spec: release.wait() and compile_regex(spec))
    params = SamplingParams(max_new_tokens=4, regex="[x-z]+")
    scheduler.handle_generate_request(TokenizedGenerateReqInput("slow", None, [5, 6], params))
    assert scheduler.step() == [] and scheduler.grammar_manager.has_waiting_grammars()
    scheduler.abort_request("slow")
    (out,) = scheduler.step()
    assert out.rid == "slow" and out.finished and out.meta_info["finish_reason"]["type"] == "abort"
    release.set()
    for _ in range(20):  # once compiled, the aborted request is dropped, never run or answered twice
        assert scheduler.step() == []
        if not scheduler.grammar_manager.has_waiting_grammars():
            break
    assert not scheduler.grammar_manager.has_waiting_grammars()
    assert_pool_whole(tiny_engine)


def test_retracted_requests_keep_their_grammar_in_step(tiny_llama):
    # As in test_kv_accounting: two requests start, 2 x 42 tokens do not fit in 64 slots, so one
    # is retracted and prefilled again from prompt + output so far, under the same matcher.
    # 200 characters cannot be written in 40 tokens: no request ends early.
    prompts = [[3 + i, 4 + i] for i in range(4)]
    params = {**GREEDY, "max_new_tokens": 40, "regex": "[a-m]{200}"}
    reference = Engine(model_path=tiny_llama, max_total_tokens=4096)
    expected = [reference.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
    small = Engine(model_path=tiny_llama, max_total_tokens=64)
    outs = small.generate(input_ids=prompts, sampling_params=params)
    assert small.scheduler.num_retracted_reqs > 0
    assert [o["output_ids"] for o in outs] == expected
    assert all(re.fullmatch("[a-m]+", o["text"]) for o in outs)
    assert_pool_whole(small)


def test_speculative_decoding_refuses_a_grammar_by_name(tiny_llama, tmp_path):
    from minisgl.tools.make_draft_model import make_truncated_model

    draft = str(make_truncated_model(tiny_llama, tmp_path / "draft", num_layers=1))
    engine = Engine(
        model_path=tiny_llama,
        max_total_tokens=256,
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=draft,
        speculative_num_steps=2,
    )
    # Refused at the front door, before anything is queued.
    with pytest.raises(
        ValueError, match="speculative decoding does not support json_schema, regex or ebnf constraints"
    ):
        engine.generate(input_ids=[5, 6, 7], sampling_params={**GREEDY, "max_new_tokens": 4, "regex": "[a-z]+"})


def test_tp2_ranks_admit_and_mask_alike(tiny_llama):
    # Each rank compiles on its own threads; requests move on only when ready on both ranks,
    # so the ranks schedule the same batches and sample, under the same masks, TP=1's tokens.
    kw = {"model_path": tiny_llama, "max_total_tokens": 256, "device": "cpu", "attention_backend": "torch_native"}
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    params = [
        {**GREEDY, "max_new_tokens": 6, "regex": "[a-m]+"},
        {**GREEDY, "max_new_tokens": 6, "ignore_eos": True},
        {**GREEDY, "max_new_tokens": 6, "regex": "[0-9]{3}"},
    ]
    expected = Engine(**kw).generate(input_ids=prompts, sampling_params=params)
    with Engine(tp_size=2, **kw) as engine:
        got = engine.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert re.fullmatch("[a-m]+", got[0]["text"]) and re.fullmatch("[0-9]{3}", got[2]["text"])


# ---- the grammar object itself ----------------------------------------------------------------


def test_grammar_accepts_rolls_back_and_terminates(tiny_engine):
    backend = tiny_engine.scheduler.grammar_manager._get_backend()
    tokenizer = tiny_engine.tokenizer
    grammar = backend.get_cached_or_future_value(("regex", "abc")).result().copy()
    ids = tokenizer.encode("abc", add_special_tokens=False)
    eos = min(tiny_engine.scheduler.eos_token_ids)
    assert not grammar.accept_token(tokenizer.encode("x", add_special_tokens=False)[0])
    for token in ids:
        assert grammar.accept_token(token)
    assert not grammar.is_terminated() and grammar.accept_token(eos) and grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated()
    # A copy starts from the beginning; the cached template is never advanced.
    assert backend.get_cached_or_future_value(("regex", "abc")).result().copy().accept_token(ids[0])


def test_vocab_mask_kernel_matches_plain_torch(tiny_engine):
    backend = tiny_engine.scheduler.grammar_manager._get_backend()
    grammar = backend.get_cached_or_future_value(("regex", "[a-m]+")).result().copy()
    vocab = tiny_engine.scheduler.worker_info.vocab_size
    mask = grammar.allocate_vocab_mask(vocab, 3, "cpu")
    grammar.fill_vocab_mask(mask, 0)
    mask[2] = torch.randint(-(2**31), 2**31 - 1, mask[2].shape, dtype=torch.int32)
    logits = torch.randn(3, vocab)
    ours = logits.clone()
    grammar.apply_vocab_mask(ours, mask)
    # Bit j of word w allows token 32 * w + j (bit 0 of word >> j is bit j, sign bits aside).
    bits = (mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # [3, words, 32]
    allowed = bits.bool().flatten(1)[:, :vocab]
    assert torch.equal(ours, logits.masked_fill(~allowed, float("-inf")))
    assert torch.equal(ours[1], logits[1])  # a free row is untouched
    assert 0 < torch.isfinite(ours[0]).sum() < vocab
