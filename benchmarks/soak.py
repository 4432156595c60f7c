"""Soak: a minisgl server under a mixed load for a given time; what was lost, how fast, how big.

    python benchmarks/soak.py --minutes 30                      # the tiny Llama, 4 clients
    python benchmarks/soak.py --minutes 2 --model-path DIR --clients 8
    python benchmarks/soak.py --minutes 30 --server-args "--max-total-tokens 100000"

Starts ``python -m minisgl.launch_server`` on a free loopback port (the tiny Llama of
minisgl.tools.make_tiny_model unless --model-path), then --clients threads send, for
--minutes, a mix drawn at random (seeded): plain /generate, streamed /generate, OpenAI chat,
a json_schema-constrained /generate, /tokenize, and a streamed request the client hangs up on
after its first chunk (which the server must abort and free). Every --sample-seconds it
records the server's RSS and how many tokens the radix cache holds: the cache keeps every
finished prompt until the KV pool is full, and its index (token ids and slot tensors per node)
lives in Python memory, so RSS grows with it until eviction starts; a small pool
(--server-args "--max-total-tokens N") reaches that point within the warm-up. At the end it
prints, per kind: completed (a full answer), failed (an HTTP error answer), lost (no answer: a
refused or reset connection, a timeout, a stream cut before [DONE]; the number that must be 0)
and latency p50/p90/p99; then the RSS series, its change after warm-up (the first fifth of the
run), and whether the KV pool is whole.
Wall-clock numbers depend on the machine and its load; say which when quoting them.
"""

from __future__ import annotations

import argparse
import collections
import random
import shlex
import tempfile
import threading
import time

import httpx
from server_process import rss_mb, running_server

SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


def _cached_tokens(url: str) -> int | str:
    """Tokens the radix cache holds (evictable + protected), or '?' if the server is too busy to say."""
    try:
        info = httpx.get(f"{url}/get_server_info", timeout=10).json()
        return info["evictable_tokens"] + info["protected_tokens"]
    except (httpx.HTTPError, KeyError, ValueError):
        return "?"


def one_request(http: httpx.Client, kind: str, rng: random.Random) -> str:
    """Send one request of ``kind``; return 'completed', 'failed', 'lost' or 'hung_up'."""
    text = " ".join(rng.choice(["river", "bank", "stone", "light", "tree", "cloud"]) for _ in range(rng.randint(3, 40)))
    params = {"max_new_tokens": rng.randint(1, 32), "temperature": rng.choice([0, 0.8])}
    try:
        if kind in ("stream", "hang_up"):
            with http.stream("POST", "/generate", json={"text": text, "sampling_params": params, "stream": True}) as r:
                if r.status_code != 200:
                    return "failed"
                for line in r.iter_lines():
                    if kind == "hang_up":
                        return "hung_up"  # closing the stream here disconnects the client
                    if line == "data: [DONE]":
                        return "completed"
            return "lost"  # the stream ended without [DONE]
        if kind == "generate":
            r = http.post("/generate", json={"text": text, "sampling_params": params})
        elif kind == "json_schema":
            r = http.post("/generate", json={"text": text, "sampling_params": {**params, "json_schema": SCHEMA}})
        elif kind == "chat":
            messages = [{"role": "user", "content": text}]
            r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 16})
        else:
            r = http.post("/tokenize", json={"prompt": text})
        return "completed" if r.status_code == 200 else "failed"
    except httpx.TransportError:
        return "lost"


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return f"{pick(0.5) * 1000:.0f}/{pick(0.9) * 1000:.0f}/{pick(0.99) * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--model-path", default=None, help="default: the tiny Llama, built in a temporary directory")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-args", default="", help="extra launch_server flags, one string")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    model = args.model_path
    if model is None:
        from minisgl.tools.make_tiny_model import make_tiny_model

        model = str(make_tiny_model("llama", tmp.name))
    try:
        flags = ("--served-model-name", "tiny", *shlex.split(args.server_args))
        with running_server(model, *flags, start_timeout=300) as (url, pid):
            run(url, pid, args)
    finally:
        tmp.cleanup()


def run(url: str, pid: int, args) -> None:
    kinds = ["generate", "stream", "chat", "json_schema", "tokenize", "hang_up"]
    outcomes: dict[str, collections.Counter] = {k: collections.Counter() for k in kinds}
    latencies: dict[str, list[float]] = {k: [] for k in kinds}
    lock, stop = threading.Lock(), threading.Event()
    start = time.monotonic()
    end = start + args.minutes * 60

    def client(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        with httpx.Client(base_url=url, timeout=300) as http:
            while not stop.is_set() and time.monotonic() < end:
                kind = rng.choice(kinds)
                t = time.monotonic()
                outcome = one_request(http, kind, rng)
                with lock:
                    outcomes[kind][outcome] += 1
                    if outcome == "completed":
                        latencies[kind].append(time.monotonic() - t)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    rss: list[tuple[float, float]] = []
    try:
        while time.monotonic() < end:
            rss.append((time.monotonic() - start, rss_mb(pid)))
            cached = _cached_tokens(url)
            print(f"t={rss[-1][0]:6.0f} s  RSS {rss[-1][1]:7.1f} MB  radix cache {cached:>9} tokens", flush=True)
            time.sleep(min(args.sample_seconds, max(0.0, end - time.monotonic())))
    finally:
        stop.set()
        for t in threads:
            t.join()
    rss.append((time.monotonic() - start, rss_mb(pid)))
    # The radix cache keeps finished prompts' KV; emptied, every slot must be free again.
    flushed = httpx.post(f"{url}/flush_cache", timeout=60).status_code == 200
    info = httpx.get(f"{url}/get_server_info", timeout=60).json()

    print(f"\n{args.minutes:g} min, {args.clients} clients, seed {args.seed}")
    print(f"{'kind':12} {'completed':>9} {'failed':>7} {'lost':>5} {'hung up':>8}  latency p50/p90/p99")
    for kind in kinds:
        c = outcomes[kind]
        line = f"{kind:12} {c['completed']:9d} {c['failed']:7d} {c['lost']:5d} {c['hung_up']:8d}"
        print(f"{line}  {percentiles(latencies[kind])}")
    total = sum(outcomes.values(), collections.Counter())
    print(f"{'total':12} {total['completed']:9d} {total['failed']:7d} {total['lost']:5d} {total['hung_up']:8d}")
    warm = [mb for t, mb in rss if t >= (rss[-1][0]) / 5]
    print(f"RSS: start {rss[0][1]:.0f} MB, after warm-up {warm[0]:.0f} MB, end {rss[-1][1]:.0f} MB, "
          f"max {max(mb for _, mb in rss):.0f} MB; change after warm-up {warm[-1] - warm[0]:+.0f} MB "
          f"({(warm[-1] / warm[0] - 1) * 100:+.1f}%)")  # fmt: skip
    whole = flushed and info["available_kv_tokens"] == info["max_total_num_tokens"]
    print(f"KV pool whole at the end: {whole}; aborted requests counted: {info['num_aborted_requests']}")


if __name__ == "__main__":
    main()
