"""What a grammar costs a decode step: SmolLM2-135M, a batch of 32, free vs regex vs JSON schema.

    python benchmarks/bench_grammar.py                 # batch 32, 16 timed decode steps
    python benchmarks/bench_grammar.py --batch 8 --steps 32
    python benchmarks/bench_grammar.py --dtype bfloat16

For each configuration the same 32 chat prompts run together; every request is held in the
batch for the whole measurement (the free ones ignore EOS, the constrained ones have specs
that cannot end sooner), so each decode step has the same batch size. Printed per step
(median over the timed steps): the whole step (run_batch + process_batch_result, which
includes building the mask, applying it, and advancing every matcher), the part spent in
ModelRunner._preprocess_logits (filling and applying the mask: the mask's cost) and its share of
the step, and the step's overhead over the free batch (which also counts advancing the matchers); then the time to
apply one batch's mask with xgrammar's CPU kernel and with minisgl's, alternating. Measured, not
asserted; name the CPU (lscpu) beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

CONFIGS = {
    "free": {"ignore_eos": True},
    # 400 characters exactly: no request can finish early.
    "regex": {"regex": "[a-z ]{400}"},
    # At least 200 items: the array cannot close early.
    "json_schema": {
        "json_schema": json.dumps(
            {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 200, "maxItems": 400}
        )
    },
}


def measure(engine, prompts: list[str], extra: dict, steps: int) -> tuple[float, float]:
    """Median seconds of a decode step, and of its _preprocess_logits, with every request running."""
    scheduler = engine.scheduler
    runner = scheduler.tp_worker.model_runner
    run_batch, process, preprocess = scheduler.run_batch, scheduler.process_batch_result, runner._preprocess_logits
    step_times: list[float] = []
    preprocess_times: list[float] = []
    current = {}

    def timed_run_batch(batch):
        current["decode"], current["start"] = batch.forward_mode.is_decode(), time.perf_counter()
        return run_batch(batch)

    def timed_process(batch, result):
        process(batch, result)
        if current["decode"]:
            step_times.append(time.perf_counter() - current["start"])

    def timed_preprocess(logits_output, sampling_info):
        start = time.perf_counter()
        preprocess(logits_output, sampling_info)
        if current["decode"]:
            preprocess_times.append(time.perf_counter() - start)

    scheduler.run_batch, scheduler.process_batch_result = timed_run_batch, timed_process
    runner._preprocess_logits = timed_preprocess
    try:
        # Two warm-up steps, then the timed ones; every request is still running at the last.
        params = {"temperature": 0, "max_new_tokens": steps + 3, **extra}
        engine.generate(prompt=prompts, sampling_params=params)
    finally:
        scheduler.run_batch, scheduler.process_batch_result = run_batch, process
        runner._preprocess_logits = preprocess
    return statistics.median(step_times[2 : 2 + steps]), statistics.median(preprocess_times[2 : 2 + steps])


def mask_apply_ms(engine, batch: int, kind: str, spec: str) -> tuple[float, float]:
    """Median ms to apply one batch's mask at the first step of ``spec``: xgrammar's CPU kernel
    against minisgl's (kernels/cpu/sampling.cpp), alternating, on the same logits and mask."""
    import torch
    import xgrammar as xgr

    backend = engine.scheduler.grammar_manager._get_backend()
    grammars = [backend.get_cached_or_future_value((kind, spec)).result().copy() for _ in range(batch)]
    vocab = engine.scheduler.worker_info.vocab_size
    mask = grammars[0].allocate_vocab_mask(vocab, batch, "cpu").clone()
    for i, grammar in enumerate(grammars):
        grammar.fill_vocab_mask(mask, i)
    logits = torch.randn(batch, vocab)
    times: dict[str, list[float]] = {"xgrammar": [], "minisgl": []}
    kernels = {
        "xgrammar": lambda x: xgr.apply_token_bitmask_inplace(x, mask),
        "minisgl": lambda x: torch.ops.minisgl_kernel.apply_token_bitmask_cpu(x, mask),
    }
    for _ in range(10):
        for name, fn in kernels.items():
            x = logits.clone()
            start = time.perf_counter()
            fn(x)
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["xgrammar"]) * 1e3, statistics.median(times["minisgl"]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    import torch

    from minisgl.entrypoints.engine import Engine
    from minisgl.model_loader.gguf import resolve_model_path

    engine = Engine(
        model_path=resolve_model_path(args.model_path),
        dtype=args.dtype,
        max_total_tokens=32768,
        disable_radix_cache=True,
    )
    topics = ["the sea", "a city", "music", "a tree", "the moon", "bread", "a river", "winter"]
    prompts = [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Write words about {topics[i % len(topics)]} ({i})."}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(args.batch)
    ]
    print(f"SmolLM2-135M {args.dtype}, batch {args.batch}, {torch.get_num_threads()} threads, "
          f"median of {args.steps} decode steps")  # fmt: skip
    print(f"{'config':<12} {'step ms':>9} {'_preprocess_logits ms':>22} {'share of step':>14} {'overhead vs free':>17}")
    free_ms = None
    for name, extra in CONFIGS.items():
        step, pre = measure(engine, prompts, extra, args.steps)
        free_ms = free_ms or step * 1e3
        overhead = f"{step * 1e3 - free_ms:+.2f} ms ({(step * 1e3 / free_ms - 1) * 100:+.0f}%)"
        print(f"{name:<12} {step * 1e3:>9.2f} {pre * 1e3:>22.3f} {100 * pre / step:>13.1f}% {overhead:>17}")
    for kind, spec in (("regex", CONFIGS["regex"]["regex"]), ("json", CONFIGS["json_schema"]["json_schema"])):
        theirs, ours = mask_apply_ms(engine, args.batch, kind, spec)
        print(f"applying a {kind} mask to {args.batch} rows: xgrammar's CPU kernel {theirs:.3f} ms, "
              f"minisgl's apply_token_bitmask_cpu {ours:.3f} ms ({theirs / ours:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
