"""The HTTP server: FastAPI routes over one TokenizerManager, served by uvicorn.

Mirrors python/sglang/srt/entrypoints/http_server.py: the native routes
(/generate, /health, /get_server_info, /flush_cache, the expert-distribution
routes), the OpenAI routes (/v1/completions, /v1/chat/completions, /v1/models),
the exception handlers that turn FastAPI's 422 into a 400, the API-key
middleware (SGLang's utils/auth.py) and launch_server. SGLang keeps the app
and its state in module globals; minisgl builds them in ``create_app``, so a
test can run a server in-process. Errors use OpenAI's nested body
``{"error": {"message", "type", "code"}}`` everywhere. Omitted: weight
updates, LoRA, sessions, profiling, embeddings, tokenize endpoints,
the Ollama/SageMaker/Vertex routes, warm-up requests.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from http import HTTPStatus
from typing import AsyncIterator, Optional

import torch
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minisgl.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from minisgl.entrypoints.openai.serving_base import create_error_response, error_body
from minisgl.entrypoints.openai.serving_chat import OpenAIServingChat
from minisgl.entrypoints.openai.serving_completions import OpenAIServingCompletion
from minisgl.entrypoints.sglang_fields import fill_logprob_texts, without_sglang_defaults
from minisgl.managers.io_struct import GenerateReqInput
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

logger = logging.getLogger(__name__)

router = APIRouter()


def _tokenizer_manager(request: Request) -> TokenizerManager:
    return request.app.state.tokenizer_manager


def _jsonable(obj):
    # meta_info and expert-distribution dumps may hold tensors (routed experts, counts).
    return jsonable_encoder(obj, custom_encoder={torch.Tensor: lambda t: t.tolist()})


# ---- native routes --------------------------------------------------------------------------


@router.get("/health")
async def health(request: Request) -> Response:
    # SGLang's /health runs a one-token generation; here a live scheduler thread is the test.
    tm = _tokenizer_manager(request)
    if tm.is_healthy():
        return Response(status_code=HTTPStatus.OK)
    reason = f"the scheduler failed: {tm.error!r}" if tm.error else "the scheduler has stopped"
    return create_error_response(reason, HTTPStatus.SERVICE_UNAVAILABLE)


@router.get("/get_server_info")
async def get_server_info(request: Request) -> dict:
    """Server args, worker limits and the live KV-pool accounting (SGLang lists the last per DP rank)."""
    # served_model_name: a ServerArgs field in SGLang, an HTTP flag here; sglang-router names a worker's model by it.
    return {
        **await _tokenizer_manager(request).get_server_info(),
        "served_model_name": request.app.state.served_model_name,
    }


@router.get("/get_model_info")
@router.get("/model_info")
async def get_model_info(request: Request) -> dict:
    """What SGLang's clients read first (sgl.RuntimeEndpoint, the router's worker check); a minimal form."""
    tm = _tokenizer_manager(request)
    config = tm.model_config
    return {
        "model_path": tm.server_args.model_path,
        "tokenizer_path": tm.server_args.tokenizer_path,
        "is_generation": config.is_generation,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": getattr(config.hf_config, "model_type", None),
        "architectures": config.architectures,
    }


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate_request(request: Request) -> Response:
    # The body is read as plain JSON, not through a pydantic model: pydantic would coerce
    # "10" to 10 and true to 1, and GenerateReqInput checks types strictly itself.
    try:
        body = await request.json()
    except ValueError as e:
        return create_error_response(f"malformed JSON body: {e}")
    if not isinstance(body, dict):
        return create_error_response("the request body must be a JSON object")
    body, want_logprob_texts = without_sglang_defaults(body)
    try:
        obj = GenerateReqInput(**body)
    except TypeError as e:
        return create_error_response(f"unknown field in the request: {e}")
    stream = _tokenizer_manager(request).generate_request(obj, request)
    try:
        first = await anext(stream)
    except ValueError as e:
        return create_error_response(str(e))
    if not obj.stream:
        if want_logprob_texts:
            fill_logprob_texts(first, _tokenizer_manager(request).tokenizer)
        return JSONResponse(_jsonable(first))

    async def sse() -> AsyncIterator[str]:
        try:
            yield _sse_event(first)
            async for out in stream:
                yield _sse_event(out)
        except Exception as e:
            # The status line has gone out; the error can only travel in the stream.
            yield f"data: {error_body(str(e), HTTPStatus.INTERNAL_SERVER_ERROR).model_dump_json()}\n\n"
        finally:
            await stream.aclose()  # aborts what has not finished: a client that hangs up frees its KV
        yield "data: [DONE]\n\n"

    return StreamingResponse(sse(), media_type="text/event-stream")


def _sse_event(out: dict) -> str:
    return f"data: {JSONResponse(_jsonable(out)).body.decode()}\n\n"


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    if await _tokenizer_manager(request).flush_cache():
        return Response("Cache flushed.\n")
    return create_error_response("Cache not flushed: requests are running or waiting.")


@router.api_route("/start_expert_distribution_record", methods=["GET", "POST"])
async def start_expert_distribution_record(request: Request) -> Response:
    tm = _tokenizer_manager(request)
    return await _control(tm, tm.start_expert_distribution_record(), "Start recording the expert distribution.\n")


@router.api_route("/stop_expert_distribution_record", methods=["GET", "POST"])
async def stop_expert_distribution_record(request: Request) -> Response:
    tm = _tokenizer_manager(request)
    return await _control(tm, tm.stop_expert_distribution_record(), "Stop recording the expert distribution.\n")


@router.api_route("/dump_expert_distribution_record", methods=["GET", "POST"])
async def dump_expert_distribution_record(request: Request) -> Response:
    """SGLang writes the dump to a server-side file; minisgl returns it in the response."""
    tm = _tokenizer_manager(request)
    return await _control(tm, tm.dump_expert_distribution_record())


async def _control(tm: TokenizerManager, call, message: Optional[str] = None) -> Response:
    try:
        result = await call
    except RuntimeError as e:  # e.g. the recorder is off: the server was started without it
        status = HTTPStatus.BAD_REQUEST if tm.is_healthy() else HTTPStatus.SERVICE_UNAVAILABLE
        return create_error_response(str(e), status)
    return Response(message) if message is not None else JSONResponse(_jsonable(result))


# ---- OpenAI routes ----------------------------------------------------------------------------


@router.post("/v1/completions")
async def openai_v1_completions(request: CompletionRequest, raw_request: Request) -> Response:
    return await raw_request.app.state.openai_serving_completion.handle_request(request, raw_request)


@router.post("/v1/chat/completions")
async def openai_v1_chat_completions(request: ChatCompletionRequest, raw_request: Request) -> Response:
    return await raw_request.app.state.openai_serving_chat.handle_request(request, raw_request)


@router.get("/v1/models")
async def available_models(request: Request) -> ModelList:
    tm = _tokenizer_manager(request)
    card = ModelCard(
        id=request.app.state.served_model_name, root=tm.server_args.model_path, max_model_len=tm.context_len
    )
    return ModelList(data=[card])


async def metrics(request: Request) -> Response:
    """Prometheus' text format (SGLang mounts prometheus_client's app at /metrics); only with --enable-metrics."""
    tm = _tokenizer_manager(request)
    body, content_type = tm.metrics.render(await tm.get_internal_state())
    return Response(body, media_type=content_type)


# ---- errors and authentication --------------------------------------------------------------


async def validation_exception_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI answers a body that fails validation with 422; OpenAI's clients expect 400."""
    parts = []
    for err in exc.errors():
        if err["type"] == "json_invalid":
            return create_error_response(f"malformed JSON body: {err.get('ctx', {}).get('error', err['msg'])}")
        where = ".".join(str(p) for p in err["loc"] if p != "body")
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return create_error_response("invalid request: " + "; ".join(parts))


async def http_exception_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return create_error_response(str(exc.detail), exc.status_code)


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    return create_error_response(f"internal server error: {exc!r}", HTTPStatus.INTERNAL_SERVER_ERROR)


class APIKeyMiddleware:
    """Every route but /health needs ``Authorization: Bearer <api_key>``.

    A plain ASGI middleware rather than ``@app.middleware("http")``: Starlette's
    BaseHTTPMiddleware wraps the response stream, and a streaming client's
    disconnect must reach the route untouched to abort its request."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = create_error_response("Incorrect or missing API key.", HTTPStatus.UNAUTHORIZED)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---- assembly and launch --------------------------------------------------------------------


def create_app(
    tokenizer_manager: TokenizerManager, served_model_name: Optional[str] = None, api_key: Optional[str] = None
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # uvicorn re-raises SIGTERM/SIGINT once it has shut down, so code after uvicorn.run
        # may never run; the app's shutdown event is the place to stop the scheduler thread.
        tokenizer_manager.shutdown()

    app = FastAPI(title="minisgl", lifespan=lifespan)
    served_model_name = served_model_name or tokenizer_manager.server_args.model_path
    app.state.tokenizer_manager = tokenizer_manager
    app.state.served_model_name = served_model_name
    app.state.openai_serving_completion = OpenAIServingCompletion(tokenizer_manager, served_model_name)
    app.state.openai_serving_chat = OpenAIServingChat(tokenizer_manager, served_model_name)
    app.include_router(router)
    if tokenizer_manager.server_args.enable_metrics:
        from minisgl.managers.metrics_collector import MetricsCollectors

        tokenizer_manager.metrics = MetricsCollectors(served_model_name)
        app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_exception_handler(RequestValidationError, validation_exception_handler)
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(Exception, internal_error_handler)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    return app


def launch_server(
    server_args: ServerArgs,
    host: str = "127.0.0.1",
    port: int = 30000,
    api_key: Optional[str] = None,
    served_model_name: Optional[str] = None,
) -> None:
    """Load the model, then serve until SIGINT/SIGTERM; the scheduler thread stops with the server."""
    logging.basicConfig(level=server_args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tokenizer_manager = TokenizerManager(server_args, threaded=True)
    app = create_app(tokenizer_manager, served_model_name, api_key)
    # On shutdown uvicorn waits for open requests; a long generation must not hold it forever,
    # and the cancelled requests abort through their generators' cleanup.
    config = uvicorn.Config(app, host=host, port=port, log_level=server_args.log_level, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    def on_fatal_error() -> None:
        # The scheduler has died of an error it could not pin on one request: rather than
        # linger, answering 503 forever, stop, so that a supervisor restarts the process.
        server.should_exit = True

    tokenizer_manager.on_fatal_error = on_fatal_error
    try:
        server.run()
    finally:
        tokenizer_manager.shutdown()  # for a server that never started (port taken); else a no-op
    if tokenizer_manager.error is not None:
        raise SystemExit(f"minisgl: the scheduler failed: {tokenizer_manager.error!r}")
