"""OpenAIServingChat: /v1/chat/completions on top of the TokenizerManager.

Mirrors python/sglang/srt/entrypoints/openai/serving_chat.py (_validate_request,
_convert_to_internal_request, _process_messages, _apply_jinja_template,
_generate_chat_stream, _build_chat_response). The prompt is the tokenizer's own
chat template with ``add_generation_prompt=True`` and the request's tools; what tools
change is in serving_tools.py. Omitted: reasoning parsers, multimodal content,
continue_final_message.
"""

from __future__ import annotations

import json
from typing import AsyncIterator, Optional

from minisgl.entrypoints.openai.protocol import (
    MAX_TOP_LOGPROBS,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatCompletionTokenLogprob,
    ChatMessage,
    ChoiceLogprobs,
    DeltaMessage,
    TopLogprob,
)
from minisgl.entrypoints.openai.serving_base import OpenAIServingBase, finish_reason_fields
from minisgl.entrypoints.openai.serving_tools import ChatTools
from minisgl.managers.io_struct import GenerateReqInput, check_text


class OpenAIServingChat(OpenAIServingBase):
    """/v1/chat/completions: messages through the chat template in, ``chat.completion`` out."""

    def _validate_request(self, request: ChatCompletionRequest) -> Optional[str]:
        if not request.messages:
            return "messages must not be empty"
        if request.top_logprobs is not None:
            if not request.logprobs:
                return "top_logprobs needs logprobs=true"
            if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
                return f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {request.top_logprobs}"
        return (
            ChatTools.validate(request)
            or self._validate_max_tokens(request.max_tokens, "max_tokens")
            or self._validate_max_tokens(request.max_completion_tokens, "max_completion_tokens")
        )

    def _convert_to_internal_request(self, request: ChatCompletionRequest) -> GenerateReqInput:
        max_new_tokens = request.max_tokens
        if request.max_completion_tokens is not None:
            max_new_tokens = request.max_completion_tokens
        tools = self._tools(request)
        # None: generate up to the context length, as OpenAI does when max_tokens is unset.
        sampling_params = self._build_sampling_params(request, request.temperature, max_new_tokens)
        if tools.constrained:
            sampling_params["json_schema"] = tools.json_schema()
        return GenerateReqInput(
            input_ids=self._apply_jinja_template(request, tools.template_tools()),
            sampling_params=sampling_params,
            return_logprob=request.logprobs,
            top_logprobs_num=request.top_logprobs or 0,
            **self._side_outputs(request),
        )

    def _tools(self, request: ChatCompletionRequest) -> ChatTools:
        return ChatTools(request, self.tokenizer_manager.server_args.tool_call_parser)

    def _apply_jinja_template(self, request: ChatCompletionRequest, tools: Optional[list[dict]]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; use /v1/completions")
        messages = [self._template_message(m) for m in request.messages]
        try:
            prompt = self._render(messages, tools)
        except Exception:
            if not tools:
                raise
            # Some templates (Mistral's) want the functions without OpenAI's wrapper (SGLang retries so too).
            prompt = self._render(messages, [t["function"] for t in tools])
        check_text("messages", prompt)  # a lone surrogate in a message would fail inside the tokenizer
        # The template already wrote any BOS it wants; adding special tokens again would double it.
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def _render(self, messages: list[dict], tools: Optional[list[dict]]) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=tools)
        except Exception as e:  # a template may raise anything on messages it does not accept
            raise ValueError(f"the chat template rejected the messages: {e}") from None

    @classmethod
    def _template_message(cls, m) -> dict:
        message = {"role": m.role, "content": cls._process_content(m.content)}
        for name in ("name", "tool_call_id"):
            if getattr(m, name) is not None:
                message[name] = getattr(m, name)
        if m.tool_calls:
            # Templates want an earlier call's arguments as a dict, OpenAI sends a JSON string (SGLang converts too).
            message["tool_calls"] = [_with_dict_arguments(call) for call in m.tool_calls]
        return message

    @staticmethod
    def _process_content(content) -> str:
        if content is None or isinstance(content, str):
            return content or ""
        return "\n".join(part.text for part in content)

    response_cls = ChatCompletionResponse
    stream_response_cls = ChatCompletionStreamResponse
    id_prefix = "chatcmpl"

    def _response_choice(self, request: ChatCompletionRequest, index: int, ret: dict) -> ChatCompletionResponseChoice:
        text, tool_calls, finish_reason = self._tools(request).parse(ret["text"], ret["meta_info"]["finish_reason"])
        return ChatCompletionResponseChoice(
            index=index,
            message=ChatMessage(role="assistant", content=text, tool_calls=tool_calls),
            logprobs=self._logprobs(ret["meta_info"]) if request.logprobs else None,
            **finish_reason_fields(finish_reason),
        )

    def _generate_stream(self, request: ChatCompletionRequest, response_id: str, chunks: AsyncIterator[dict]):
        tools = self._tools(request)
        return super()._generate_stream(request, response_id, tools.stream(chunks) if tools.active else chunks)

    def _stream_openings(self, request: ChatCompletionRequest, response_id: str) -> list[ChatCompletionStreamResponse]:
        # OpenAI opens every choice with a delta that carries only the role.
        opening = DeltaMessage(role="assistant", content="")
        choices = [ChatCompletionResponseStreamChoice(index=i, delta=opening) for i in range(request.n)]
        return [self._stream_response(request, response_id, [choice]) for choice in choices]

    def _stream_choice(
        self, request: ChatCompletionRequest, index: int, chunk: dict, first: bool
    ) -> ChatCompletionResponseStreamChoice:
        meta = chunk["meta_info"]
        return ChatCompletionResponseStreamChoice(
            index=index,
            delta=DeltaMessage(content=chunk["text"] or None, tool_calls=chunk.get("tool_calls") or None),
            logprobs=self._logprobs(meta) if request.logprobs else None,
            **finish_reason_fields(meta["finish_reason"]),
        )

    def _logprobs(self, meta: dict) -> ChoiceLogprobs:
        tops = meta.get("output_top_logprobs") or []
        content = []
        for k, (logprob, token_id, _) in enumerate(meta.get("output_token_logprobs") or []):
            token = self._token_text(token_id)
            top = tops[k] if k < len(tops) and tops[k] else []
            content.append(
                ChatCompletionTokenLogprob(
                    token=token,
                    bytes=list(token.encode("utf-8")),
                    logprob=logprob,
                    top_logprobs=[self._top_logprob(t, lp) for lp, t, _ in top],
                )
            )
        return ChoiceLogprobs(content=content)

    def _top_logprob(self, token_id: int, logprob: float) -> TopLogprob:
        token = self._token_text(token_id)
        return TopLogprob(token=token, bytes=list(token.encode("utf-8")), logprob=logprob)


def _with_dict_arguments(call: dict) -> dict:
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            return {**call, "function": {**function, "arguments": json.loads(function["arguments"])}}
        except json.JSONDecodeError:
            raise ValueError("a tool call's arguments in messages are not JSON") from None
    return call
