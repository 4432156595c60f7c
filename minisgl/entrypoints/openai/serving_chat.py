"""OpenAIServingChat: /v1/chat/completions on top of the TokenizerManager.

Mirrors python/sglang/srt/entrypoints/openai/serving_chat.py (_validate_request,
_convert_to_internal_request, _process_messages, _apply_jinja_template,
_generate_chat_stream, _build_chat_response). The prompt is the tokenizer's own
chat template with ``add_generation_prompt=True``. Omitted: tools and tool
calls, reasoning parsers, multimodal content, continue_final_message.
"""

from __future__ import annotations

from typing import Optional

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
        return self._validate_max_tokens(request.max_tokens, "max_tokens") or self._validate_max_tokens(
            request.max_completion_tokens, "max_completion_tokens"
        )

    def _convert_to_internal_request(self, request: ChatCompletionRequest) -> GenerateReqInput:
        max_new_tokens = request.max_tokens
        if request.max_completion_tokens is not None:
            max_new_tokens = request.max_completion_tokens
        return GenerateReqInput(
            input_ids=self._apply_jinja_template(request),
            # None: generate up to the context length, as OpenAI does when max_tokens is unset.
            sampling_params=self._build_sampling_params(request, request.temperature, max_new_tokens),
            return_logprob=request.logprobs,
            top_logprobs_num=request.top_logprobs or 0,
            **self._side_outputs(request),
        )

    def _apply_jinja_template(self, request: ChatCompletionRequest) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; use /v1/completions")
        messages = [{"role": m.role, "content": self._process_content(m.content)} for m in request.messages]
        try:
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # a template may raise anything on messages it does not accept
            raise ValueError(f"the chat template rejected the messages: {e}") from None
        check_text("messages", prompt)  # a lone surrogate in a message would fail inside the tokenizer
        # The template already wrote any BOS it wants; adding special tokens again would double it.
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    @staticmethod
    def _process_content(content) -> str:
        if content is None or isinstance(content, str):
            return content or ""
        return "\n".join(part.text for part in content)

    response_cls = ChatCompletionResponse
    stream_response_cls = ChatCompletionStreamResponse
    id_prefix = "chatcmpl"

    def _response_choice(self, request: ChatCompletionRequest, index: int, ret: dict) -> ChatCompletionResponseChoice:
        return ChatCompletionResponseChoice(
            index=index,
            message=ChatMessage(role="assistant", content=ret["text"]),
            logprobs=self._logprobs(ret["meta_info"]) if request.logprobs else None,
            **finish_reason_fields(ret["meta_info"]["finish_reason"]),
        )

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
            delta=DeltaMessage(content=chunk["text"] or None),
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
