"""OpenAIServingCompletion: /v1/completions on top of the TokenizerManager.

Mirrors python/sglang/srt/entrypoints/openai/serving_completions.py
(_validate_request, _convert_to_internal_request, _build_sampling_params,
_generate_completion_stream, _build_completion_response). A prompt may be a
string, a list of strings, token ids or a list of id lists; each of a batch's
prompts is sampled n times, and choice ``i * n + j`` is prompt i's sample j, as
in OpenAI. ``echo`` prepends the prompt (and, with logprobs, the prompt's logprobs);
``best_of`` must equal n. Omitted: suffix.
"""

from __future__ import annotations

from typing import Optional

from minisgl.entrypoints.openai.protocol import (
    MAX_COMPLETION_LOGPROBS,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    LogProbs,
)
from minisgl.entrypoints.openai.serving_base import OpenAIServingBase, finish_reason_fields
from minisgl.managers.io_struct import GenerateReqInput


class OpenAIServingCompletion(OpenAIServingBase):
    """/v1/completions: prompts in, ``text_completion`` objects (or their stream) out."""

    def _validate_request(self, request: CompletionRequest) -> Optional[str]:
        if request.best_of is not None and request.best_of != request.n:
            return f"best_of must equal n ({request.n}): minisgl returns every sample it draws, got {request.best_of}"
        if request.logprobs is not None and not 0 <= request.logprobs <= MAX_COMPLETION_LOGPROBS:
            return f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {request.logprobs}"
        return self._validate_max_tokens(request.max_tokens, "max_tokens")

    def _convert_to_internal_request(self, request: CompletionRequest) -> GenerateReqInput:
        prompt = request.prompt
        is_ids = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)
        want_logprobs = request.logprobs is not None
        return GenerateReqInput(
            text=None if is_ids else prompt,
            input_ids=prompt if is_ids else None,
            sampling_params=self._build_sampling_params(request, request.temperature, request.max_tokens),
            return_logprob=want_logprobs,
            top_logprobs_num=request.logprobs or 0,
            # echo with logprobs: the prompt's logprobs from its first token on.
            logprob_start_len=0 if request.echo and want_logprobs else -1,
            **self._side_outputs(request),
        )

    def _prompt_texts(self, request: CompletionRequest) -> list[str]:
        """Each prompt's text, for echo."""
        prompt = request.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and isinstance(prompt[0], int):
            return [self.tokenizer.decode(prompt)]
        return [p if isinstance(p, str) else self.tokenizer.decode(p) for p in prompt]

    response_cls = CompletionResponse
    stream_response_cls = CompletionStreamResponse
    id_prefix = "cmpl"

    def _response_choice(self, request: CompletionRequest, index: int, ret: dict) -> CompletionResponseChoice:
        echo = self._prompt_texts(request)[index // request.n] if request.echo else ""
        return CompletionResponseChoice(
            index=index,
            text=echo + ret["text"],
            logprobs=self._logprobs(ret["meta_info"], request.echo) if request.logprobs is not None else None,
            **finish_reason_fields(ret["meta_info"]["finish_reason"]),
        )

    def _stream_choice(
        self, request: CompletionRequest, index: int, chunk: dict, first: bool
    ) -> CompletionResponseStreamChoice:
        meta = chunk["meta_info"]
        echo = request.echo and first  # the prompt goes out once, before the first text
        return CompletionResponseStreamChoice(
            index=index,
            text=(self._prompt_texts(request)[index // request.n] if echo else "") + chunk["text"],
            logprobs=self._logprobs(meta, echo) if request.logprobs is not None else None,
            **finish_reason_fields(meta["finish_reason"]),
        )

    def _logprobs(self, meta: dict, with_prompt: bool) -> LogProbs:
        entries = list(meta.get("output_token_logprobs") or [])
        tops = list(meta.get("output_top_logprobs") or [])
        if with_prompt:
            prompt = meta.get("input_token_logprobs") or []
            entries = prompt + entries
            tops = list(meta.get("input_top_logprobs") or [None] * len(prompt)) + tops
        logprobs = LogProbs()
        offset = 0
        for k, (logprob, token_id, _) in enumerate(entries):
            token = self._token_text(token_id)
            logprobs.tokens.append(token)
            logprobs.token_logprobs.append(logprob)
            logprobs.text_offset.append(offset)
            offset += len(token)
            top = tops[k] if k < len(tops) else None
            logprobs.top_logprobs.append({self._token_text(t): lp for lp, t, _ in top} if top else None)
        return logprobs
