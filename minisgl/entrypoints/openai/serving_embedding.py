"""/v1/embeddings: OpenAI's embeddings API over managers/embedding.py (servers started with --is-embedding).

Mirrors python/sglang/srt/entrypoints/openai/serving_embedding.py (OpenAIServingEmbedding:
_validate_request, _convert_to_internal_request, _build_embedding_response) and the
EmbeddingRequest/EmbeddingResponse models of its protocol.py. One request may carry a batch
of inputs; they run together. ``encoding_format`` "base64" (the openai client's default)
sends each vector as little-endian float32 bytes, as OpenAI does. ``dimensions`` (Matryoshka
truncation, which SGLang has for some models) is refused by name.
"""

from __future__ import annotations

import base64
from typing import Literal, Optional, Union

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from minisgl.entrypoints.openai.protocol import DEFAULT_MODEL_NAME, UsageInfo
from minisgl.entrypoints.openai.serving_base import create_error_response, model_name_error
from minisgl.managers.embedding import encode

router = APIRouter()


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: str = DEFAULT_MODEL_NAME
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None


class EmbeddingObject(BaseModel):
    object: str = "embedding"
    index: int
    embedding: Union[list[float], str]


class EmbeddingResponse(BaseModel):
    object: str = "list"
    data: list[EmbeddingObject]
    model: str
    usage: UsageInfo


@router.post("/v1/embeddings")
async def openai_v1_embeddings(request: EmbeddingRequest, raw_request: Request) -> Response:
    error = model_name_error(request.model, raw_request.app.state.served_model_name)
    if error is not None:
        return create_error_response(error)
    if request.dimensions is not None:
        return create_error_response("minisgl does not support dimensions (Matryoshka truncation)")
    if isinstance(request.input, list) and not request.input:
        return create_error_response("input must not be empty")
    try:
        results = await encode(raw_request.app.state.tokenizer_manager, request.input)
    except ValueError as e:
        return create_error_response(str(e))
    prompt_tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    response = EmbeddingResponse(
        data=[EmbeddingObject(index=i, embedding=_encoded(r["embedding"], request)) for i, r in enumerate(results)],
        model=request.model,
        usage=UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
    )
    return JSONResponse(response.model_dump())


def _encoded(embedding: list[float], request: EmbeddingRequest) -> Union[list[float], str]:
    if request.encoding_format == "float":
        return embedding
    return base64.b64encode(np.asarray(embedding, dtype="<f4").tobytes()).decode()
