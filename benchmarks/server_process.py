"""A minisgl server as a separate process, for benchmarks that load it as a client would.

``running_server(model, *flags)`` starts ``python -m minisgl.launch_server`` on a free
loopback port, waits for /health and stops it with SIGTERM (its graceful drain) afterwards;
``rss_mb(pid)`` reads its resident memory from /proc. Used by soak.py and live_replays.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator

import httpx


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


@contextlib.contextmanager
def running_server(model: str, *flags: str, start_timeout: float = 600) -> Iterator[tuple[str, int]]:
    """(url, pid) of a server on a free loopback port, stopped with SIGTERM afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "minisgl.launch_server", "--model-path", model, "--port", str(port),
           "--log-level", "warning", *flags]  # fmt: skip
    server = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start (exit code {server.poll()})")
            time.sleep(0.5)
        yield url, server.pid
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
