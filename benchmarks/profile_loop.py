"""Where one decode step's wall time goes, at the scheduler's level: batch choice, forward, sampling, accounting.

    python benchmarks/profile_loop.py                                   # float32, batch 1, eager
    python benchmarks/profile_loop.py --dtype bfloat16 --batch 4 --enable-torch-compile
    python benchmarks/profile_loop.py --quantization gguf                # from the Q4_1 file's blocks

benchmarks/profile_step.py looks inside the model forward (operators, Python between them); this
one looks around it. It wraps, with wall-clock timers, the methods one iteration of the normal
loop calls (Scheduler.step_normal, get_next_batch_to_run, TpModelWorker.forward_batch_generation,
ModelRunner.forward and sample, process_batch_result, and with --enable-torch-compile the
CPUGraphRunner's replay), runs --batch requests of --prompt-len random tokens for --decode-steps
new tokens each (one warm-up round first, which also compiles), and prints each part's time per
step. A step's time not under a part is the loop's own bookkeeping.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--decode-steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after the warm-up; each is printed")
    parser.add_argument("--quantization", choices=["w8a8_int8", "gguf"], help="a quantized model (bench_quant's)")
    parser.add_argument("--enable-torch-compile", action="store_true", help="the CPUGraphRunner, buckets up to --batch")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).parent))
    from roofline import cpu_name
    from workload import make_workload

    from minisgl.entrypoints.engine import Engine

    engine = Engine(
        model_path=args.model_path,
        dtype=args.dtype,
        quantization=args.quantization,
        disable_radix_cache=True,
        enable_torch_compile=args.enable_torch_compile,
        torch_compile_max_bs=args.batch,
    )
    scheduler = engine.scheduler
    runner = scheduler.tp_worker.model_runner
    seconds: dict[str, float] = collections.defaultdict(float)

    def timed(obj, name: str, label: str) -> None:
        method = getattr(obj, name)

        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return method(*a, **kw)
            finally:
                seconds[label] += time.perf_counter() - start

        setattr(obj, name, wrapper)  # an instance attribute: shadows the method for this object only

    parts = [
        (scheduler, "step_normal", "step (all of it)"),
        (scheduler, "get_next_batch_to_run", "  get_next_batch_to_run"),
        (scheduler.tp_worker, "forward_batch_generation", "  forward_batch_generation"),
        (runner, "forward", "    ModelRunner.forward"),
        (runner, "sample", "    ModelRunner.sample"),
        (scheduler, "process_batch_result", "  process_batch_result"),
    ]
    if runner.graph_runner is not None:
        parts.insert(4, (runner.graph_runner, "replay", "      CPUGraphRunner.replay"))
    for obj, name, label in parts:
        timed(obj, name, label)

    prompts = [p for p, _ in make_workload(args.batch, args.prompt_len, args.prompt_len, 1, 1, 49152, seed=1)]
    params = {"temperature": 0, "max_new_tokens": args.decode_steps + 1, "ignore_eos": True}
    variant = args.dtype + (f":{args.quantization}" if args.quantization else "")
    print(f"{cpu_name()}; {variant}, batch {args.batch}, graph runner {'on' if runner.graph_runner else 'off'}")
    engine.generate(input_ids=prompts, sampling_params=params)  # warm-up (and compile)
    for _ in range(args.rounds):
        seconds.clear()
        start = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - start
        steps = args.decode_steps + 1  # one prefill, then decode steps
        print(f"\n{args.batch * steps / elapsed:.1f} tok/s, {1e3 * elapsed / steps:.2f} ms per step (prefill included)")
        for _, _, label in parts:
            print(f"  {label:32s} {1e3 * seconds[label] / steps:7.2f} ms per step")
    engine.shutdown()


if __name__ == "__main__":
    main()
