"""The HTTP server's defences, with uvicorn's and Starlette's own means.

Beyond SGLang, which leaves these to a proxy in front of it:

- ``HostAllowlistMiddleware``: a server bound to loopback answers only requests whose
  ``Host`` is a loopback name, so a web page cannot reach it by DNS rebinding.
- ``DrainMiddleware``: counts requests in flight and, once the server is draining for a
  graceful shutdown, answers new ones 503.
- ``RequestBodyMiddleware``: reads the body before the app does, refusing one larger than
  ``--max-request-bytes`` (413), one that stalls between chunks (``--http-read-timeout``)
  or one not complete within ``--http-body-timeout`` of its first byte (408): a body
  trickled a byte a second never stalls, so only the whole-body deadline ends it.
- ``HeaderTimeoutH11Protocol``: uvicorn's HTTP/1.1 protocol with a deadline for the
  request head; uvicorn's keep-alive timer stops at a client's first byte, so a client
  that sends its headers a byte at a time (slowloris) held its connection forever.
- ``GracefulServer``: uvicorn's Server, with SIGTERM first draining: stop admitting,
  let requests in flight finish up to a timeout, then end the rest with an error (a
  streaming client gets it as its last event), then exit as uvicorn does.

All are plain ASGI middleware, not ``BaseHTTPMiddleware``, so a streaming client's
disconnect reaches the route untouched. Error bodies have OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from http import HTTPStatus
from typing import Callable, Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from minisgl.entrypoints.openai.serving_base import create_error_response

logger = logging.getLogger(__name__)

LOOPBACK_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_without_port(host: str) -> str:
    """``localhost:8000`` -> ``localhost``; ``[::1]:8000`` -> ``[::1]``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


async def _send_error(scope, receive, send, message: str, status: HTTPStatus) -> None:
    await create_error_response(message, status)(scope, receive, send)


class HostAllowlistMiddleware:
    """Refuse (400) a request whose Host header is not a loopback name, any port."""

    def __init__(self, app, allowed_hosts: tuple[str, ...] = LOOPBACK_HOST_NAMES) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_without_port(host) not in self.allowed_hosts:
                # A DNS-rebinding page sends its own domain here; a local client sends a loopback name.
                message = f"Invalid Host header {host!r}: this server answers only loopback names."
                await _send_error(scope, receive, send, message, HTTPStatus.BAD_REQUEST)
                return
        await self.app(scope, receive, send)


class DrainMiddleware:
    """Count the HTTP requests in flight; while draining, answer every new one 503."""

    def __init__(self, app) -> None:
        self.app = app
        self.draining = False
        self.num_inflight = 0
        self._idle: Optional[asyncio.Event] = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining:
            await _send_error(scope, receive, send, "The server is shutting down.", HTTPStatus.SERVICE_UNAVAILABLE)
            return
        self.num_inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.num_inflight -= 1
            if self.num_inflight == 0 and self._idle is not None:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight, or the timeout; True if none is."""
        self._idle = asyncio.Event()
        if self.num_inflight == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


class RequestBodyMiddleware:
    """Read the whole body first: over ``max_bytes`` is a 413; a stall of ``timeout`` s, or a
    body not in within ``body_timeout`` s, a 408.

    The app then reads the body from memory; what the client sends afterwards (its
    disconnect) still reaches the app through the original ``receive``."""

    def __init__(self, app, max_bytes: int, timeout: float, body_timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"The request body is larger than the server's limit of {self.max_bytes} bytes."
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_error(scope, receive, send, too_large, HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            return
        chunks, size, more = [], 0, True
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        while more:
            left = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), min(self.timeout, max(left, 0)))
            except asyncio.TimeoutError:
                if left <= self.timeout:
                    message = f"The request body was not complete within --http-body-timeout {self.body_timeout} s."
                else:
                    message = f"The request body was not received within {self.timeout} s."
                await _send_error(scope, receive, send, message, HTTPStatus.REQUEST_TIMEOUT)
                return
            if message["type"] == "http.disconnect":
                return  # nobody to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:  # a chunked body has no Content-Length to check first
                await _send_error(scope, receive, send, too_large, HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
                return
        await self.app(scope, _replay(b"".join(chunks), receive), send)


def _replay(body: bytes, receive: Callable):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's H11Protocol; a connection whose request head is not complete within
    ``header_timeout`` seconds of it opening (or of its last response) is closed."""

    header_timeout = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = None
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout_handler)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout_handler(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()  # a head that never came: nothing to answer

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()  # the head is in; the body has its own timeout

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()  # the next request on this keep-alive connection

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)


def harden(app, server_args, loopback_only: bool) -> tuple:
    """Wrap ``app`` in the middleware above; return the ASGI app to serve and its DrainMiddleware.

    Outermost first: the Host check, the drain gate, the body limits, the cross-site checks
    (http_guards.py), then the app."""
    from minisgl.entrypoints.http_guards import CrossSiteMiddleware, parse_allowed_origins

    guarded = CrossSiteMiddleware(app, loopback_only, parse_allowed_origins(server_args.allowed_origins))
    body = RequestBodyMiddleware(
        guarded, server_args.max_request_bytes, server_args.http_read_timeout, server_args.http_body_timeout
    )
    drain = DrainMiddleware(body)
    app.state.drain = drain  # /get_server_info reports the requests in flight
    return (HostAllowlistMiddleware(drain) if loopback_only else drain), drain


def header_timeout_protocol(timeout: float) -> type:
    """The protocol class for uvicorn.Config(http=...), with this header deadline."""
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), {"header_timeout": timeout})


class GracefulServer(uvicorn.Server):
    """On the first SIGTERM (or SIGINT): drain, then shut down as uvicorn does.

    ``drain`` answers new requests 503 and waits up to ``timeout`` seconds for those in
    flight; ``stop_engine`` then ends the rest with an error (their streams' last event)."""

    def __init__(self, config: uvicorn.Config, drain: DrainMiddleware, stop_engine: Callable, timeout: float):
        super().__init__(config)
        self.drain = drain
        self.stop_engine = stop_engine
        self.drain_timeout = timeout
        self._drain_task: Optional[asyncio.Task] = None

    def handle_exit(self, sig: int, frame) -> None:
        if self._drain_task is not None or self.drain.draining or sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self._start_drain, sig, frame)

    def _start_drain(self, sig: int, frame) -> None:
        self._drain_task = asyncio.ensure_future(self._drain(sig, frame))

    async def _drain(self, sig: int, frame) -> None:
        self.drain.draining = True
        logger.warning("draining: %d request(s) in flight, up to %.0f s", self.drain.num_inflight, self.drain_timeout)
        if not await self.drain.wait_idle(self.drain_timeout):
            logger.warning("%d request(s) still in flight: aborting them", self.drain.num_inflight)
            await asyncio.get_running_loop().run_in_executor(None, self.stop_engine)
            await self.drain.wait_idle(5.0)  # their error events go out
        super().handle_exit(sig, frame)
