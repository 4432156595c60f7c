"""The HTTP server's error handlers: every error in OpenAI's body ``{"error": {...}}``.

Mirrors the exception handlers of python/sglang/srt/entrypoints/http_server.py
(validation_exception_handler turns FastAPI's 422 into a 400, as SGLang's does).
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minisgl.entrypoints.openai.serving_base import create_error_response
from minisgl.managers.scheduler_driver import SchedulerStoppedError


async def validation_exception_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI answers a body that fails validation with 422; OpenAI's clients expect 400."""
    parts = []
    for err in exc.errors():
        if err["type"] == "json_invalid":
            return create_error_response(f"malformed JSON body: {err.get('ctx', {}).get('error', err['msg'])}")
        where = ".".join(str(p) for p in err["loc"] if p != "body")
        msg = err["msg"].removeprefix("Value error, ")  # our own refusals read as written
        parts.append(f"{where}: {msg}" if where else msg)
    return create_error_response("invalid request: " + "; ".join(parts))


async def http_exception_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return create_error_response(str(exc.detail), exc.status_code)


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, SchedulerStoppedError):  # cut by a drain's end or a fatal error: not a bug here
        return create_error_response(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)
    return create_error_response(f"internal server error: {exc!r}", HTTPStatus.INTERNAL_SERVER_ERROR)
