"""Where a prefill chunk and a decode step spend their time: torch.profiler over the model forward.

    python benchmarks/profile_step.py                      # float32, the default (C++ kernels) path
    python benchmarks/profile_step.py --torch-native       # the same without minisgl's CPU kernels
    python benchmarks/profile_step.py --dtype bfloat16
    python benchmarks/profile_step.py --quantization gguf --batch 1  # the Q4_1 file's blocks
    python benchmarks/profile_step.py --dtype bfloat16 --batch 64 --kv-cache-dtype fp8_e5m2  # an fp8 KV pool

Runs SmolLM2-135M on --batch requests of --prompt-len random tokens: their prefill (in chunks of
the engine's chunked_prefill_size), then --decode-steps decode steps with all of them, and prints,
for each phase, the wall time per forward, the operators that took it and the time outside any
operator (Python between the ops). --torch-native sets MINISGL_DISABLE_CPU_KERNELS=1 before
minisgl is imported, which selects the torch_native attention backend and the layers'
forward_native paths (oneDNN-packed weights stay).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--decode-steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=12, help="operators to list per phase")
    parser.add_argument("--quantization", choices=["w8a8_int8", "gguf"], help="a quantized model (bench_quant's)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="the KV pool's dtype (SGLang's flag)")
    parser.add_argument("--torch-native", action="store_true", help="without minisgl's C++ CPU kernels")
    args = parser.parse_args()
    if args.torch_native:
        os.environ["MINISGL_DISABLE_CPU_KERNELS"] = "1"

    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(Path(__file__).parent))
    from workload import make_workload

    from minisgl.entrypoints.engine import Engine

    engine = Engine(
        model_path=args.model_path,
        dtype=args.dtype,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        max_total_tokens=32768,
        disable_radix_cache=True,
    )
    runner = engine.scheduler.tp_worker.model_runner
    variant = args.dtype + (f":{args.quantization}" if args.quantization else "") + f", KV {runner.kv_cache_dtype}"
    print(
        f"{variant}, attention backend {engine.server_args.attention_backend}, "
        f"{torch.get_num_threads()} threads; {args.batch} requests x {args.prompt_len} prompt tokens, "
        f"then {args.decode_steps} decode steps"
    )

    phases: dict[str, list] = {"prefill": [], "decode": []}
    forward = runner.forward

    def profiled_forward(forward_batch, **kwargs):  # kwargs: ModelRunner.forward's (pp_proxy_tensors)
        phase = "decode" if forward_batch.forward_mode.is_decode() else "prefill"
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            out = forward(forward_batch, **kwargs)
            elapsed = time.perf_counter() - start
        phases[phase].append((elapsed, prof, forward_batch.input_ids.shape[0]))
        return out

    prompts = [p for p, _ in make_workload(args.batch, args.prompt_len, args.prompt_len, 1, 1, 49152, seed=1)]
    params = {"temperature": 0, "max_new_tokens": args.decode_steps + 1, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params)  # warm-up: oneDNN primitives
    runner.forward = profiled_forward
    engine.generate(input_ids=prompts, sampling_params=params)
    engine.shutdown()

    for phase, runs in phases.items():
        total = sum(t for t, _, _ in runs)
        tokens = sum(n for _, _, n in runs)
        print(f"\n== {phase}: {len(runs)} forwards, {1e3 * total / len(runs):.1f} ms each, {tokens} tokens")
        by_op: dict[str, float] = {}
        for _, prof, _ in runs:
            for evt in prof.key_averages():
                by_op[evt.key] = by_op.get(evt.key, 0.0) + evt.self_cpu_time_total / 1e6
        profiled = sum(by_op.values())
        for name, secs in sorted(by_op.items(), key=lambda kv: -kv[1])[: args.rows]:
            print(f"  {100 * secs / profiled:5.1f}%  {1e3 * secs / len(runs):8.2f} ms/forward  {name}")
        # The forward's wall time that no operator accounts for: Python between the ops (module calls,
        # the backends' bookkeeping), while the other threads wait; the profiler adds a little per op.
        print(
            f"  outside any operator (Python; the profiler's own cost included): "
            f"{1e3 * (total - profiled) / len(runs):.2f} ms/forward"
        )


if __name__ == "__main__":
    main()
