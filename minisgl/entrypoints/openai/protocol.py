"""Pydantic models of the OpenAI-compatible API: requests, responses, stream chunks, errors.

Mirrors python/sglang/srt/entrypoints/openai/protocol.py (ModelCard, ModelList,
ErrorResponse, UsageInfo, LogProbs, ChoiceLogprobs, CompletionRequest/Response,
ChatCompletionRequest/Response and their stream variants), with the same
field names, including SGLang's extensions (top_k, min_p, repetition_penalty,
stop_token_ids, ignore_eos, skip_special_tokens; the openai client sends them
through ``extra_body``), and ``response_format`` (text, json_object, json_schema)
for both routes, as SGLang accepts it; the tool models are in protocol_tools.py, the
embedding ones in serving_embedding.py. Omitted: reasoning, structural tags,
image/audio/video content (refused by name), suffix. The request models are
strict ("10" is not an int) and forbid unknown fields; SGLang's fields that minisgl lacks
are refused by name from the table below. Value ranges are checked once, by
SamplingParams.verify and the TokenizerManager, for every entry point.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from minisgl.entrypoints.openai.protocol_tools import Tool, ToolCall, ToolChoiceField
from minisgl.managers.io_struct import refuse_unsupported

# SGLang's CompletionRequest / ChatCompletionRequest fields (protocol.py at 64bca53) that minisgl
# refuses, with SGLang's default: a field given another value is a 400 naming it. docs/chapters/
# serving.md's table is checked against this dict (tests/test_sglang_fields.py).
UNSUPPORTED_OPENAI_FIELDS: dict[str, tuple[object, str]] = {
    "suffix": (None, "text after the insertion point"),
    "functions": (None, "the legacy function-call fields; use tools"),
    "function_call": (None, "the legacy function-call fields; use tools"),
    "reasoning_effort": (None, "reasoning parsers"),
    "separate_reasoning": (True, "reasoning parsers"),
    "stream_reasoning": (True, "reasoning parsers"),
    "continue_final_message": (False, "continuing the final message"),
    "chat_template_kwargs": (None, "chat template arguments"),
    "lora_path": (None, "LoRA adapters"),
    "session_params": (None, "sessions"),
    "bootstrap_host": (None, "prefill/decode disaggregation"),
    "bootstrap_port": (None, "prefill/decode disaggregation"),
    "bootstrap_room": (None, "prefill/decode disaggregation"),
    "data_parallel_rank": (None, "data parallelism"),
    "extra_key": (None, "cache-isolation keys"),
    "cache_salt": (None, "cache-isolation keys"),
    "priority": (None, "priority scheduling"),
    "custom_labels": (None, "metric labels"),
    "return_cached_tokens_details": (False, "cached-token details"),
    "max_dynamic_patch": (None, "multimodal inputs"),
    "min_dynamic_patch": (None, "multimodal inputs"),
}


# SGLang's default for a request's `model` (protocol.py's DEFAULT_MODEL_NAME): the field may be left
# out, and any name is served by the one model (see serving_base.py::model_name_error).
DEFAULT_MODEL_NAME = "default"

# OpenAI's limits on top alternatives per token: /v1/completions' logprobs, chat's top_logprobs.
MAX_COMPLETION_LOGPROBS = 5
MAX_TOP_LOGPROBS = 20


class StrictModel(BaseModel):
    """A request model: strict types, no unknown fields, SGLang's unsupported fields refused by name."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data):
        return refuse_unsupported(data, UNSUPPORTED_OPENAI_FIELDS) if isinstance(data, dict) else data


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: int


class ErrorResponse(BaseModel):
    """OpenAI's error body, ``{"error": {...}}``, which the openai client reads its message from.
    SGLang answers with the fields flat; minisgl nests them as OpenAI does."""

    error: ErrorInfo


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minisgl"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class StreamOptions(StrictModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaResponseFormat(StrictModel):
    name: str
    description: Optional[str] = None
    # "schema" would shadow a BaseModel attribute; the alias keeps the wire name.
    schema_: Optional[dict[str, Any]] = Field(alias="schema", default=None)
    # Ignored: a constrained output always follows its schema, which is what OpenAI's strict promises.
    strict: Optional[bool] = False


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaResponseFormat] = None

    def to_json_schema(self) -> Optional[str]:
        """The json_schema sampling param this format asks for (SGLang's mapping); None for text."""
        if self.type == "json_object":
            return '{"type": "object"}'  # any JSON object
        if self.type == "json_schema":
            if self.json_schema is None or self.json_schema.schema_ is None:
                raise ValueError("response_format of type json_schema needs json_schema.schema")
            return json.dumps(self.json_schema.schema_)
        return None


class SamplingFields(StrictModel):
    """The sampling fields completions and chat share (SGLang repeats them in both classes)."""

    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Optional[dict[str, float]] = None
    n: int = 1
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    top_p: float = 1.0
    user: Optional[str] = None
    # SGLang's extensions
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    response_format: Optional[ResponseFormat] = None
    # SGLang's constraint fields (extra_body), besides response_format: at most one of them.
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    min_tokens: int = 0
    stop_regex: Optional[Union[str, list[str]]] = None
    no_stop_trim: bool = False
    custom_params: Optional[dict] = None
    custom_logit_processor: Optional[str] = None
    return_hidden_states: bool = False
    return_routed_experts: bool = False
    rid: Optional[Union[str, list[str]]] = None


# ---- completions --------------------------------------------------------------------------


class LogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class CompletionRequest(SamplingFields):
    model: str = DEFAULT_MODEL_NAME
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = 16
    temperature: float = 1.0
    logprobs: Optional[int] = None
    echo: bool = False
    best_of: Optional[int] = None  # only equal to n: minisgl returns every sample it draws


FinishReason = Optional[Literal["stop", "length", "abort", "tool_calls"]]


class CompletionResponseChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[LogProbs] = None
    finish_reason: FinishReason = None
    matched_stop: Union[None, int, str] = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo


class CompletionResponseStreamChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[LogProbs] = None
    finish_reason: FinishReason = None
    matched_stop: Union[None, int, str] = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: Optional[UsageInfo] = None


# ---- chat completions ---------------------------------------------------------------------


class ChatCompletionMessageContentTextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatCompletionMessageParam(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ChatCompletionMessageContentTextPart], None] = None
    name: Optional[str] = None
    # An assistant turn's calls (OpenAI's shape, arguments a JSON string) and a tool turn's answer.
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content):
        # Without this, an image part reads as pydantic's message about every member of the union.
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(f"minisgl does not support {kind!r} content parts (only text: no multimodal input)")
        return content


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatCompletionMessageParam]
    model: str = DEFAULT_MODEL_NAME
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None  # OpenAI's newer name for max_tokens
    temperature: float = 1.0
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    tools: Optional[list[Tool]] = None
    tool_choice: ToolChoiceField = None  # None: "auto" with tools, "none" without (SGLang's default)
    parallel_tool_calls: bool = True


class TopLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float


class ChatCompletionTokenLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[ChatCompletionTokenLogprob]


class ChatMessage(BaseModel):
    role: str = "assistant"
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: FinishReason = None
    matched_stop: Union[None, int, str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    # SGLang always sends these, null when unused (minisgl has no reasoning parser).
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None


class ChatCompletionResponseStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: FinishReason = None
    matched_stop: Union[None, int, str] = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: Optional[UsageInfo] = None


# ---- tokenizer routes (SGLang's /tokenize and /detokenize) --------------------------------


class TokenizeRequest(StrictModel):
    model: Optional[str] = None
    prompt: Union[str, list[str]]
    add_special_tokens: bool = True


class TokenizeResponse(BaseModel):
    tokens: Union[list[int], list[list[int]]]
    count: Union[int, list[int]]
    max_model_len: int


class DetokenizeRequest(StrictModel):
    model: Optional[str] = None
    tokens: Union[list[int], list[list[int]]]
    skip_special_tokens: bool = True


class DetokenizeResponse(BaseModel):
    text: Union[str, list[str]]
