"""Online serving: the minisgl HTTP server under concurrent streaming clients, against HF
transformers on the same workload, in one run.

    python benchmarks/bench_serving.py                          # 64 requests, 16 clients, all sent at once
    python benchmarks/bench_serving.py --request-rate 2         # Poisson arrivals, 2 requests/s
    python benchmarks/bench_serving.py --request-rate 4 --enable-mixed-chunk   # the server mixes prefill and decode
    python benchmarks/bench_serving.py --num-requests 16 --concurrency 8 --hf-requests 2   # quicker
    python benchmarks/bench_serving.py --threads 1              # one CPU thread per engine (busy machines)
    python benchmarks/bench_serving.py --concurrency 64 --hf-requests 0 --hf-batch-sizes ""   # server vs offline

Starts ``python -m minisgl.launch_server`` as a subprocess on a free 127.0.0.1 port, waits for
/health, warms it up with one short request, then sends bench_offline's workload (prompts of
random token ids, greedy, EOS ignored, fixed by --seed) to the native ``/generate`` route with
``"stream": true`` from at most --concurrency asyncio clients at once. Each request records:
TTFT (send to the first streamed token), ITL (the gaps between later tokens; a chunk carrying k
tokens counts k gaps of 1/k of its wait) and E2E (send to the last token). Prints p50/p90/p99 of
each, output throughput (generated tokens over wall time, first send to last token) and request
throughput. The server is stopped (SIGTERM, then SIGKILL) however the run ends.

Baselines, after the server has gone (so nothing shares the cores): minisgl's offline ``Engine`` on
the same workload (bench_offline.py's minisgl run, in its own process), for the ratio server /
offline: what HTTP, streaming and detokenization cost at this concurrency. HF ``generate`` one request
at a time on the first --hf-requests requests, timed per token by a streamer (TTFT, ITL, E2E with
no queueing: the best latency one process gets), and HF left-padded batches of all requests
(offline_engines.bench_hf_padded, best of --hf-batch-sizes). Ratios are minisgl / HF: above 1 is
better for throughput, below 1 is better for latency. minisgl's latencies include queueing behind
the other clients, HF one-at-a-time's do not.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import math
import os
import pathlib
import random
import signal
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import torch  # noqa: E402
from bench_offline import engine_cmd, run_in_subprocess  # noqa: E402
from offline_engines import bench_hf_padded, load_hf_model  # noqa: E402
from server_process import running_server  # noqa: E402
from workload import make_workload  # noqa: E402

# ---- statistics ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(per_request: list[dict], elapsed: float) -> dict:
    tokens = sum(r["tokens"] for r in per_request)
    summary = {
        "requests": len(per_request),
        "tokens": tokens,
        "seconds": elapsed,
        "tok_s": tokens / elapsed,
        "req_s": len(per_request) / elapsed,
    }
    for key in ("ttft", "itl", "e2e"):
        values = [v for r in per_request for v in (r[key] if key == "itl" else [r[key]])]
        summary[key] = {q: percentile(values, q) for q in (50, 90, 99)}
    return summary


def print_summary(name: str, s: dict) -> None:
    print(f"{name}: {s['requests']} requests, {s['tokens']} output tokens in {s['seconds']:.2f}s")
    print(f"  output throughput  {s['tok_s']:8.1f} tok/s")
    print(f"  request throughput {s['req_s']:8.2f} req/s")
    print(f"  {'ms':10s} {'p50':>9s} {'p90':>9s} {'p99':>9s}")
    for key in ("ttft", "itl", "e2e"):
        p = s[key]
        print(f"  {key.upper():10s} {p[50] * 1e3:9.1f} {p[90] * 1e3:9.1f} {p[99] * 1e3:9.1f}")


# ---- the streaming clients -------------------------------------------------------------------


async def stream_one(client: httpx.AsyncClient, url: str, prompt: list[int], n: int) -> dict:
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
        "stream": True,
    }
    start = time.perf_counter()
    ttft, last, itl, tokens = None, start, [], 0
    async with client.stream("POST", f"{url}/generate", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                raise RuntimeError(f"error in the stream: {chunk['error'].get('message')}")
            # /generate streams cumulative output_ids, as SGLang's does (--stream-output: deltas).
            k = len(chunk["output_ids"]) - tokens
            if k <= 0:
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - start
            else:
                itl += [(now - last) / k] * k
            last, tokens = now, tokens + k
    if tokens != n:
        raise RuntimeError(f"asked for {n} tokens (ignore_eos), got {tokens}")
    return {"ttft": ttft, "itl": itl, "e2e": last - start, "tokens": tokens}


async def run_clients(url: str, workload, concurrency: int, request_rate: float, seed: int, args) -> tuple[list, float]:
    """Request i arrives at its time (all at 0 for rate inf, else Poisson), then waits for a client slot."""
    rng = random.Random(seed + 1)
    arrivals, t = [], 0.0
    for _ in workload:
        arrivals.append(t)
        if not math.isinf(request_rate):
            t += rng.expovariate(request_rate)
    slots = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(args.request_timeout, connect=10)
    async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=timeout) as client:

        async def one(i, prompt, n):
            await asyncio.sleep(max(0.0, begin + arrivals[i] - time.perf_counter()))
            async with slots:
                return await stream_one(client, url, prompt, n)

        async def bounded(i, prompt, n):  # --timeout bounds the whole run, waits for a slot included
            left = max(0.0, begin + args.timeout - time.perf_counter())
            return await asyncio.wait_for(one(i, prompt, n), timeout=left)

        begin = time.perf_counter()
        results = await asyncio.gather(*(bounded(i, p, n) for i, (p, n) in enumerate(workload)), return_exceptions=True)
        return results, time.perf_counter() - begin


def bench_server(path: str, workload, args) -> tuple[dict, float]:
    log = tempfile.NamedTemporaryFile("w", prefix="minisgl-bench-serving-", suffix=".log", delete=False)
    flags = ["--host", "127.0.0.1", "--dtype", args.dtype, "--max-total-tokens", str(args.max_total_tokens)]
    flags += ["--enable-mixed-chunk"] if args.enable_mixed_chunk else []
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
    ok = False
    try:
        start = time.perf_counter()
        with running_server(path, *flags, start_timeout=args.startup_timeout, env=env, log=log) as (url, _):
            with httpx.Client(trust_env=False, timeout=60) as client:
                warm = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
                client.post(f"{url}/generate", json=warm).raise_for_status()  # first token: startup ends here
                startup = time.perf_counter() - start
                client.post(f"{url}/flush_cache").raise_for_status()
            results, elapsed = asyncio.run(
                run_clients(url, workload, args.concurrency, args.request_rate, args.seed, args)
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise RuntimeError(f"{len(failed)} of {len(results)} requests failed, the first: {failed[0]!r}")
            ok = True
            return summarize(results, elapsed), startup
    finally:
        log.close()
        if ok:
            os.unlink(log.name)
        elif text := pathlib.Path(log.name).read_text():
            print(f"server log ({log.name}), last lines:\n{text[-3000:]}", file=sys.stderr)
        else:
            os.unlink(log.name)


def bench_offline_engine(path: str, args) -> dict | None:
    """bench_offline.py's minisgl run (the offline Engine) on this workload, in its own process."""
    args = argparse.Namespace(**{**vars(args), "model_path": path})
    return run_in_subprocess(engine_cmd("minisgl", args.dtype, args, args.threads or torch.get_num_threads()))


# ---- HF one request at a time, timed per token ------------------------------------------------


def _token_clock():
    from transformers.generation.streamers import BaseStreamer

    class TokenClock(BaseStreamer):
        """generate() calls put() once with the prompt, then once per new token."""

        def __init__(self):
            self.prompt_seen, self.times = False, []

        def put(self, value):
            if self.prompt_seen:
                self.times.append(time.perf_counter())
            self.prompt_seen = True

        def end(self):
            pass

    return TokenClock()


@torch.no_grad()
def bench_hf_streamed(model, workload) -> dict:
    model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
    per_request, begin = [], time.perf_counter()
    for prompt, n in workload:
        clock = _token_clock()
        start = time.perf_counter()
        model.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
            streamer=clock,
        )  # fmt: skip
        t = clock.times
        assert len(t) == n, (len(t), n)
        per_request.append(
            {"ttft": t[0] - start, "itl": [b - a for a, b in itertools.pairwise(t)], "e2e": t[-1] - start, "tokens": n}
        )
    return summarize(per_request, time.perf_counter() - begin)


# ---- main ------------------------------------------------------------------------------------


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16, help="most requests in flight at once")
    parser.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson (inf: all at once)")
    parser.add_argument("--min-input", type=int, default=16)
    parser.add_argument("--max-input", type=int, default=256)
    parser.add_argument("--min-output", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-offline", action="store_true", help="skip the offline Engine baseline")
    parser.add_argument("--hf-requests", type=int, default=8, help="requests for HF one at a time (0: skip)")
    parser.add_argument("--hf-batch-sizes", default="16,64", help="padded batch sizes to try for HF (empty: skip)")
    parser.add_argument("--max-total-tokens", type=int, default=40000)
    parser.add_argument(
        "--enable-mixed-chunk", action="store_true", help="the server's flag: decode steps ride in prefill forwards"
    )
    parser.add_argument(
        "--threads", type=int, default=None,
        help="CPU threads for both engines: the server's OMP_NUM_THREADS and HF's torch.set_num_threads "
        "(default: torch's, one per core). On a busy machine 1 is steadier: spinning OpenMP workers that "
        "lose their core stall every op",
    )  # fmt: skip
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds for the server to be healthy")
    parser.add_argument("--request-timeout", type=float, default=300, help="seconds without progress per request")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for all requests together")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.concurrency < 1 or args.num_requests < 1 or not args.request_rate > 0:
        parser.error("--num-requests and --concurrency must be >= 1, --request-rate > 0")
    # SIGTERM/SIGHUP act as Ctrl-C (asyncio.run then cancels the clients), so the finally blocks stop the
    # server. Not forwarded as SIGINT: a shell's `cmd &` starts the process with SIGINT ignored.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    from transformers import AutoConfig

    from minisgl.model_loader.gguf import resolve_model_path

    path = resolve_model_path(args.model_path)  # converts the default model once, before the server starts
    vocab = AutoConfig.from_pretrained(path).vocab_size
    workload = make_workload(
        args.num_requests, args.min_input, args.max_input, args.min_output, args.max_output, vocab, args.seed
    )
    rate = "all at once" if math.isinf(args.request_rate) else f"Poisson {args.request_rate:g} req/s"
    print(
        f"workload: {len(workload)} requests, {sum(len(p) for p, _ in workload)} prompt tokens, "
        f"{sum(n for _, n in workload)} output tokens, dtype {args.dtype}; "
        f"concurrency {args.concurrency}, {rate}; threads {torch.get_num_threads()} "
        f"(server and HF)"
    )

    ours, startup = bench_server(path, workload, args)
    print_summary("minisgl server (/generate, streamed)", ours)
    print(f"  server startup {startup:.1f}s (spawn to first token)")
    gc.collect()

    if not args.no_offline:
        offline = bench_offline_engine(path, args)
        if offline is not None:
            print(
                f"minisgl offline Engine, same workload: {offline['tok_s']:8.1f} tok/s   "
                f"server / offline = {ours['tok_s'] / offline['tok_s']:.2f}"
            )

    sizes = sorted({min(int(b), len(workload)) for b in args.hf_batch_sizes.split(",") if b.strip()})
    if not (args.hf_requests or sizes):
        return
    start = time.perf_counter()
    model = load_hf_model(path, args.dtype)
    print(f"HF load time {time.perf_counter() - start:.1f}s")
    if args.hf_requests:
        subset = workload[: args.hf_requests]
        hf = bench_hf_streamed(model, subset)
        print_summary(f"HF generate, one request at a time (no queueing), the first {len(subset)}", hf)
        # Only tok/s is compared: req/s depends on the subset's output lengths.
        print(
            f"  ratio minisgl/HF: output tok/s {ours['tok_s'] / hf['tok_s']:.2f}x; "
            f"p50 TTFT {ours['ttft'][50] / hf['ttft'][50]:.2f}, "
            f"p50 ITL {ours['itl'][50] / hf['itl'][50]:.2f}, p50 E2E {ours['e2e'][50] / hf['e2e'][50]:.2f} "
            f"(latency: below 1 is faster)"
        )
    padded = {bs: bench_hf_padded(model, workload, bs) for bs in sizes}
    for bs, tok_s in padded.items():
        print(f"HF padded batch {bs:<4d} {tok_s:8.1f} tok/s   ratio minisgl/this = {ours['tok_s'] / tok_s:.2f}")
    if padded:
        best = max(padded, key=padded.get)
        print(f"best HF padded batch: {best} -> minisgl output throughput is {ours['tok_s'] / padded[best]:.2f}x")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted; the server was stopped", file=sys.stderr)
        sys.exit(130)
