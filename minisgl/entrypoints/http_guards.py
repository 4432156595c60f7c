"""What keeps a web page the user opens from driving a server on the user's own machine.

A page cannot read a loopback server's answers (CORS), but it can *send* "simple" requests:
a form or a no-cors ``fetch`` POSTs with ``Content-Type: text/plain`` and no preflight, and
its ``Host`` is the loopback name the page aimed at, which HostAllowlistMiddleware accepts.
If a route parsed such a body as JSON, the page could abort every request, flush the cache or
make the server generate. ``CrossSiteMiddleware`` closes that, and bounds the body's nesting:

- a request with a body must say ``Content-Type: application/json`` (415 otherwise): a
  browser sends that type cross-site only after a CORS preflight, which this server never
  grants. A POST with no body and no type (``curl -X POST /flush_cache``) passes.
- when the server is bound to loopback, a request whose ``Origin`` is not a loopback origin
  (or one of ``--allowed-origins``; ``*`` turns the check off) is a 403. Browsers send
  ``Origin`` on every cross-origin POST; command-line clients send none.
- a JSON body nested deeper than ``MAX_JSON_DEPTH`` is a 400 before any parser recurses.

SGLang has none of these (it leaves them to a proxy); its /generate parses any body as JSON.
"""

from __future__ import annotations

import hmac
from http import HTTPStatus
from typing import Optional
from urllib.parse import urlsplit

from minisgl.entrypoints.http_middleware import LOOPBACK_HOST_NAMES, _replay, _send_error, is_loopback
from minisgl.entrypoints.openai.serving_base import create_error_response
from minisgl.json_limits import json_depth

# Deep enough for any real request (a chat request with a schema of 40 nested objects is ~90).
MAX_JSON_DEPTH = 128
_BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def is_loopback_origin(origin: str) -> bool:
    """``http://localhost:3000`` and ``https://127.0.0.1`` are; ``null`` (a sandboxed page, a
    file://) and any other host are not."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or parts.hostname is None:
        return False
    return parts.hostname in LOOPBACK_HOST_NAMES or is_loopback(parts.hostname)


def parse_allowed_origins(value: Optional[str]) -> frozenset[str]:
    """``--allowed-origins``: a comma-separated list of origins, or ``*`` for any."""
    return frozenset(o.strip().rstrip("/") for o in (value or "").split(",") if o.strip())


class CrossSiteMiddleware:
    """The three checks of the module docstring; sits inside RequestBodyMiddleware, which has
    read the whole body already, so the first ``receive`` returns all of it."""

    def __init__(self, app, check_origin: bool, allowed_origins: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.check_origin = check_origin and "*" not in allowed_origins
        self.allowed_origins = allowed_origins

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin = headers.get(b"origin", b"").decode("latin-1").rstrip("/")
        if self.check_origin and origin and not is_loopback_origin(origin) and origin not in self.allowed_origins:
            message = (
                f"Cross-origin request from {origin!r} refused: this server is bound to loopback "
                "(--allowed-origins lists origins to admit)."
            )
            await _send_error(scope, receive, send, message, HTTPStatus.FORBIDDEN)
            return
        message = await receive()
        body = message.get("body", b"")
        content_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if (body or content_type) and content_type != "application/json":
            shown = content_type or "none"
            await _send_error(
                scope,
                receive,
                send,
                f"Content-Type must be application/json, got {shown}.",
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            )
            return
        depth = json_depth(body.decode("latin-1"))  # brackets and quotes are ASCII in any UTF-8 text
        if depth > MAX_JSON_DEPTH:
            message = f"The JSON body nests {depth} levels deep; the limit is {MAX_JSON_DEPTH}."
            await _send_error(scope, receive, send, message, HTTPStatus.BAD_REQUEST)
            return
        await self.app(scope, _replay(body, receive), send)


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
