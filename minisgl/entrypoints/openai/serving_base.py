"""OpenAIServingBase: what the completions and chat handlers share: checks, errors, streaming.

Mirrors python/sglang/srt/entrypoints/openai/serving_base.py (handle_request,
_validate_request, _convert_to_internal_request, _handle_streaming_request,
_handle_non_streaming_request, create_error_response). A subclass turns its
OpenAI request into a GenerateReqInput and the TokenizerManager's results back
into OpenAI responses. Omitted: LoRA adapters named in ``model``, routing keys,
custom labels, request-id prefixes from headers.
"""

from __future__ import annotations

import uuid
from http import HTTPStatus
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from minisgl.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, SamplingFields, UsageInfo
from minisgl.managers.io_struct import GenerateReqInput, check_text
from minisgl.managers.scheduler_driver import SchedulerStoppedError
from minisgl.managers.tokenizer_manager import TokenizerManager


def error_body(message: str, status_code: int) -> ErrorResponse:
    # A message may quote the client's input, which may hold a lone surrogate that no UTF-8
    # response can carry: escape it rather than fail while reporting the failure.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if status_code == HTTPStatus.UNAUTHORIZED:
        error_type = "authentication_error"
    else:
        error_type = "invalid_request_error" if status_code < 500 else "server_error"
    return ErrorResponse(error=ErrorInfo(message=message, type=error_type, code=int(status_code)))


def error_status(e: Exception) -> int:
    """The status an error that ends a request stands for: 503 when the scheduler has stopped."""
    return HTTPStatus.SERVICE_UNAVAILABLE if isinstance(e, SchedulerStoppedError) else HTTPStatus.INTERNAL_SERVER_ERROR


def create_error_response(message: str, status_code: int = HTTPStatus.BAD_REQUEST) -> JSONResponse:
    """OpenAI's error body with a 4xx/5xx status; the openai client raises it as e.g. BadRequestError."""
    return JSONResponse(error_body(message, status_code).model_dump(), status_code=int(status_code))


def model_name_error(model: str, served_model_name: str) -> str | None:
    """SGLang serves one model under any name a request gives (a client's "default" included, and the
    response echoes it); only its "base:adapter" form means something else, a LoRA adapter, which
    minisgl refuses by name instead of answering with the base model. The name is echoed, so it
    must be text a UTF-8 response can carry."""
    try:
        check_text("model", model)
    except ValueError as e:
        return str(e)
    if model != served_model_name and ":" in model:
        return f"model {model!r} names LoRA adapter {model.split(':', 1)[1]!r}: minisgl does not support LoRA adapters"
    return None


class OpenAIServingBase:
    """One OpenAI endpoint over the TokenizerManager: validation, then stream or not."""

    def __init__(self, tokenizer_manager: TokenizerManager, served_model_name: str) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.tokenizer = tokenizer_manager.tokenizer
        self.served_model_name = served_model_name

    async def handle_request(self, request: SamplingFields, raw_request: Request) -> Response:
        error = model_name_error(request.model, self.served_model_name) or self._validate_request(request)
        if error is not None:
            return create_error_response(error)
        try:
            adapted = self._convert_to_internal_request(request)
        except ValueError as e:
            return create_error_response(str(e))
        response_id = uuid.uuid4().hex
        adapted.rid = request.rid if request.rid is not None else response_id
        if request.stream:
            return await self._handle_streaming_request(adapted, request, raw_request, response_id)
        return await self._handle_non_streaming_request(adapted, request, raw_request, response_id)

    async def _handle_non_streaming_request(
        self, adapted: GenerateReqInput, request, raw_request: Request, response_id: str
    ) -> Response:
        try:
            ret = await anext(self.tokenizer_manager.generate_request(adapted, raw_request))
        except ValueError as e:
            return create_error_response(str(e))
        response = self._build_response(request, response_id, ret if isinstance(ret, list) else [ret])
        return JSONResponse(response.model_dump())

    async def _handle_streaming_request(
        self, adapted: GenerateReqInput, request, raw_request: Request, response_id: str
    ) -> Response:
        # The OpenAI stream is of deltas, whatever --stream-output says about /generate.
        stream = self.tokenizer_manager.generate_request(adapted, raw_request, stream_deltas=True)
        try:
            # Validation runs before the first chunk: a bad request gets a 400, not a broken stream.
            first = await anext(stream)
        except ValueError as e:
            return create_error_response(str(e))

        async def chunks() -> AsyncIterator[dict]:
            yield first
            async for chunk in stream:
                yield chunk

        async def sse() -> AsyncIterator[str]:
            try:
                async for event in self._generate_stream(request, response_id, chunks()):
                    yield f"data: {event.model_dump_json()}\n\n"
            except Exception as e:
                # The status line has gone out; the error can only travel in the stream (SGLang's way).
                yield f"data: {error_body(str(e), error_status(e)).model_dump_json()}\n\n"
            finally:
                # Closing the TokenizerManager's generator aborts whatever has not finished,
                # which is how a client that hangs up frees its KV.
                await stream.aclose()
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def _generate_stream(
        self, request, response_id: str, chunks: AsyncIterator[dict]
    ) -> AsyncIterator[BaseModel]:
        """The loop both endpoints stream with: one event per chunk that shows something, then usage."""
        for opening in self._stream_openings(request, response_id):
            yield opening
        final_metas: dict[int, dict] = {}
        started: set[int] = set()
        async for chunk in chunks:
            index = chunk.get("index", 0)
            meta = chunk["meta_info"]
            if meta["finish_reason"] is not None:
                final_metas[index] = meta
            elif not chunk["text"] and not meta.get("output_token_logprobs") and not chunk.get("tool_calls"):
                continue  # nothing to show yet (a partial character, or a possible stop string)
            yield self._stream_event(request, response_id, index, chunk, first=index not in started)
            started.add(index)
        if request.stream_options is not None and request.stream_options.include_usage:
            metas = [final_metas[i] for i in sorted(final_metas)]
            yield self._stream_usage(request, response_id, usage_of(metas, request.n))

    # ---- what subclasses provide -----------------------------------------------------------

    def _validate_request(self, request) -> Optional[str]:
        """An error message for values the OpenAI API forbids, or None."""
        raise NotImplementedError

    def _convert_to_internal_request(self, request) -> GenerateReqInput:
        raise NotImplementedError

    def _response_choice(self, request, index: int, ret: dict) -> BaseModel:
        """Choice ``index`` of a whole response, from the TokenizerManager's result ``ret``."""
        raise NotImplementedError

    def _stream_openings(self, request, response_id: str) -> list[BaseModel]:
        return []

    def _stream_choice(self, request, index: int, chunk: dict, first: bool) -> BaseModel:
        """Choice ``index`` of one stream event, from a chunk of deltas (``first``: its first event)."""
        raise NotImplementedError

    # ---- responses, assembled the same way for both endpoints ------------------------------

    response_cls: type[BaseModel]
    stream_response_cls: type[BaseModel]
    id_prefix: str

    def _build_response(self, request, response_id: str, rets: list[dict]) -> BaseModel:
        return self.response_cls(
            id=f"{self.id_prefix}-{response_id}",
            model=request.model,
            choices=[self._response_choice(request, i, ret) for i, ret in enumerate(rets)],
            usage=usage_of([ret["meta_info"] for ret in rets], request.n),
        )

    def _stream_response(self, request, response_id: str, choices: list, usage=None) -> BaseModel:
        return self.stream_response_cls(
            id=f"{self.id_prefix}-{response_id}", model=request.model, choices=choices, usage=usage
        )

    def _stream_event(self, request, response_id: str, index: int, chunk: dict, first: bool) -> BaseModel:
        return self._stream_response(request, response_id, [self._stream_choice(request, index, chunk, first)])

    def _stream_usage(self, request, response_id: str, usage: UsageInfo) -> BaseModel:
        return self._stream_response(request, response_id, [], usage)

    # ---- shared helpers --------------------------------------------------------------------

    @staticmethod
    def _build_sampling_params(request: SamplingFields, temperature: float, max_new_tokens: Optional[int]) -> dict:
        return {
            "temperature": temperature,
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": request.min_tokens,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "min_p": request.min_p,
            "frequency_penalty": request.frequency_penalty,
            "presence_penalty": request.presence_penalty,
            "repetition_penalty": request.repetition_penalty,
            "stop": request.stop,
            "stop_token_ids": request.stop_token_ids,
            "stop_regex": request.stop_regex,
            "no_stop_trim": request.no_stop_trim,
            "ignore_eos": request.ignore_eos,
            "skip_special_tokens": request.skip_special_tokens,
            "logit_bias": request.logit_bias,
            "sampling_seed": request.seed,
            "custom_params": request.custom_params,
            "n": request.n,
            "json_schema": request.response_format.to_json_schema() if request.response_format else request.json_schema,
            "regex": request.regex,
            "ebnf": request.ebnf,
        }

    @staticmethod
    def _side_outputs(request: SamplingFields) -> dict:
        """The GenerateReqInput fields both endpoints pass through unchanged."""
        return {
            "stream": request.stream,
            "return_hidden_states": request.return_hidden_states,
            "return_routed_experts": request.return_routed_experts,
            "custom_logit_processor": request.custom_logit_processor,
        }

    @staticmethod
    def _validate_max_tokens(value: Optional[int], name: str) -> Optional[str]:
        if value is not None and value < 1:
            return f"{name} must be at least 1, got {value}"
        return None

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


def finish_reason_fields(finish_reason: Optional[dict[str, Any]]) -> dict[str, Any]:
    """SGLang's finish_reason dict -> OpenAI's "stop" | "length" (| "abort"), plus the matched stop."""
    if finish_reason is None:
        return {"finish_reason": None, "matched_stop": None}
    return {"finish_reason": finish_reason["type"], "matched_stop": finish_reason.get("matched")}


def usage_of(metas: list[dict], n: int) -> UsageInfo:
    """Token counts over all choices; a prompt sampled n times is counted once, as OpenAI does."""
    prompt_tokens = sum(m["prompt_tokens"] for i, m in enumerate(metas) if i % n == 0)
    completion_tokens = sum(m["completion_tokens"] for m in metas)
    return UsageInfo(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )
