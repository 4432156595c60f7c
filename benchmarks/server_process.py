"""A minisgl server as a separate process, for benchmarks that load it as a client would.

``running_server(model, *flags)`` starts ``python -m minisgl.launch_server`` on a free
loopback port, waits for /health and stops it with SIGTERM (its graceful drain) afterwards;
Linux also sends it SIGTERM if the benchmark dies first, even by SIGKILL, so no server is left
running. ``rss_mb(pid)`` reads its resident memory from /proc. Used by soak.py,
live_replays.py and bench_serving.py.
"""

from __future__ import annotations

import contextlib
import ctypes
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


try:
    _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here: the forked child only makes one call
except OSError:  # not glibc Linux: the try/finally alone stops the server
    _LIBC = None


def _die_with_parent():
    """Run in the child before exec: Linux sends it SIGTERM if this process dies, even by SIGKILL."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def running_server(
    model: str, *flags: str, start_timeout: float = 600, env: dict | None = None, log=None
) -> Iterator[tuple[str, int]]:
    """(url, pid) of a server on a free loopback port, stopped with SIGTERM afterwards.

    env: variables added to this process's environment; log: a file for the server's output
    (default: this process's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    cmd = [sys.executable, "-m", "minisgl.launch_server", "--model-path", model, "--port", str(port),
           "--log-level", "warning", *flags]  # fmt: skip
    output = {} if log is None else {"stdout": log, "stderr": subprocess.STDOUT}
    server = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, **output)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start (exit code {server.poll()})")
            time.sleep(0.2)
        yield url, server.pid
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
