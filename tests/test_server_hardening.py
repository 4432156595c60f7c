"""The HTTP server's defences against clients that send too much, too slowly or from elsewhere,
and its graceful SIGTERM, each against the real uvicorn server on loopback (a subprocess).

The server runs with short limits (a 64 KiB body, a 1 s read timeout) so each case is quick.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.test_server import _free_port

MAX_BYTES = 64 * 1024
READ_TIMEOUT = 1.0
BODY_TIMEOUT = 3.0


def launch(model: str, log_path, *flags: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable, "-m", "minisgl.launch_server", "--model-path", model, "--port", str(port),
        "--max-total-tokens", "4096", "--log-level", "info", *flags,
    ]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the server did not come up:\n{log_path.read_text()}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("hardening") / "server.log"
    flags = ["--max-request-bytes", str(MAX_BYTES), "--http-read-timeout", str(READ_TIMEOUT)]
    flags += ["--http-body-timeout", str(BODY_TIMEOUT)]
    proc, url = launch(tiny_llama, log_path, *flags)
    yield url
    proc.terminate()
    assert proc.wait(timeout=30) == -signal.SIGTERM, log_path.read_text()


def assert_openai_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["type"] and error["message"]
    return error["message"]


def assert_serving(url: str) -> None:
    out = httpx.post(f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=60)
    assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] >= 1


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_body_over_the_limit_is_a_413(server):
    big = {"text": "x" * (MAX_BYTES + 1)}
    message = assert_openai_error(httpx.post(f"{server}/generate", json=big, timeout=30), 413)
    assert str(MAX_BYTES) in message

    def chunks():  # chunked transfer: no Content-Length for the server to check first
        for _ in range(MAX_BYTES // 4096 + 2):
            yield b"x" * 4096

    assert_openai_error(httpx.post(f"{server}/v1/completions", content=chunks(), timeout=30), 413)
    assert_serving(server)


def test_a_body_under_the_limit_still_works(server):
    text = "word " * 200
    body = {"text": text, "sampling_params": {"max_new_tokens": 1}}
    assert httpx.post(f"{server}/generate", json=body, timeout=60).status_code == 200


def test_slowloris_sockets_are_dropped(server):
    # A head sent a byte at a time never completes: the connection closes at the read timeout.
    slow = connect(server)
    start = time.monotonic()
    head = b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    closed = False
    for byte in head:
        try:
            slow.send(bytes([byte]))
        except OSError:
            closed = True
            break
        time.sleep(0.05)
        if time.monotonic() - start > READ_TIMEOUT + 4:
            break
    if not closed:
        slow.settimeout(READ_TIMEOUT + 4)
        try:
            closed = slow.recv(1) == b""
        except ConnectionResetError:
            closed = True
    slow.close()
    assert closed and time.monotonic() - start < READ_TIMEOUT + 4
    # A socket that says nothing at all is dropped too.
    silent = connect(server)
    silent.settimeout(READ_TIMEOUT + 4)
    assert silent.recv(1) == b""
    silent.close()
    assert_serving(server)


def test_a_stalled_body_is_a_408(server):
    sock = connect(server)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"text\": ")  # fmt: skip
    sock.settimeout(READ_TIMEOUT + 5)
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(4096)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply


def test_a_trickled_body_meets_the_whole_body_deadline(server):
    """A byte every 0.3 s never stalls for the 1 s gap timeout; the whole-body deadline ends it."""
    sock = connect(server)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n")  # fmt: skip
    sock.settimeout(0.3)
    reply = b""
    for _ in range(int(4 * BODY_TIMEOUT / 0.3)):  # at most 4x the deadline, then the assert says so
        try:
            sock.send(b" ")
            reply += sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            break
        if b"\r\n\r\n" in reply:
            break
    head, _, body = reply.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1)) if b"content-length" in head.lower() else 0
    sock.settimeout(5)
    while len(body) < length:  # the body may come in a segment of its own
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"--http-body-timeout" in body, body
    assert_serving(server)


CROSS_SITE = [("/generate", '{"text": "hi", "sampling_params": {"max_new_tokens": 1}}'),
              ("/abort_request", '{"abort_all": true}'), ("/flush_cache", "{}")]  # fmt: skip


@pytest.mark.parametrize("route,body", CROSS_SITE)
def test_cross_site_simple_posts_are_refused(server, route, body):
    """What a form or a no-cors fetch on any web page can send: a text/plain body, its own Origin."""
    evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    assert "evil.example" in assert_openai_error(httpx.post(f"{server}{route}", content=body, headers=evil), 403)
    for origin in ("null", "http://127.0.0.1.evil.example:8000"):
        headers = {"Origin": origin, "Content-Type": "application/json"}
        assert_openai_error(httpx.post(f"{server}{route}", content=body, headers=headers), 403)
    plain = {"Content-Type": "text/plain"}
    assert "application/json" in assert_openai_error(httpx.post(f"{server}{route}", content=body, headers=plain), 415)
    # A page on a loopback origin, and a client that sends no Origin, are served.
    local = {"Origin": "http://localhost:3000", "Content-Type": "application/json"}
    assert httpx.post(f"{server}{route}", content=body, headers=local, timeout=60).status_code == 200


@pytest.mark.parametrize("route", ["/generate", "/abort_request", "/v1/completions", "/tokenize"])
def test_a_deeply_nested_body_is_a_400_naming_the_limit(server, route):
    deep = httpx.post(f"{server}{route}", content="[" * 5000, headers={"Content-Type": "application/json"})
    assert "5000 levels" in assert_openai_error(deep, 400)
    assert_serving(server)


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1", "127.0.0.1:80", "[::1]", "[::1]:30000"])
def test_loopback_host_names_are_accepted(server, host):
    assert httpx.get(f"{server}/health", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:3000", "127.0.0.1.evil.example", "localhost.", "::1"])
def test_other_host_names_are_refused(server, host):
    """A DNS-rebinding page reaches 127.0.0.1 with its own name in the Host header."""
    assert "Host" in assert_openai_error(httpx.get(f"{server}/get_server_info", headers={"Host": host}), 400)


@pytest.mark.parametrize(
    "route", ["/flush_cache", "/start_expert_distribution_record", "/stop_expert_distribution_record",
              "/dump_expert_distribution_record"],
)  # fmt: skip
def test_control_routes_are_post_only(server, route):
    assert_openai_error(httpx.get(f"{server}{route}"), 405)


def test_server_info_reports_request_slot_occupancy(server):
    httpx.post(f"{server}/flush_cache")
    info = httpx.get(f"{server}/get_server_info").json()
    assert info["available_req_slots"] == info["max_req_slots"] > 0
    assert info["num_inflight_http_requests"] == 1  # this request
    assert httpx.post(f"{server}/flush_cache").status_code == 200


def _stream(url: str, body: dict, events: list) -> None:
    """Collect the SSE events of one streaming request until the server closes it."""
    try:
        with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=60) as response:
            events.append(("status", response.status_code))
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(("data", line[len("data: ") :]))
    except httpx.TransportError as e:
        events.append(("cut", repr(e)))


def _start_streams(url: str, n: int, max_new_tokens: int, wait_for=any) -> tuple[list, list]:
    """Start n streams and return once `wait_for` (any or all) of them has its first tokens."""
    params = {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}
    streams = [[] for _ in range(n)]
    threads = [threading.Thread(target=_stream, args=(url, {"text": f"story {i}", "sampling_params": params}, ev))
               for i, ev in enumerate(streams)]  # fmt: skip
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not wait_for(len(ev) >= 3 for ev in streams) and time.monotonic() < deadline:
        time.sleep(0.02)
    return streams, threads


def _data(events: list) -> list[dict]:
    return [json.loads(d) for kind, d in events if kind == "data" and d != "[DONE]"]


def test_sigterm_lets_requests_in_flight_finish_and_refuses_new_ones(tiny_llama, tmp_path):
    log_path = tmp_path / "server.log"
    proc, url = launch(tiny_llama, log_path, "--graceful-shutdown-timeout", "60")
    # Long enough (seconds: 4 streams of 300 steps) that the drain is still on when the late request
    # arrives 0.3 s after the signal; on a busy machine the streams only take longer.
    # Every stream must be in flight before SIGTERM; one still connecting would rightly get a 503.
    streams, threads = _start_streams(url, 4, 300, wait_for=all)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # Draining: a new request is refused with 503 while the ones in flight go on.
    assert_openai_error(httpx.post(f"{url}/generate", json={"text": "late"}, timeout=10), 503)
    for t in threads:
        t.join(120)
    assert proc.wait(timeout=60) == -signal.SIGTERM, log_path.read_text()
    for events in streams:
        assert events[0] == ("status", 200) and events[-1] == ("data", "[DONE]"), events[-2:]
        assert _data(events)[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
    assert "draining" in log_path.read_text()


@pytest.mark.slow  # ~8 s; the drain that finishes in time stays in the default suite
def test_sigterm_past_the_timeout_ends_the_rest_with_an_error_and_exits(tiny_llama, tmp_path):
    """One request runs at a time, so after 0.5 s at least two of the three are still in flight."""
    log_path = tmp_path / "server.log"
    proc, url = launch(tiny_llama, log_path, "--graceful-shutdown-timeout", "0.5", "--max-running-requests", "1")
    streams, threads = _start_streams(url, 3, 1000)
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(120)
    assert proc.wait(timeout=60) == -signal.SIGTERM, log_path.read_text()
    errors = 0
    for events in streams:
        assert events and events[0][0] == "status", events
        if events[0][1] != 200:  # still queued: the error is the whole (OpenAI-shaped) answer, a 503
            assert events[0][1] == 503, events
            errors += 1
            continue
        last = _data(events)[-1]
        # A stream that had begun ends with an event, never silently: the error, or its finish.
        assert "error" in last or last["meta_info"]["finish_reason"]["type"] == "length", events[-2:]
        assert "error" not in last or last["error"]["code"] == 503, last
        errors += "error" in last
    assert errors >= 2, streams
    assert "aborting them" in log_path.read_text()
