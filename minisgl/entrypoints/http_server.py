"""The HTTP server: FastAPI routes over one TokenizerManager, served by uvicorn.

Mirrors python/sglang/srt/entrypoints/http_server.py: the native routes (/generate,
/health, /health_generate, /[get_]server_info, /get_model_info, /tokenize, /detokenize,
/flush_cache, /abort_request, the expert-distribution routes), the OpenAI routes
(/v1/completions, /v1/chat/completions, /v1/models[/{id}]; /v1/embeddings in
openai/serving_embedding.py; profiling and refusals in http_extra_routes.py), /metrics with
--enable-metrics, the handlers that turn FastAPI's 422 into a 400, the API-key middleware
(SGLang's utils/auth.py) and launch_server, which adds the defences of http_middleware.py.
Control routes are POST-only (no cross-site GET flushes the cache). The app is built in
``create_app`` (SGLang: module globals), so tests run it in-process. Errors use OpenAI's
``{"error": {...}}``. Omitted: weight updates, LoRA, sessions, Ollama/SageMaker/Vertex, warm-up.
"""

from __future__ import annotations

import contextlib
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

from minisgl.entrypoints import http_extra_routes as extra_routes
from minisgl.entrypoints.http_errors import (
    http_exception_handler,
    internal_error_handler,
    validation_exception_handler,
)
from minisgl.entrypoints.http_guards import APIKeyMiddleware
from minisgl.entrypoints.http_middleware import GracefulServer, harden, header_timeout_protocol, is_loopback
from minisgl.entrypoints.openai import serving_embedding
from minisgl.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from minisgl.entrypoints.openai.serving_base import create_error_response, error_body, error_status
from minisgl.entrypoints.openai.serving_chat import OpenAIServingChat
from minisgl.entrypoints.openai.serving_completions import OpenAIServingCompletion
from minisgl.managers.io_struct import GenerateReqInput
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

logger = logging.getLogger(__name__)

router = APIRouter()


def _tokenizer_manager(request: Request) -> TokenizerManager:
    return request.app.state.tokenizer_manager


def _jsonable(obj):  # meta_info and expert-distribution dumps may hold tensors (routed experts, counts)
    return jsonable_encoder(obj, custom_encoder={torch.Tensor: lambda t: t.tolist()})


# ---- native routes --------------------------------------------------------------------------


@router.get("/health")
async def health(request: Request) -> Response:
    # SGLang's /health runs a one-token generation; here a live scheduler thread, and with
    # tensor parallelism every rank process alive, is the test.
    problem = _tokenizer_manager(request).health_problem()
    if problem is None:
        return Response(status_code=HTTPStatus.OK)
    return create_error_response(problem, HTTPStatus.SERVICE_UNAVAILABLE)


@router.get("/server_info")  # the name sglang-router asks first
@router.get("/get_server_info")
async def get_server_info(request: Request) -> dict:
    """Server args, worker limits and the live KV-pool accounting (SGLang lists the last per DP rank)."""
    info = await _tokenizer_manager(request).get_server_info()
    drain = getattr(request.app.state, "drain", None)  # set by launch_server's middleware
    info["num_inflight_http_requests"] = drain.num_inflight if drain is not None else None
    # served_model_name: a ServerArgs field in SGLang, an HTTP flag here; sglang-router names a worker's model by it.
    info["served_model_name"] = request.app.state.served_model_name
    return info


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
    try:
        obj = GenerateReqInput.from_dict(body)
    except (TypeError, ValueError) as e:
        return create_error_response(str(e))
    stream = _tokenizer_manager(request).generate_request(obj, request)
    try:
        first = await anext(stream)
    except ValueError as e:
        return create_error_response(str(e))
    if not obj.stream:
        return JSONResponse(_jsonable(first))

    async def sse() -> AsyncIterator[str]:
        try:
            yield _sse_event(first)
            async for out in stream:
                yield _sse_event(out)
        except Exception as e:
            # The status line has gone out; the error can only travel in the stream.
            yield f"data: {error_body(str(e), error_status(e)).model_dump_json()}\n\n"
        finally:
            await stream.aclose()  # aborts what has not finished: a client that hangs up frees its KV
        yield "data: [DONE]\n\n"

    return StreamingResponse(sse(), media_type="text/event-stream")


def _sse_event(out: dict) -> str:
    return f"data: {JSONResponse(_jsonable(out)).body.decode()}\n\n"


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """SGLang's deep health check: a one-token generation must come back."""
    tm = _tokenizer_manager(request)
    obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0.0})
    try:
        await anext(tm.generate_request(obj, request))
    except Exception as e:
        return create_error_response(f"the health-check generation failed: {e!r}", HTTPStatus.SERVICE_UNAVAILABLE)
    return Response(status_code=HTTPStatus.OK)


@router.get("/model_info")
@router.get("/get_model_info")
async def get_model_info(request: Request) -> dict:
    """SGLang's /get_model_info (also /model_info), which its frontend language reads first."""
    tm = _tokenizer_manager(request)
    hf_config = tm.model_config.hf_config
    return {
        "model_path": tm.server_args.model_path_as_given,  # SGLang's frontend picks its chat template by it
        "tokenizer_path": tm.server_args.tokenizer_path,
        "is_generation": not tm.server_args.is_embedding,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": getattr(hf_config, "model_type", None),
        "architectures": getattr(hf_config, "architectures", None),
    }


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    tm = _tokenizer_manager(request)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    try:
        tokens = await tm.encode_texts(prompts, body.add_special_tokens)
    except ValueError as e:  # a lone surrogate, a text longer than the context could hold
        return create_error_response(str(e))
    if isinstance(body.prompt, str):
        out = TokenizeResponse(tokens=tokens[0], count=len(tokens[0]), max_model_len=tm.context_len)
    else:
        out = TokenizeResponse(tokens=tokens, count=[len(t) for t in tokens], max_model_len=tm.context_len)
    return JSONResponse(out.model_dump())


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    tm = _tokenizer_manager(request)
    single = not body.tokens or isinstance(body.tokens[0], int)
    seqs = [body.tokens] if single else body.tokens
    vocab = tm.worker_info.vocab_size
    if any(not 0 <= t < vocab for seq in seqs for t in seq):
        return create_error_response(f"tokens must be token ids in [0, {vocab})")
    texts = await tm.decode_ids(seqs, body.skip_special_tokens)
    return JSONResponse(DetokenizeResponse(text=texts[0] if single else texts).model_dump())


@router.post("/flush_cache")
async def flush_cache(request: Request) -> Response:
    if await _tokenizer_manager(request).flush_cache():
        return Response("Cache flushed.\n")
    return create_error_response("Cache not flushed: requests are running or waiting.")


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    """SGLang's AbortReq body: ``{"rid": ...}``, or ``{"abort_all": true}``. The requests end with
    an abort finish reason and their KV is freed at the scheduler's next step."""
    try:
        body = await request.json()
    except ValueError as e:
        return create_error_response(f"malformed JSON body: {e}")
    if not isinstance(body, dict) or set(body) - {"rid", "abort_all"}:
        return create_error_response('the body must be {"rid": "..."} or {"abort_all": true}')
    tm = _tokenizer_manager(request)
    if body.get("abort_all") is True:
        for rid in tm.in_flight_rids():
            tm.abort_request(rid)
    elif isinstance(body.get("rid"), str):
        tm.abort_request(body["rid"])
    else:
        return create_error_response('the body must be {"rid": "..."} or {"abort_all": true}')
    return Response()


@router.post("/start_expert_distribution_record")
async def start_expert_distribution_record(request: Request) -> Response:
    tm = _tokenizer_manager(request)
    return await _control(tm, tm.start_expert_distribution_record(), "Start recording the expert distribution.\n")


@router.post("/stop_expert_distribution_record")
async def stop_expert_distribution_record(request: Request) -> Response:
    tm = _tokenizer_manager(request)
    return await _control(tm, tm.stop_expert_distribution_record(), "Stop recording the expert distribution.\n")


@router.post("/dump_expert_distribution_record")
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


def _model_card(request: Request) -> ModelCard:
    tm = _tokenizer_manager(request)
    name = request.app.state.served_model_name
    return ModelCard(id=name, root=tm.server_args.model_path_as_given, max_model_len=tm.context_len)


@router.get("/v1/models")
async def available_models(request: Request) -> ModelList:
    return ModelList(data=[_model_card(request)])


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> Response:
    if model != request.app.state.served_model_name:
        return create_error_response(f"The model `{model}` does not exist.", HTTPStatus.NOT_FOUND)
    return JSONResponse(_model_card(request).model_dump())


async def metrics(request: Request) -> Response:
    """Prometheus' text format (SGLang mounts prometheus_client's app at /metrics); only with --enable-metrics."""
    tm = _tokenizer_manager(request)
    body, content_type = tm.metrics.render(await tm.get_internal_state())
    return Response(body, media_type=content_type)


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
    served_model_name = served_model_name or tokenizer_manager.server_args.model_path_as_given
    app.state.tokenizer_manager = tokenizer_manager
    app.state.served_model_name = served_model_name
    app.state.openai_serving_completion = OpenAIServingCompletion(tokenizer_manager, served_model_name)
    app.state.openai_serving_chat = OpenAIServingChat(tokenizer_manager, served_model_name)
    for routes in (router, extra_routes.router, serving_embedding.router):
        app.include_router(routes)
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
    asgi_app, drain = harden(app, server_args, loopback_only=is_loopback(host))
    config = uvicorn.Config(
        asgi_app,
        host=host,
        port=port,
        log_level=server_args.log_level,
        http=header_timeout_protocol(server_args.http_read_timeout),
        # uvicorn's defaults, stated: an idle keep-alive connection closes after 5 s; a request
        # head over 16 KiB is refused (h11's limit).
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=16 * 1024,
        # After the drain (GracefulServer), what is left is cancelled after this long.
        timeout_graceful_shutdown=5,
    )
    server = GracefulServer(config, drain, tokenizer_manager.shutdown, server_args.graceful_shutdown_timeout)

    def on_fatal_error() -> None:
        # The scheduler has died of an error it could not pin on one request: rather than
        # linger, answering 503 forever, stop, so that a supervisor restarts the process.
        server.should_exit = True

    tokenizer_manager.driver.on_fatal_error = on_fatal_error
    try:
        server.run()
    finally:
        tokenizer_manager.shutdown()  # for a server that never started (port taken); else a no-op
    if tokenizer_manager.error is not None:
        raise SystemExit(f"minisgl: the scheduler failed: {tokenizer_manager.error!r}")
