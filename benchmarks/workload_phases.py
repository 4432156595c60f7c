"""Where the offline workload's time goes: its model forwards grouped by phase.

    python benchmarks/workload_phases.py [--dtype float32|bfloat16]

Runs bench_offline.py's default workload (workload.OFFLINE_WORKLOAD: 64 requests, seed 0) through
minisgl's offline Engine and times every model forward: the prefill chunks (EXTEND) and the
decode steps, grouped by how many requests were decoding.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from workload import OFFLINE_WORKLOAD, make_workload  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    from transformers import AutoConfig

    from minisgl.entrypoints.engine import Engine
    from minisgl.model_loader.gguf import resolve_model_path

    path = resolve_model_path(args.model_path)
    workload = make_workload(**OFFLINE_WORKLOAD, vocab_size=AutoConfig.from_pretrained(path).vocab_size)
    engine = Engine(model_path=path, dtype=args.dtype, max_total_tokens=40000)
    engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})  # warm-up, outside the timing

    runner = engine.scheduler.tp_worker.model_runner
    forward, phases = runner.forward, defaultdict(lambda: [0, 0, 0.0])  # phase -> [forwards, tokens, seconds]

    def timed_forward(forward_batch, **kwargs):  # kwargs: ModelRunner.forward's (pp_proxy_tensors)
        start = time.perf_counter()
        out = forward(forward_batch, **kwargs)
        if forward_batch.forward_mode.is_decode():
            low = (forward_batch.batch_size - 1) // 16 * 16 + 1
            phase = f"decode, batch {low}-{low + 15}"
        else:
            phase = "prefill (extend)"
        entry = phases[phase]
        entry[0] += 1
        entry[1] += forward_batch.input_ids.numel()
        entry[2] += time.perf_counter() - start
        return out

    runner.forward = timed_forward
    start = time.perf_counter()
    outs = engine.generate(
        input_ids=[p for p, _ in workload],
        sampling_params=[{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for _, n in workload],
    )
    total = time.perf_counter() - start
    engine.shutdown()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    print(
        f"{args.dtype}: {tokens} tokens in {total:.2f} s, {tokens / total:.1f} tok/s; "
        f"model forwards {sum(e[2] for e in phases.values()):.2f} s"
    )
    print(f"  {'phase':22s} {'forwards':>8s} {'tokens':>7s} {'time':>8s} {'per forward':>12s} {'tok/s':>8s}")
    for phase, (n, toks, secs) in sorted(phases.items()):
        print(f"  {phase:22s} {n:8d} {toks:7d} {secs:7.2f}s {1e3 * secs / n:9.1f} ms {toks / secs:8.1f}")


if __name__ == "__main__":
    main()
