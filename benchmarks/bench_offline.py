"""Offline throughput: minisgl against HF transformers on the same workload, in one run.

    python benchmarks/bench_offline.py                       # f32, the default workload
    python benchmarks/bench_offline.py --dtype bfloat16
    python benchmarks/bench_offline.py --num-requests 16 --hf-one-at-a-time 4   # quicker

Workload (fixed by --seed): prompts of random token ids with lengths in
[--min-input, --max-input], outputs of [--min-output, --max-output] tokens, greedy,
EOS ignored, so every engine does exactly the same work. Prints tokens/s (generated
tokens over wall time), startup time and peak RSS of each engine, and the ratios
minisgl / baseline. HF "one at a time" runs a subset of the requests (throughput is
a rate, so a subset measures it at a fraction of the cost); HF "padded batch" runs
all requests in left-padded batches and reports the best batch size tried.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def make_workload(n, min_in, max_in, min_out, max_out, vocab, seed):
    rng = random.Random(seed)
    return [
        ([rng.randrange(100, vocab - 100) for _ in range(rng.randint(min_in, max_in))], rng.randint(min_out, max_out))
        for _ in range(n)
    ]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_minisgl(path, workload, dtype, **engine_kwargs):
    from minisgl.entrypoints.engine import Engine

    start = time.perf_counter()
    engine = Engine(model_path=path, dtype=dtype, **engine_kwargs)
    engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})  # first token: startup ends here
    startup = time.perf_counter() - start
    prompts = [p for p, _ in workload]
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for _, n in workload]
    overhead = _instrument_decode_overhead(engine)
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params, show_progress=False)
    elapsed = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    assert tokens == sum(n for _, n in workload)
    engine.shutdown()
    return {
        "tok_s": tokens / elapsed,
        "startup_s": startup,
        "seconds": elapsed,
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
        return (f"{self.steps} decode steps with >= {self.min_bs} requests: "
                f"{1e3 * self.step_s / self.steps:.1f} ms/step, model forward {1e3 * self.forward_s / self.steps:.1f} ms, "
                f"engine overhead {100 * share:.1f}%")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--min-input", type=int, default=16)
    parser.add_argument("--max-input", type=int, default=256)
    parser.add_argument("--min-output", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hf-one-at-a-time", type=int, default=8, help="requests for the HF one-at-a-time baseline (0: skip)")
    parser.add_argument("--hf-batch-sizes", default="16,64", help="padded batch sizes to try for HF (empty: skip)")
    parser.add_argument("--max-total-tokens", type=int, default=40000)
    parser.add_argument("--threads", type=int, default=None, help="torch threads for every engine (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from minisgl.model_loader.gguf import resolve_model_path

    path = resolve_model_path(args.model_path)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    workload = make_workload(
        args.num_requests, args.min_input, args.max_input, args.min_output, args.max_output, vocab, args.seed
    )
    total_out = sum(n for _, n in workload)
    print(f"workload: {len(workload)} requests, {sum(len(p) for p, _ in workload)} prompt tokens, "
          f"{total_out} output tokens, dtype {args.dtype}, {torch.get_num_threads()} threads")

    ours = bench_minisgl(path, workload, args.dtype, max_total_tokens=args.max_total_tokens)
    print(f"minisgl               {ours['tok_s']:8.1f} tok/s   startup {ours['startup_s']:.1f}s   "
          f"peak RSS {peak_rss_mb():.0f} MB")
    print(f"  {ours['overhead']}")
    gc.collect()

    start = time.perf_counter()
    model = _hf_model(path, args.dtype)
    hf_startup = time.perf_counter() - start
    results = {}
    if args.hf_one_at_a_time:
        results["HF one at a time"] = bench_hf_one_at_a_time(model, workload[: args.hf_one_at_a_time])
    for bs in [int(b) for b in args.hf_batch_sizes.split(",") if b]:
        results[f"HF padded batch {bs}"] = bench_hf_padded(model, workload, bs)
    for name, tok_s in results.items():
        print(f"{name:21s} {tok_s:8.1f} tok/s   ratio minisgl/this = {ours['tok_s'] / tok_s:.2f}")
    padded = {k: v for k, v in results.items() if k.startswith("HF padded")}
    if padded:
        best = max(padded, key=padded.get)
        print(f"best HF padded batch: {best} -> minisgl is {ours['tok_s'] / padded[best]:.2f}x")
    print(f"HF load time {hf_startup:.1f}s (process peak RSS now {peak_rss_mb():.0f} MB)")


if __name__ == "__main__":
    main()
