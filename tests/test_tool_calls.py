"""Tool calls: SGLang's detectors on real formatted text, streamed and not, and the chat route end to end.

The detectors (minisgl/function_call/) read the call formats of Qwen 2.5, Llama 3, Mistral and the
pythonic style; a stream cut into any pieces must give the calls of the whole text. The route is
driven by the real openai client over the app in-process (FastAPI's TestClient is an httpx client):
required and named choices are constrained by xgrammar, so the arguments validate against the
function's schema whatever the model; auto reads calls with --tool-call-parser, exercised by
constraining the reply (a regex) to Qwen 2.5's format, since a small model rarely calls by itself.
The default SmolLM2 runs in the slow tests; the default suite uses the tiny Llama.
"""

import json
from typing import Literal

import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from pydantic import BaseModel, Field

from minisgl.entrypoints.http_server import create_app
from minisgl.entrypoints.openai.protocol_tools import Tool
from minisgl.function_call.function_call_parser import TOOL_CALL_PARSERS, FunctionCallParser
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
TOOL_MODELS = [Tool.model_validate(t) for t in TOOLS]
ARGS = {"city": "Paris", "unit": "celsius"}
REPLIES = {
    "qwen25": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    "llama3": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
    '{"name": "get_time", "parameters": {}}',
    "mistral": 'Let me check.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
    '{"name": "get_time", "arguments": {}}]',
    "pythonic": 'Let me check.[get_weather(city="Paris", unit="celsius"), get_time()]',
}


@pytest.mark.parametrize("parser", sorted(REPLIES))
def test_detector_reads_calls_and_text(parser):
    text, calls = FunctionCallParser(TOOL_MODELS, parser).parse_non_stream(REPLIES[parser])
    assert [(c.tool_index, c.name, json.loads(c.parameters)) for c in calls] == [
        (0, "get_weather", ARGS),
        (1, "get_time", {}),
    ]
    assert text == ("" if parser == "llama3" else "Let me check.")


def _merge(items) -> list[tuple[int, str, str]]:
    """A stream's call items joined per call, as OpenAI's clients join deltas: (index, name, arguments)."""
    calls: dict[int, list] = {}
    for item in items:
        call = calls.setdefault(item.tool_index, [item.tool_index, None, ""])
        assert item.name is None or call[1] is None, "a call's name is sent once"
        call[1] = call[1] or item.name
        call[2] += item.parameters
    return [tuple(calls[i]) for i in sorted(calls)]


def _stream_pieces(parser: str, reply: str, pieces) -> tuple[str, list]:
    stream = FunctionCallParser(TOOL_MODELS, parser)
    text, items, i = "", [], 0
    for size in pieces:
        normal, new = stream.parse_stream_chunk(reply[i : i + size])
        text, items, i = text + normal, items + new, i + size
    return text, items


@pytest.mark.parametrize("parser", sorted(REPLIES))
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_streamed_detector_gives_the_same_calls(parser, piece):
    reply = REPLIES[parser]
    text, items = _stream_pieces(parser, reply, [piece] * len(reply))
    whole = FunctionCallParser(TOOL_MODELS, parser).parse_non_stream(reply)[1]
    assert _merge(items) == [(c.tool_index, c.name, c.parameters) for c in whole]
    assert [(i, n, json.loads(a)) for i, n, a in _merge(items)] == [(0, "get_weather", ARGS), (1, "get_time", {})]
    assert text.strip() == ("" if parser == "llama3" else "Let me check.")
    if parser != "pythonic" and piece == 1:  # JSON calls: the arguments go out as they are written
        assert sum(1 for item in items if item.tool_index == 0 and item.parameters) > 5


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=25, deadline=None)
@given(arguments=st.dictionaries(st.text(max_size=6), _JSON, max_size=4), cuts=st.lists(st.integers(1, 9)))
def test_streamed_arguments_join_into_the_whole_replys(arguments, cuts):
    """Any arguments, cut anywhere: the pieces join into exactly the non-streamed arguments
    (nothing sent is ever taken back: numbers, escapes and surrogate pairs cut in two included)."""
    for parser, template in [
        ("qwen25", '<tool_call>\n{{"name": "get_weather", "arguments": {}}}\n</tool_call>'),
        (
            "mistral",
            '[TOOL_CALLS] [{{"name": "get_weather", "arguments": {}}}, {{"name": "get_time", "arguments": {{}}}}]',
        ),
        ("llama3", '{{"name": "get_weather", "parameters": {}}}'),
    ]:
        for ascii_only in (False, True):
            reply = template.format(json.dumps(arguments, ensure_ascii=ascii_only))
            _, items = _stream_pieces(parser, reply, (cuts or [1]) * len(reply))
            whole = FunctionCallParser(TOOL_MODELS, parser).parse_non_stream(reply)[1]
            assert _merge(items) == [(c.tool_index, c.name, c.parameters) for c in whole]


@pytest.mark.parametrize("parser", sorted(TOOL_CALL_PARSERS))
def test_text_without_calls_passes_through(parser):
    reply = "The weather in Paris is mild (about 20 degrees) [source: memory]."
    assert FunctionCallParser(TOOL_MODELS, parser).parse_non_stream(reply) == (reply, [])


def test_undefined_function_is_dropped():
    reply = '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'
    assert FunctionCallParser(TOOL_MODELS, "qwen25").parse_non_stream(reply) == (reply, [])


# ---- the chat route ---------------------------------------------------------------------------


def _client(tm) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=TestClient(create_app(tm, "m")))


@pytest.fixture(scope="module")
def tiny_tm(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, max_total_tokens=2048, tool_call_parser="qwen25"), True)
    yield tm
    tm.shutdown()


@pytest.fixture(scope="module")
def tiny_client(tiny_tm):
    return _client(tiny_tm)


@pytest.fixture(scope="module")
def no_blank_tokens(tiny_tm):
    """A logit bias against tokens that are only white space: the grammar allows any amount of it
    between JSON tokens, and a random model would spend its budget there."""
    tok = tiny_tm.tokenizer
    return {str(i): -100 for i in range(len(tok)) if not tok.decode([i]).strip()}


MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _check_calls(calls, name="get_weather"):
    assert calls and calls[0].function.name == name and calls[0].id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)


def _stream_calls(client, **kwargs):
    """A stream joined by the openai client's own accumulation (ChatCompletionStreamState): its
    calls, its finish reason, and how many deltas carried a piece of a call's arguments."""
    state, pieces = ChatCompletionStreamState(), 0
    for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True, **kwargs):
        state.handle_chunk(chunk)
        pieces += sum(1 for delta in chunk.choices[0].delta.tool_calls or [] if delta.function.arguments)
    choice = state.get_final_completion().choices[0]
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in choice.message.tool_calls or []
    ]
    return calls, choice.finish_reason, pieces


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_constrained_choice_makes_a_valid_call(tiny_client, no_blank_tokens, choice):
    kwargs = dict(tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=80, logit_bias=no_blank_tokens)
    if choice == "required":
        # One tool and one call: a random model would pick either tool, and add calls until max_tokens.
        kwargs.update(tools=TOOLS[:1], parallel_tool_calls=False)
    r = tiny_client.chat.completions.create(model="m", messages=MESSAGES, **kwargs)
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
    _check_calls(r.choices[0].message.tool_calls)
    # Streamed, the arguments come in pieces as they are generated, and join into the same call.
    calls, finish, pieces = _stream_calls(tiny_client, **kwargs)
    assert finish == "tool_calls" and [c["name"] for c in calls] == ["get_weather"]
    assert calls[0]["arguments"] == r.choices[0].message.tool_calls[0].function.arguments and pieces > 3


def test_tool_choice_none_is_text(tiny_client):
    r = tiny_client.chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=8
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tool_choice="required"), "tool_choice 'required' needs tools"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "'nope', which is not"),
        (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "response_format"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]), "not a JSON schema"),
        (dict(functions=[{"name": "f"}]), "minisgl does not support functions"),
    ],
)
def test_bad_tool_requests_are_refused_by_name(tiny_client, kwargs, message):
    with pytest.raises(openai.BadRequestError, match=message):
        tiny_client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, **kwargs)


def test_auto_reads_calls_with_the_parser(tiny_client):
    # A regex makes the model write Qwen 2.5's format; the route must read the call out of it.
    call = r'\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{1,4}", "unit": "celsius"\}\}'
    regex = rf"<tool_call>\n{call}\n</tool_call>"
    kwargs = dict(tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=200, extra_body={"regex": regex})
    r = tiny_client.chat.completions.create(model="m", messages=MESSAGES, **kwargs)
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    _check_calls(r.choices[0].message.tool_calls)
    calls, finish, pieces = _stream_calls(tiny_client, **kwargs)
    assert finish == "tool_calls" and calls[0]["arguments"] == r.choices[0].message.tool_calls[0].function.arguments
    assert pieces > 3  # the qwen25 detector streams the arguments too


# ---- the default model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_client(smollm2):
    tm = TokenizerManager(ServerArgs(model_path=smollm2, max_total_tokens=4096), threaded=True)
    yield _client(tm)
    tm.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_default_model_calls_under_constraint(smollm2_client, choice):
    kwargs = dict(tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=60)
    r = smollm2_client.chat.completions.create(model="m", messages=MESSAGES, **kwargs)
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls(r.choices[0].message.tool_calls)
    calls, finish, _ = _stream_calls(smollm2_client, **kwargs)
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)


class GetWeather(BaseModel):
    city: str
    days: int


@pytest.mark.slow
def test_default_model_parse_with_pydantic_tool(smollm2_client):
    r = smollm2_client.chat.completions.parse(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    assert isinstance(r.choices[0].message.tool_calls[0].function.parsed_arguments, GetWeather)


# ---- agent frameworks (dev extras) ------------------------------------------------------------


class Weather(BaseModel):
    """Weather in a city."""

    city: str = Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]


@pytest.mark.slow  # langchain and litellm take seconds to import
def test_langchain_bind_tools_and_structured_output(tiny_tm, no_blank_tokens):
    langchain_openai = pytest.importorskip("langchain_openai", reason="langchain-openai is a dev extra")
    llm = langchain_openai.ChatOpenAI(
        model="m",
        api_key="-",
        base_url="http://testserver/v1",
        http_client=TestClient(create_app(tiny_tm, "m")),
        temperature=0,
        max_tokens=160,  # the tiny model's tokens are a few characters each
        logit_bias=no_blank_tokens,
        max_retries=0,
    )
    message = llm.bind_tools([Weather], tool_choice="Weather").invoke("What is the weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "Weather", message
    Weather.model_validate(message.tool_calls[0]["args"])
    structured = llm.with_structured_output(Weather, method="function_calling").invoke("Weather in Paris?")
    assert isinstance(structured, Weather)


@pytest.mark.slow
def test_litellm_tools(tiny_tm, no_blank_tokens, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the network
    litellm = pytest.importorskip("litellm", reason="litellm is a dev extra")
    client = _client(tiny_tm)
    r = litellm.completion(
        model="openai/m",
        messages=MESSAGES,
        tools=TOOLS[:1],
        tool_choice=NAMED,
        temperature=0,
        max_tokens=160,
        logit_bias=no_blank_tokens,
        client=client,
        api_base="http://testserver/v1",
        api_key="-",
    )
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
