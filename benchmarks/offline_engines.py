"""One engine of bench_offline.py, in the process bench_offline.py starts for it (``--engine NAME``):
minisgl's offline ``Engine`` or HF transformers' ``generate`` on the workload, printing one line,
``RESULT {json}``, with its tokens/s, startup and peak RSS (vLLM and llama.cpp have their own
scripts, peer_vllm.py and peer_llama_cpp.py, run with their own interpreters).
"""

from __future__ import annotations

import json
import os
import time

import torch
from peer_llama_cpp import peak_rss_mb
from workload import make_workload


def run_minisgl(
    path, workload, dtype, max_total_tokens, kv_cache_dtype="auto", enable_torch_compile=False, page_size=1
):
    from minisgl.entrypoints.engine import Engine

    start = time.perf_counter()
    engine = Engine(
        model_path=path,
        dtype=dtype,
        max_total_tokens=max_total_tokens,
        kv_cache_dtype=kv_cache_dtype,
        page_size=page_size,
        enable_torch_compile=enable_torch_compile,
        torch_compile_max_bs=len(workload),
    )
    if enable_torch_compile:
        warm_up_decode_buckets(engine, len(workload))
    else:
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


def warm_up_decode_buckets(engine, num_requests: int) -> None:
    """Compile every graph-runner bucket a run of num_requests will decode in, before the clock starts.

    minisgl compiles a bucket when a batch first needs it, and a workload whose requests finish at
    different steps walks its decode batch down through every bucket: timed, that run would count
    each bucket's compile (seconds, even from inductor's on-disk cache) as serving time. SGLang's
    runners capture every batch size at start-up instead; this does the same here, and the time goes
    to startup. Requests that end one step apart take the batch from num_requests down to 1 (the
    first decodes all of them: each asks for two tokens or more, one of which the prefill gives)."""
    params = [{"max_new_tokens": i + 2, "ignore_eos": True} for i in range(num_requests)]
    engine.generate(input_ids=[[1, 2, 3]] * num_requests, sampling_params=params)


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

    def timed_forward(forward_batch, **kwargs):  # kwargs: ModelRunner.forward's (pp_proxy_tensors)
        start = time.perf_counter()
        out = forward(forward_batch, **kwargs)
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


def load_hf_model(path, dtype):
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
    model = load_hf_model(path, dtype)
    model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=1, do_sample=False, pad_token_id=0)
    startup = time.perf_counter() - start
    tok_s = bench_hf_one_at_a_time(model, workload) if mode == "one" else bench_hf_padded(model, workload, batch_size)
    return {"tok_s": tok_s, "startup_s": startup}


def worker_main(args, workload_kwargs) -> None:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    workload = make_workload(**workload_kwargs)
    if args.engine == "minisgl":
        out = run_minisgl(
            args.model_path,
            workload,
            args.dtype,
            args.max_total_tokens,
            args.kv_cache_dtype,
            args.enable_torch_compile,
            args.page_size,
        )
    elif args.engine == "hf-one":
        out = run_hf(args.model_path, workload[: args.hf_one_at_a_time], args.dtype, "one", 1)
    else:
        out = run_hf(args.model_path, workload, args.dtype, "padded", int(args.engine.removeprefix("hf-padded-")))
    # VmHWM, not getrusage's ru_maxrss: a child's ru_maxrss starts at its parent's high-water mark
    # (kept across fork and exec), and bench_offline's parent has touched a 1 GiB buffer to
    # measure DRAM bandwidth, so every engine's peak read about 1.5 GB whatever the dtype.
    out["peak_rss_mb"] = peak_rss_mb(os.getpid())
    print("RESULT " + json.dumps(out), flush=True)
