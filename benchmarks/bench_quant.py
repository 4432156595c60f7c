"""minisgl's quantization schemes beside its float32 and bfloat16 runs, on bench_offline's workload, in one run.

    python benchmarks/bench_quant.py                                        # 64 requests, as bench_offline
    python benchmarks/bench_quant.py --num-requests 16 --max-output 32      # quicker
    python benchmarks/bench_quant.py --variants float32,float32:gguf --num-requests 1 \
        --min-output 128 --max-output 128                                   # batch-1 decode
    python benchmarks/bench_quant.py --variants float32,bfloat16,float32:gguf --num-requests 1 \
        --min-output 64 --max-output 64 --llama-server .venv-llamacpp/bin/llama-server  # and llama.cpp
    python benchmarks/bench_quant.py ... --enable-torch-compile      # each variant with the graph runner
    python benchmarks/bench_quant.py --variants bfloat16,bfloat16::fp8_e5m2,bfloat16:w8a8_int8:fp8_e5m2 --rounds 3

Each variant (dtype[:quantization[:kv_cache_dtype]], the flags' values) runs minisgl's offline
Engine in its own process, one after the other, on the same workload (benchmarks/workload.py: random
prompt ids, greedy, EOS ignored): tokens/s, startup, peak RSS, the ratio against the bfloat16 run,
and how many requests produced exactly the float32 run's greedy tokens. w8a8_int8 quantizes the
float checkpoint while loading (layers/quantization/w8a8_int8.py); its activations run in the
variant's dtype. gguf runs the model from its shipped GGUF file's blocks
(layers/quantization/gguf.py): no float copy of the weights on disk or in memory, activations in the
variant's dtype. On a shared machine speeds drift by tens of percent within minutes: compare rows of
one run, and rerun, or give --rounds N: the variants take turns N times (bfloat16, w8a8, bfloat16,
w8a8, ...), each row shows its median tok/s and range, and "vs bf16" is the median of the ratios
taken within each round, between runs minutes apart (as bench_offline.py's --rounds).
With --llama-server (scripts/setup_llama_cpp.sh builds it), a last row runs the model's GGUF file
as it is in llama.cpp's server on the same workload (benchmarks/peer_llama_cpp.py, --dtype q4_1:
its own f16 KV cache), with the server's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))
from offline_engines import peak_rss_mb, warm_up_decode_buckets  # noqa: E402
from workload import OFFLINE_WORKLOAD, make_workload  # noqa: E402

VARIANTS = ["float32", "bfloat16", "float32:w8a8_int8", "bfloat16:w8a8_int8", "float32:gguf", "bfloat16:gguf"]
WORKLOAD_ARGS = ("num_requests", "min_input", "max_input", "min_output", "max_output", "seed")


def run_variant(args) -> None:
    """In the child process: one Engine, the whole workload, one RESULT line."""
    from minisgl.entrypoints.engine import Engine

    dtype, quantization, kv_cache_dtype = (args.variant.split(":") + ["", ""])[:3]
    start = time.perf_counter()
    engine = Engine(
        model_path=args.model_path,
        dtype=dtype,
        quantization=quantization or None,
        kv_cache_dtype=kv_cache_dtype or "auto",
        max_total_tokens=args.max_total_tokens,
        enable_torch_compile=args.enable_torch_compile,
        torch_compile_max_bs=args.num_requests,
    )
    # Before the clock: with the graph runner every decode bucket compiles here, else one step at the workload's size.
    if args.enable_torch_compile:
        warm_up_decode_buckets(engine, args.num_requests)
    else:
        engine.generate(input_ids=[[1, 2, 3]] * args.num_requests, sampling_params={"max_new_tokens": 2})
    startup = time.perf_counter() - start
    vocab_size = engine.tokenizer.vocab_size
    workload = make_workload(vocab_size=vocab_size, **{k: getattr(args, k) for k in WORKLOAD_ARGS})
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for _, n in workload]
    start = time.perf_counter()
    outs = engine.generate(input_ids=[p for p, _ in workload], sampling_params=params)
    elapsed = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    engine.shutdown()
    result = {"tok_s": tokens / elapsed, "startup_s": startup, "peak_rss_mb": peak_rss_mb(os.getpid())}
    result["vocab_size"] = vocab_size  # for llama.cpp's run of the same workload
    print("RESULT " + json.dumps({**result, "outputs": [o["output_ids"] for o in outs]}))


def run_llama_cpp(args, results: dict) -> dict | None:
    """llama.cpp's server on the model's GGUF file and the same workload (peer_llama_cpp.py)."""
    from bench_offline import gguf_source

    gguf_file, done = gguf_source(args.model_path), [r for r in results.values() if r]
    if gguf_file is None or not done:
        print(f"  ! llama.cpp: {args.model_path} is no GGUF model" if done else "  ! llama.cpp: no variant ran")
        return None
    workload = {k: getattr(args, k) for k in WORKLOAD_ARGS} | {"vocab_size": done[0]["vocab_size"]}
    cmd = [sys.executable, str(Path(__file__).parent / "peer_llama_cpp.py"), "--gguf", gguf_file, "--dtype", "q4_1"]
    proc = subprocess.run(
        cmd + ["--server", args.llama_server, "--workload", json.dumps(workload)], capture_output=True, text=True
    )
    if proc.returncode:
        print(f"  ! llama.cpp failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="dtype[:quantization[:kv_cache_dtype]], comma-separated"
    )
    for name in WORKLOAD_ARGS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=OFFLINE_WORKLOAD[name])
    parser.add_argument("--max-total-tokens", type=int, default=40000)
    parser.add_argument("--enable-torch-compile", action="store_true", help="the CPUGraphRunner in every variant")
    parser.add_argument("--llama-server", default=None, help="llama.cpp's server binary: add its run of the GGUF file")
    parser.add_argument("--rounds", type=int, default=1, help="the variants take turns N times; rows show medians")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # internal: run one variant in this process
    args = parser.parse_args()
    if args.variant:
        return run_variant(args)

    variants = args.variants.split(",")
    rounds = [{variant: run_in_child(variant, args) for variant in variants} for _ in range(args.rounds)]
    results = rounds[0]  # startup, RSS and outputs from the first round; tok/s and ratios from all
    if args.llama_server:
        results["llama.cpp q4_1"] = run_llama_cpp(args, results)
    ref = results.get("float32")
    if args.rounds > 1:
        print(f"median of {args.rounds} rounds (range); vs bf16: the median of each round's own ratio")
    header = f"{'variant':30s} {'tok/s':>8s} {'range':>13s} {'vs bf16':>8s} {'startup':>8s} {'peak RSS':>9s}"
    print(f"{header}  greedy = float32")
    for variant, r in results.items():
        if r is None:
            continue
        runs = [rnd for rnd in rounds if rnd.get(variant)]  # llama.cpp: the first round's only
        rates = [rnd[variant]["tok_s"] for rnd in runs]
        ratios = [rnd[variant]["tok_s"] / rnd["bfloat16"]["tok_s"] for rnd in runs if rnd.get("bfloat16")]
        ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
        spread = f"{min(rates):.1f}-{max(rates):.1f}"
        same = f"{sum(a == b for a, b in zip(r['outputs'], ref['outputs']))}/{len(r['outputs'])}" if ref else "-"
        print(
            f"{variant:30s} {statistics.median(rates):8.1f} {spread:>13s} {ratio:>8s} {r['startup_s']:7.1f}s "
            f"{r['peak_rss_mb']:7.0f}MB  {same}"
        )


def run_in_child(variant: str, args) -> dict | None:
    """One variant in its own process (its startup and peak RSS its own): the child's RESULT line."""
    cmd = [sys.executable, __file__, "--variant", variant, "--model-path", args.model_path]
    for name in (*WORKLOAD_ARGS, "max_total_tokens"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    cmd += ["--enable-torch-compile"] if args.enable_torch_compile else []
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        print(f"  ! {variant} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        return None
    return json.loads(lines[-1].removeprefix("RESULT "))


if __name__ == "__main__":
    main()
