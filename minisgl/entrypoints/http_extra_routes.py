"""The server's smaller SGLang routes: profiling, /server_info, and the OpenAI routes refused by name.

Mirrors python/sglang/srt/entrypoints/http_server.py's /start_profile and /stop_profile
(a body of SGLang's ProfileReqInput fields, all optional), /server_info (the name sglang-router
asks first; /get_server_info is its older spelling), and answers /v1/responses, which minisgl
does not implement, with a 400 that names it rather than a bare 404. http_server.py includes
this router; the routes live here to keep that file small.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from minisgl.entrypoints.openai.serving_base import create_error_response

router = APIRouter()

# SGLang's ProfileReqInput fields minisgl takes; the others (num_steps, with_stack,
# record_shapes, profile_by_stage, merge_profiles, ...) are refused by name.
_PROFILE_FIELDS = ("output_dir", "activities")


@router.post("/start_profile")
async def start_profile(request: Request) -> Response:
    body = await request.body()
    try:
        fields = (await request.json()) if body else {}
    except ValueError as e:
        return create_error_response(f"malformed JSON body: {e}")
    if not isinstance(fields, dict):
        return create_error_response("the body must be a JSON object")
    unknown = sorted(set(fields) - set(_PROFILE_FIELDS))
    if unknown:
        return create_error_response(f"minisgl does not support {unknown[0]} (profiler options: {_PROFILE_FIELDS})")
    try:
        await request.app.state.tokenizer_manager.start_profile(fields.get("output_dir"), fields.get("activities"))
    except (RuntimeError, ValueError) as e:
        return create_error_response(str(e))
    return Response("Start profiling.\n")


@router.post("/stop_profile")
async def stop_profile(request: Request) -> Response:
    try:
        path = await request.app.state.tokenizer_manager.stop_profile()
    except RuntimeError as e:
        return create_error_response(str(e))
    return JSONResponse({"message": "Stop profiling.", "trace_path": path})


@router.api_route("/v1/responses", methods=["GET", "POST"])
@router.api_route("/v1/responses/{response_id:path}", methods=["GET", "POST", "DELETE"])
async def responses_api(request: Request) -> Response:
    return create_error_response(
        "minisgl does not support the Responses API (/v1/responses); use /v1/chat/completions",
        HTTPStatus.BAD_REQUEST,
    )
