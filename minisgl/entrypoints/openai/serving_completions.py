"""OpenAIServingCompletion: /v1/completions on top of the TokenizerManager.

Mirrors python/sglang/srt/entrypoints/openai/serving_completions.py
(_validate_request, _convert_to_internal_request, _build_sampling_params,
_generate_completion_stream, _build_completion_response). A prompt may be a
string, a list of strings, token ids or a list of id lists; each of a batch's
prompts is sampled n times, and choice ``i * n + j`` is prompt i's sample j, as
in OpenAI. Omitted: echo, suffix, best_of, and logprobs while streaming (the
scheduler hands logprobs over only when a request finishes).
"""

from __future__ import annotations

from typing import AsyncIterator, Optional

from minisgl.entrypoints.openai.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    LogProbs,
)
from minisgl.entrypoints.openai.serving_base import OpenAIServingBase, finish_reason_fields, usage_of
from minisgl.managers.io_struct import GenerateReqInput

# OpenAI's limit on top alternatives per token for /v1/completions.
MAX_COMPLETION_LOGPROBS = 5


class OpenAIServingCompletion(OpenAIServingBase):
    """/v1/completions: prompts in, ``text_completion`` objects (or their stream) out."""

    def _validate_request(self, request: CompletionRequest) -> Optional[str]:
        if request.echo:
            return "echo is not supported"
        if request.logprobs is not None:
            if not 0 <= request.logprobs <= MAX_COMPLETION_LOGPROBS:
                return f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {request.logprobs}"
            if request.stream:
                return "logprobs are not supported with stream=true"
        return self._validate_max_tokens(request.max_tokens, "max_tokens")

    def _convert_to_internal_request(self, request: CompletionRequest) -> GenerateReqInput:
        prompt = request.prompt
        is_ids = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)
        return GenerateReqInput(
            text=None if is_ids else prompt,
            input_ids=prompt if is_ids else None,
            sampling_params=self._build_sampling_params(request, request.temperature, request.max_tokens),
            stream=request.stream,
            return_logprob=request.logprobs is not None,
            top_logprobs_num=request.logprobs or 0,
        )

    def _build_response(self, request: CompletionRequest, rid: str, rets: list[dict]) -> CompletionResponse:
        choices = [
            CompletionResponseChoice(
                index=i,
                text=ret["text"],
                logprobs=self._logprobs(ret["meta_info"]) if request.logprobs is not None else None,
                **finish_reason_fields(ret["meta_info"]["finish_reason"]),
            )
            for i, ret in enumerate(rets)
        ]
        return CompletionResponse(
            id=f"cmpl-{rid}",
            model=request.model,
            choices=choices,
            usage=usage_of([ret["meta_info"] for ret in rets], request.n),
        )

    async def _generate_stream(
        self, request: CompletionRequest, rid: str, chunks: AsyncIterator[dict]
    ) -> AsyncIterator[CompletionStreamResponse]:
        final_metas: dict[int, dict] = {}
        async for chunk in chunks:
            index = chunk.get("index", 0)
            meta = chunk["meta_info"]
            if meta["finish_reason"] is not None:
                final_metas[index] = meta
            elif not chunk["text"]:
                continue  # nothing to show yet (a partial character, or a possible stop string)
            choice = CompletionResponseStreamChoice(
                index=index, text=chunk["text"], **finish_reason_fields(meta["finish_reason"])
            )
            yield CompletionStreamResponse(id=f"cmpl-{rid}", model=request.model, choices=[choice])
        if request.stream_options is not None and request.stream_options.include_usage:
            metas = [final_metas[i] for i in sorted(final_metas)]
            yield CompletionStreamResponse(
                id=f"cmpl-{rid}", model=request.model, choices=[], usage=usage_of(metas, request.n)
            )

    def _logprobs(self, meta: dict) -> LogProbs:
        logprobs = LogProbs()
        tops = meta.get("output_top_logprobs") or []
        offset = 0
        for k, (logprob, token_id, _) in enumerate(meta["output_token_logprobs"]):
            token = self._token_text(token_id)
            logprobs.tokens.append(token)
            logprobs.token_logprobs.append(logprob)
            logprobs.text_offset.append(offset)
            offset += len(token)
            top = tops[k] if k < len(tops) else None
            logprobs.top_logprobs.append({self._token_text(t): lp for lp, t, _ in top} if top else None)
        return logprobs
