"""Issue 33's two attacks replayed against a running server: a huge grammar, a 24 MB /tokenize.

    python benchmarks/live_replays.py                          # the default model (SmolLM2-135M)
    python benchmarks/live_replays.py --model-path DIR --grammar-compile-timeout 5

Starts ``python -m minisgl.launch_server`` on a free loopback port (server_process.py), then:

1. Grammar. Sends /generate with a JSON schema of N string properties, for N = 2,000 (the
   issue's schema, 31.9 s to compile on an idle machine before the limits) and N = 998 (the
   largest of that shape under ``MAX_JSON_SCHEMA_NODES``, which is compiled). While each one
   is out, two probe clients keep sending a free /generate and a small json_schema /generate.
   Prints the big request's status, time and error, and the probes' latencies before and
   during it: bounded means an answer (a result, a 400 naming the limit, or an abort naming
   --grammar-compile-timeout) within seconds, with the probes served meanwhile.
2. Tokenize. Sends /tokenize with a 24 MB prompt, then with the longest prompt the context
   limit lets through (its length read from the 400's message), while probes send /health
   and a free /generate; samples the server's RSS from /proc every 50 ms. Prints status,
   time, the probes' latencies, and RSS before, at its peak and 5 s after.

Latencies depend on the machine and its load: say which when quoting them; compare the
probes during an attack with the probes before it, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
from typing import Callable

import httpx
from server_process import rss_mb, running_server

FREE = {"max_new_tokens": 4, "temperature": 0}
SMALL_SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


def schema_of(n_properties: int) -> str:
    return json.dumps({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n_properties)}})


def probe_while(url: str, probes: dict[str, Callable[[httpx.Client], httpx.Response]], busy: threading.Event):
    """Run each probe in a loop of its own while ``busy`` is set; {name: [(start, seconds, status)]}."""
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in probes}

    def loop(name: str) -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            while busy.is_set():
                t = time.monotonic()
                status = probes[name](http).status_code
                results[name].append((t, time.monotonic() - t, status))

    threads = [threading.Thread(target=loop, args=(name,)) for name in probes]
    for t in threads:
        t.start()
    return results, threads


def attack(url: str, send: Callable[[httpx.Client], httpx.Response], probes: dict, on_sample=None) -> dict:
    """Send one request while the probes run; its answer, time, and the probes that finished before it."""
    busy = threading.Event()
    busy.set()
    results, threads = probe_while(url, probes, busy)
    time.sleep(0.5)  # the probes are running before the attack begins
    sent = time.monotonic()
    answer: dict = {}

    def go() -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            r = send(http)
        answer.update(status=r.status_code, seconds=time.monotonic() - sent, body=r.text[:300])

    t = threading.Thread(target=go)
    t.start()
    while t.is_alive():
        if on_sample:
            on_sample()
        t.join(0.05)
    busy.clear()
    for th in threads:
        th.join()
    done_at = sent + answer["seconds"]
    during = {n: [r for r in rs if r[0] >= sent and r[0] + r[1] <= done_at] for n, rs in results.items()}
    return {**answer, "during": during}


def baseline(url: str, probes: dict, n: int = 5) -> dict[str, list[float]]:
    with httpx.Client(base_url=url, timeout=600) as http:
        return {name: [_timed(lambda: probe(http)) for _ in range(n)] for name, probe in probes.items()}


def _timed(fn) -> float:
    t = time.monotonic()
    fn().raise_for_status()
    return time.monotonic() - t


def _ms(values) -> str:
    values = sorted(values)
    if not values:
        return "none finished"
    return f"n={len(values)} median {values[len(values) // 2] * 1e3:.0f} ms, max {values[-1] * 1e3:.0f} ms"


def replay_grammar(url: str, sizes: list[int]) -> list[dict]:
    probes = {
        "free /generate": lambda h: h.post("/generate", json={"text": "The river", "sampling_params": FREE}),
        "small json_schema": lambda h: h.post(
            "/generate", json={"text": "Give a:", "sampling_params": {**FREE, "json_schema": SMALL_SCHEMA}}
        ),
    }
    rows = []
    for n in sizes:
        spec = schema_of(n)
        before = baseline(url, probes)
        body = {"text": "Fill the form:", "sampling_params": {**FREE, "json_schema": spec}}
        result = attack(url, lambda h, body=body: h.post("/generate", json=body), probes)
        rows.append({"properties": n, "bytes": len(spec), "before": before, **result})
        print(f"\n{n} string properties ({len(spec):,} bytes): HTTP {result['status']} in {result['seconds']:.2f} s")
        print(f"  answer: {result['body'][:200]}")
        for name in probes:
            during = [r[1] for r in result["during"][name]]
            fails = sum(r[2] != 200 for r in result["during"][name])
            print(f"  {name:18} before: {_ms(before[name])}; during: {_ms(during)}, {fails} not 200")
    return rows


def replay_tokenize(url: str, pid: int, megabytes: float) -> list[dict]:
    probes = {
        "/health": lambda h: h.get("/health"),
        "free /generate": lambda h: h.post("/generate", json={"text": "The river", "sampling_params": FREE}),
    }
    prompt = "river " * int(megabytes * 1e6 / 6)
    rows = []
    for label in (f"{megabytes:g} MB", "longest allowed"):
        before = baseline(url, probes)
        rss_before, peak = rss_mb(pid), [rss_mb(pid)]
        result = attack(
            url, lambda h, p=prompt: h.post("/tokenize", json={"prompt": p}), probes, lambda: peak.append(rss_mb(pid))
        )
        time.sleep(5)
        rss_after = rss_mb(pid)
        rows.append({"prompt": label, "chars": len(prompt), "rss": (rss_before, max(peak), rss_after), **result})
        print(
            f"\n/tokenize, {label} ({len(prompt):,} characters): HTTP {result['status']} in {result['seconds']:.2f} s"
        )
        print(f"  answer: {result['body'][:200]}")
        for name in probes:
            during = [r[1] for r in result["during"][name]]
            fails = sum(r[2] != 200 for r in result["during"][name])
            print(f"  {name:15} before: {_ms(before[name])}; during: {_ms(during)}, {fails} not 200")
        print(f"  RSS before {rss_before:.0f} MB, peak {max(peak):.0f} MB, 5 s after {rss_after:.0f} MB")
        limit = re.search(r"at most (\d+) characters", result["body"])
        if limit is None:
            break
        prompt = ("river " * (int(limit.group(1)) // 6 + 1))[: int(limit.group(1))]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--properties", default="2000,998", help="comma-separated schema sizes")
    parser.add_argument("--tokenize-mb", type=float, default=24.0)
    parser.add_argument("--grammar-compile-timeout", default="30")
    args = parser.parse_args()
    flags = ["--grammar-compile-timeout", args.grammar_compile_timeout]
    with running_server(args.model_path, *flags) as (url, pid):
        print(f"server {url}, pid {pid}, model {args.model_path}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
        replay_grammar(url, [int(n) for n in args.properties.split(",")])
        replay_tokenize(url, pid, args.tokenize_mb)
        print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
