"""Start N minisgl servers and SGLang's router in front of them, on one machine, and keep them up.

    python -m minisgl.tools.launch_replicas --num-replicas 2 --port 30000 --model-path DIR [server flags...]

Replica i serves on ``--port + 1 + i``; the router (``sglang-router``, SGLang's Rust load
balancer, ``pip install sglang-router``) listens on ``--port`` with its cache-aware policy,
so clients talk to one address and requests that share a prefix land where it is cached.
Flags this script does not know are passed to every replica (``minisgl.launch_server``).
This is what SGLang's ``sglang_router.launch_server --dp-size N`` does for SGLang workers;
for replicas on other hosts start each server there and the router with their URLs
(docs/tasks/serve.md). Ctrl-C (or SIGTERM) stops the router and every replica.

Replicas fail alone. A replica that dies is restarted by the ``Supervisor`` after a backoff
that doubles with each restart (``RestartPolicy``), up to a limit, and the others are never
stopped for it. The router health-checks every replica every few seconds and stops sending
to one that fails; a request sent to a dead replica before that (a refused connection, a
502) is retried on another, and a circuit breaker keeps it off a replica that keeps failing.
What the router cannot save is a request the dead replica had already begun: its client
gets an error (a streamed one mid-stream, a plain one at once).
"""

from __future__ import annotations

import argparse
import dataclasses
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
    # Health checks every 2 s (its default is 60 s), two failures to drop a replica; a request that
    # fails before any byte of its answer (a dead replica refuses the connection) is retried up to
    # 3 times with a short backoff; 3 failures open a replica's circuit for 10 s.
    return [
        sys.executable, "-m", "sglang_router.launch_router",
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--host", host, "--port", str(port),
        "--prometheus-port", str(prometheus_port),
        "--health-check-interval-secs", "2", "--health-failure-threshold", "2",
        "--health-success-threshold", "1", "--health-check-timeout-secs", "5",
        "--retry-max-retries", "3", "--retry-initial-backoff-ms", "100", "--retry-max-backoff-ms", "2000",
        "--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "10",
        "--log-level", "warn",
    ]  # fmt: skip


@dataclasses.dataclass
class RestartPolicy:
    """When to restart a process that died: after ``initial_backoff`` s, doubling per restart up to
    ``max_backoff``; never more than ``max_restarts`` times, a count forgotten once the process has
    stayed up ``reset_after`` s (a crash a day is not a crash loop)."""

    initial_backoff: float = 1.0
    max_backoff: float = 30.0
    max_restarts: int = 5
    reset_after: float = 300.0
    restarts: int = 0

    def delay(self, started_at: float, died_at: float) -> Optional[float]:
        """Seconds to wait before the next restart, or None once the limit is reached."""
        if died_at - started_at >= self.reset_after:
            self.restarts = 0
        if self.restarts >= self.max_restarts:
            return None
        delay = min(self.initial_backoff * 2**self.restarts, self.max_backoff)
        self.restarts += 1
        return delay


class Supervisor:
    """The launched processes (replicas, then the router), each restarted alone by its policy."""

    def __init__(self, commands: list[list[str]], names: list[str], log_dir: Optional[str], policy: RestartPolicy):
        self.commands, self.names, self.log_dir = commands, names, log_dir
        self.policies = [dataclasses.replace(policy) for _ in commands]
        self.procs: list[Optional[subprocess.Popen]] = [None] * len(commands)
        self.started_at = [0.0] * len(commands)
        self.restart_at: list[Optional[float]] = [None] * len(commands)
        self.given_up: set[int] = set()

    def start(self, i: int) -> subprocess.Popen:
        log = open(os.path.join(self.log_dir, f"{self.names[i]}.log"), "a") if self.log_dir else None
        self.procs[i] = subprocess.Popen(self.commands[i], stdout=log, stderr=subprocess.STDOUT if log else None)
        self.started_at[i] = time.monotonic()
        return self.procs[i]

    def poll(self) -> bool:
        """Restart what died and whose backoff is over; False once every replica is gone for good."""
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            if proc is None or i in self.given_up or proc.poll() is None:
                continue
            if self.restart_at[i] is None:
                delay = self.policies[i].delay(self.started_at[i], now)
                if delay is None:
                    print(f"{self.names[i]} exited with {proc.returncode}; restart limit reached", flush=True)
                    self.given_up.add(i)
                    continue
                print(f"{self.names[i]} exited with {proc.returncode}; restarting in {delay:.0f} s", flush=True)
                self.restart_at[i] = now + delay
            elif now >= self.restart_at[i]:
                self.restart_at[i] = None
                self.start(i)
        return any(i not in self.given_up for i in range(len(self.procs) - 1))

    def stop(self) -> None:
        stop([p for p in self.procs if p is not None])


def launch(
    num_replicas: int,
    port: int,
    server_argv: list[str],
    host: str = "127.0.0.1",
    policy: str = "cache_aware",
    prometheus_port: Optional[int] = None,
    timeout: float = 300.0,
    log_dir: Optional[str] = None,
    restart_policy: Optional[RestartPolicy] = None,
) -> Supervisor:
    """Start the replicas, wait for their /health, then the router, and wait until it sees every
    replica healthy; return their Supervisor, the router last."""
    urls = [f"http://{host}:{port + 1 + i}" for i in range(num_replicas)]
    commands = [
        [sys.executable, "-m", "minisgl.launch_server", *server_argv, "--host", host, "--port", str(port + 1 + i)]
        for i in range(num_replicas)
    ]
    commands.append(router_command(urls, host, port, prometheus_port or port + 1 + num_replicas, policy))
    names = [f"replica{i}" for i in range(num_replicas)] + ["router"]
    supervisor = Supervisor(commands, names, log_dir, restart_policy or RestartPolicy())
    try:
        for i in range(num_replicas):
            supervisor.start(i)
        for i, url in enumerate(urls):
            _wait_until(f"{url}/health", supervisor.procs[i], timeout)
        router = supervisor.start(num_replicas)
        expected = f'"healthy_workers":{num_replicas}'.encode()
        _wait_until(f"http://{host}:{port}/readiness", router, timeout, lambda body: expected in body)
    except BaseException:
        supervisor.stop()
        raise
    return supervisor


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
    parser.add_argument("--max-restarts", type=int, default=5, help="restarts of one replica before giving up")
    parser.add_argument("--log-dir", default=None, help="write replicaN.log and router.log here")
    args, server_argv = parser.parse_known_args(argv)
    if args.num_replicas < 1:
        parser.error("--num-replicas must be >= 1")
    supervisor = launch(
        args.num_replicas,
        args.port,
        server_argv,
        args.host,
        args.policy,
        args.prometheus_port,
        log_dir=args.log_dir,
        restart_policy=RestartPolicy(max_restarts=args.max_restarts),
    )
    print(f"router on http://{args.host}:{args.port} in front of {args.num_replicas} replicas", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while supervisor.poll():
            time.sleep(0.5)
        raise SystemExit("every replica has exited past its restart limit")
    except KeyboardInterrupt:
        pass
    finally:
        supervisor.stop()


if __name__ == "__main__":
    main()
