"""Start N minisgl servers and SGLang's router in front of them, on one machine.

    python -m minisgl.tools.launch_replicas --num-replicas 2 --port 30000 --model-path DIR [server flags...]

Replica i serves on ``--port + 1 + i``; the router (``sglang-router``, SGLang's Rust load
balancer, ``pip install sglang-router``) listens on ``--port`` with its cache-aware policy,
so clients talk to one address and requests that share a prefix land where it is cached.
Flags this script does not know are passed to every replica (``minisgl.launch_server``).
This is what SGLang's ``sglang_router.launch_server --dp-size N`` does for SGLang workers;
for replicas on other hosts start each server there and the router with their URLs
(docs/tasks/serve.md). Ctrl-C (or SIGTERM) stops the router and every replica.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Optional


def _wait_until(url: str, proc: subprocess.Popen, timeout: float, ready=lambda body: True) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[2]} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and ready(r.read()):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")
        time.sleep(0.3)


def router_command(worker_urls: list[str], host: str, port: int, prometheus_port: int, policy: str) -> list[str]:
    # The router's own Prometheus exporter defaults to port 29000; two routers on one host would clash.
    return [
        sys.executable, "-m", "sglang_router.launch_router",
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--host", host, "--port", str(port),
        "--prometheus-port", str(prometheus_port),
        "--log-level", "warn",
    ]  # fmt: skip


def launch(
    num_replicas: int,
    port: int,
    server_argv: list[str],
    host: str = "127.0.0.1",
    policy: str = "cache_aware",
    prometheus_port: Optional[int] = None,
    timeout: float = 300.0,
    log_dir: Optional[str] = None,
) -> list[subprocess.Popen]:
    """Start the replicas, wait for their /health, then the router, and wait until it sees every
    replica healthy; return the processes, the router last."""
    procs = []
    logs = (lambda name: open(os.path.join(log_dir, name), "w")) if log_dir else (lambda name: None)
    try:
        for i in range(num_replicas):
            cmd = [
                sys.executable,
                "-m",
                "minisgl.launch_server",
                *server_argv,
                "--host",
                host,
                "--port",
                str(port + 1 + i),
            ]
            log = logs(f"replica{i}.log")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT if log else None))
        urls = [f"http://{host}:{port + 1 + i}" for i in range(num_replicas)]
        for url, proc in zip(urls, procs):
            _wait_until(f"{url}/health", proc, timeout)
        cmd = router_command(urls, host, port, prometheus_port or port + 1 + num_replicas, policy)
        log = logs("router.log")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT if log else None))
        expected = f'"healthy_workers":{num_replicas}'.encode()
        _wait_until(f"http://{host}:{port}/readiness", procs[-1], timeout, lambda body: expected in body)
    except BaseException:
        stop(procs)
        raise
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):  # the router first, so it sends nothing more to a stopping replica
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-replicas", type=int, default=2)
    parser.add_argument("--host", default="127.0.0.1", help="where the replicas and the router listen")
    parser.add_argument("--port", type=int, default=30000, help="the router's port; replicas take the next ones")
    parser.add_argument("--policy", default="cache_aware", help="the router's policy (cache_aware, round_robin, ...)")
    parser.add_argument("--prometheus-port", type=int, default=None, help="the router's metrics port")
    args, server_argv = parser.parse_known_args(argv)
    if args.num_replicas < 1:
        parser.error("--num-replicas must be >= 1")
    procs = launch(args.num_replicas, args.port, server_argv, args.host, args.policy, args.prometheus_port)
    print(f"router on http://{args.host}:{args.port} in front of {args.num_replicas} replicas", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
