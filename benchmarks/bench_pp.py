"""Pipeline parallelism against tensor parallelism against one process, on one workload, and the bubble.

    python benchmarks/bench_pp.py                     # a tiny 8-layer Llama (make_tiny_model), 16 prompts
    python benchmarks/bench_pp.py --model PATH --prompts 32 --output-len 64

Each configuration serves the same greedy requests (--prompts prompts of --input-len random tokens,
--output-len new tokens each) through the Engine: one process, tp 2 (two processes, an all-reduce
per layer) and pp 2 (two stages, SGLang's micro-batched event_loop_pp). Printed: wall time,
output tok/s and each one's ratio to one process, all measured in this run. With --max-prefill-tokens
the requests arrive in several prefill micro-batches, so both pipeline slots are used.

The pipeline's bubble is measured from a torch-profiler trace of the pp 2 run (Engine.start_profile:
one Chrome trace per stage, -PP-<stage>-TP-0) as minisgl/tools/pp_timeline.py measures it: each
stage's busy time is the sum of its TpModelWorker.forward_batch_generation ranges, and its bubble is
the share of the window (first forward begun to last forward ended, on any stage) it spent outside
them. A text timeline of the first forwards shows the micro-batches crossing the stages (the tool
draws the book's figure from a recording of its own). On a 2-core CPU the stages' OpenMP
threads share the same cores, so no gain is expected: the ratios show what the communication and
the extra processes cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minisgl.entrypoints.engine import Engine  # noqa: E402
from minisgl.tools.make_tiny_model import make_tiny_model  # noqa: E402
from minisgl.tools.pp_timeline import bubble_line, stage_ranges  # noqa: E402


def run(model: str, prompts: list[list[int]], output_len: int, profile_dir=None, **kwargs) -> tuple[float, int]:
    params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
    with Engine(model_path=model, device="cpu", **kwargs) as engine:
        engine.generate(input_ids=prompts[:1], sampling_params={**params, "max_new_tokens": 2})  # warm-up
        if profile_dir:
            engine.start_profile(output_dir=profile_dir, activities=["CPU"])
        start = time.perf_counter()
        out = engine.generate(input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - start
        if profile_dir:
            engine.stop_profile()
    return elapsed, sum(len(o["output_ids"]) for o in out)


def timeline(stages: list[list[tuple[float, float]]], width: int = 100, first: int = 12) -> str:
    """One row per stage, '#' where it runs a forward, over the span of the first forwards of stage 0."""
    start = stages[0][0][0]
    end = max(e for r in stages for b, e in r[:first])
    rows = []
    for p, ranges in enumerate(stages):
        row = [" "] * width
        for b, e in ranges:
            lo, hi = int((b - start) / (end - start) * width), int((e - start) / (end - start) * width)
            for i in range(max(lo, 0), min(hi + 1, width)):
                row[i] = "#"
        rows.append(f"stage {p} |{''.join(row)}|")
    return "\n".join(rows) + f"\n        0{' ' * (width - 8)}{(end - start) / 1e3:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: a tiny 8-layer Llama)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-prefill-tokens", type=int, default=128)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-pp-")
    model = args.model or str(make_tiny_model("llama", Path(tmp) / "llama8", num_hidden_layers=8))
    gen = torch.Generator().manual_seed(0)
    # Token ids under the tiny checkpoint's vocabulary (512).
    prompts = torch.randint(10, 500, (args.prompts, args.input_len), generator=gen).tolist()
    kw = dict(max_prefill_tokens=args.max_prefill_tokens, chunked_prefill_size=args.max_prefill_tokens)
    print(f"model {model}, {args.prompts} prompts x {args.input_len} tokens, {args.output_len} new each")
    print(f"{torch.get_num_threads()} torch threads in this process")
    profile_dir = os.path.join(tmp, "profile")
    threads = torch.get_num_threads()
    configs = [("one process", {}), ("one, 1 thread", {}), ("tp 2", {"tp_size": 2}), ("pp 2", {"pp_size": 2})]
    rates = {}
    for name, extra in configs:
        # Each rank of tp 2 or pp 2 gets threads // 2 OpenMP threads (scheduler_process.py); the second
        # one-process row runs with as few, to tell the threads' share from the parallelism's.
        torch.set_num_threads(1 if name == "one, 1 thread" else threads)
        profile = profile_dir if "pp_size" in extra else None
        elapsed, tokens = run(model, prompts, args.output_len, profile, **kw, **extra)
        rates[name] = (elapsed, tokens / elapsed)
    best_one = max(rates["one process"][1], rates["one, 1 thread"][1])
    print(f"{'config':<14}{'wall s':>9}{'out tok/s':>11}{'vs best one':>13}")
    for name, (elapsed, rate) in rates.items():
        print(f"{name:<14}{elapsed:>9.2f}{rate:>11.1f}{rate / best_one:>13.2f}")
    stages = stage_ranges(profile_dir, 2)
    print(bubble_line(stages, 1e-6))  # the ranges are in microseconds
    print(timeline(stages))


if __name__ == "__main__":
    main()
