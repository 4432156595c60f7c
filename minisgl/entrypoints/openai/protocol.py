"""Pydantic models of the OpenAI-compatible API: requests, responses, stream chunks, errors.

Mirrors python/sglang/srt/entrypoints/openai/protocol.py (ModelCard, ModelList,
ErrorResponse, UsageInfo, LogProbs, ChoiceLogprobs, CompletionRequest/Response,
ChatCompletionRequest/Response and their stream variants), with the same
field names, including SGLang's extensions (top_k, min_p, repetition_penalty,
stop_token_ids, ignore_eos, skip_special_tokens; the openai client sends them
through ``extra_body``), and ``response_format`` (text, json_object, json_schema)
for both routes, as SGLang accepts it. Omitted: tools and tool calls, reasoning,
structural tags, image/audio/video content, embeddings,
suffix, best_of; ``echo`` is declared only so that asking for it gets a clear
400. Pydantic checks types only; value ranges are checked once, by
SamplingParams.verify and the TokenizerManager, for every entry point. Unknown
fields are ignored.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field


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


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaResponseFormat(BaseModel):
    name: str
    description: Optional[str] = None
    # "schema" would shadow a BaseModel attribute; the alias keeps the wire name.
    schema_: Optional[dict[str, Any]] = Field(alias="schema", default=None)
    # Ignored: a constrained output always follows its schema, which is what OpenAI's strict promises.
    strict: Optional[bool] = False


class ResponseFormat(BaseModel):
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


class SamplingFields(BaseModel):
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


# ---- completions --------------------------------------------------------------------------


class LogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class CompletionRequest(SamplingFields):
    model: str
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = 16
    temperature: float = 1.0
    logprobs: Optional[int] = None
    echo: bool = False


FinishReason = Optional[Literal["stop", "length", "abort"]]


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


class ChatCompletionMessageContentTextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatCompletionMessageParam(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ChatCompletionMessageContentTextPart], None] = None
    name: Optional[str] = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatCompletionMessageParam]
    model: str
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None  # OpenAI's newer name for max_tokens
    temperature: float = 1.0
    logprobs: bool = False
    top_logprobs: Optional[int] = None


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
