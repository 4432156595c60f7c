"""Speculative decoding against plain decoding on the same workload, greedy: STANDALONE, EAGLE, EAGLE3.

    python benchmarks/bench_speculative.py      # SmolLM2-135M: plain, STANDALONE, EAGLE, EAGLE3; bs 1/4/16; f32, bf16
    python benchmarks/bench_speculative.py --algorithms EAGLE --batch-size 1 --dtype float32 --num-prompts 4  # quicker
    python benchmarks/bench_speculative.py --eagle-head DIR --eagle3-head DIR3    # heads trained earlier
    python benchmarks/bench_speculative.py --algorithms EAGLE --batch-size 1 --eagle-topk 1 4 \
        --num-draft-tokens 8 16 --rounds 3      # chain and two trees, every configuration run in turn 3 times
    python benchmarks/bench_speculative.py --algorithms EAGLE --batch-size 1 --enable-torch-compile

Drafts:
- STANDALONE: the target itself cut to its first --draft-layers layers
  (minisgl.tools.make_draft_model): no training, same tokenizer.
- EAGLE / EAGLE3: one-layer heads reading the target's hidden states, trained by
  ``python -m minisgl.tools.train_eagle`` (run here with its defaults when no head is given:
  16 1/2 minutes for the EAGLE head on 2 cores of a Zen 4 EPYC, longer without
  AVX512-BF16 and for EAGLE3, whose features take a transformers pass; the first time only,
  cached). EAGLE drafts over its hot-token map (--speculative-token-map), EAGLE3 over its own
  draft vocabulary. Both draft a chain (--speculative-eagle-topk 1,
  --speculative-num-draft-tokens k + 1), and with --eagle-topk 1 4 also a tree of 4 branches
  per step whose --num-draft-tokens best nodes are verified at once.

Workload: --num-prompts chat questions (the model's chat template; the heads were trained
on prompts made from the repository's docs, on questions the model wrote itself and on
questions on a list of subjects none of these asks about, never on these), --max-new-tokens
tokens each, EOS ignored so every engine generates exactly the same number of tokens, run --batch-size
requests at a time. For each configuration it prints generated tokens/s, the speedup over
plain decoding in the same dtype and batch size, the accept length (tokens per target
forward, SGLang's spec_accept_length), the accept rate (draft tokens kept / drafted), the
draft and verify time per round (draft = the worker's draft + draft extend after verify;
wall time of those methods, measured by wrapping them in this process; the draft extend runs
inside verify and is counted once, in draft, so the two add up to the worker's round), the part
of that round spent inside the target's and the draft's forwards, graph replays included ("model
ms"; the rest of draft + verify is Python and small torch calls around them), and whether the
output equals plain decoding's token for token (it must, greedy; bfloat16 rounds the
verify's batched positions differently from single steps, so a near-tie may flip there).

Where speculation pays: decoding one request is bound by reading the weights, so the
target scores k + 1 positions for about the price of one, and a round wins when the accept
length exceeds (verify + k drafts) in target steps. A cut of d layers costs about
(d + LM head) / (L + LM head) of a target step per draft; an EAGLE head one layer plus a
reduced LM head, a few percent. Large batches are compute-bound, where verifying rejected
drafts is pure waste. Wall-clock numbers move with the host; compare ratios within one run.
--enable-torch-compile runs every configuration, plain decoding included, with CPUGraphRunner:
plain decode steps, a target's verify, STANDALONE's and an EAGLE head's draft steps compiled,
and the head's draft extend after verify; each batch size's buckets compile in the warm-up,
outside the timing.
--rounds N runs plain decoding and every configuration once per round, in turn, N times,
and shows each row's fastest run: a shared host that slows down for a minute then slows
every configuration's worst run, not one configuration's only run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from roofline import cpu_name  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUESTIONS = [
    "What is the capital of France?",
    "Explain what a hash table is in two sentences.",
    "Write a short poem about the sea.",
    "How do plants make food from sunlight?",
    "List three tips for learning a new language.",
    "Why is the sky blue?",
    "What does a CPU do?",
    "Give me a recipe for a simple salad.",
    "Describe the water cycle.",
    "What is the difference between weather and climate?",
    "How does a bicycle stay upright?",
    "Summarize the story of Cinderella.",
    "What are prime numbers?",
    "How do vaccines work?",
    "Name the planets of the solar system.",
    "What is machine learning?",
]


@contextlib.contextmanager
def phase_timer(timings: dict):
    """Accumulate the wall time of the speculative workers' draft and verify methods (in-process
    scheduler), and of the model forwards inside them (graph replays included) as "model"."""
    from minisgl.model_executor.cpu_graph_runner import CPUGraphRunner
    from minisgl.model_executor.model_runner import ModelRunner
    from minisgl.speculative.eagle_worker import EAGLEWorker
    from minisgl.speculative.standalone_worker import StandaloneWorker

    # verify calls forward_draft_extend_after_decode itself: that time is the draft's, so it is
    # counted there and taken out of verify's (before, a round's draft + verify counted it twice).
    phases = {"draft": "draft", "forward_draft_extend_after_decode": "draft", "verify": "verify"}
    originals = [(cls, name, getattr(cls, name)) for cls in (EAGLEWorker, StandaloneWorker) for name in phases]
    # A forward replays its graph inside ModelRunner.forward, EAGLE's draft extend calls the replay
    # itself: only the outermost of the two is timed, and only inside a round (not a prefill).
    models = [(ModelRunner, "forward", ModelRunner.forward), (CPUGraphRunner, "replay", CPUGraphRunner.replay)]
    depth = {"round": 0, "model": 0}

    def timed(method, phase, inside_verify):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            depth["round"] += 1
            try:
                return method(*args, **kwargs)
            finally:
                depth["round"] -= 1
                seconds = time.perf_counter() - start
                timings[phase] = timings.get(phase, 0.0) + seconds
                timings[f"{phase}_calls"] = timings.get(f"{phase}_calls", 0) + 1
                if inside_verify:
                    timings["verify"] = timings.get("verify", 0.0) - seconds

        return wrapper

    def timed_model(method):
        def wrapper(*args, **kwargs):
            if depth["model"] or not depth["round"]:
                return method(*args, **kwargs)
            start, depth["model"] = time.perf_counter(), 1
            try:
                return method(*args, **kwargs)
            finally:
                depth["model"] = 0
                timings["model"] = timings.get("model", 0.0) + time.perf_counter() - start

        return wrapper

    for cls, name, method in originals:
        setattr(cls, name, timed(method, phases[name], inside_verify=name == "forward_draft_extend_after_decode"))
    for cls, name, method in models:
        setattr(cls, name, timed_model(method))
    try:
        yield timings
    finally:
        for cls, name, method in originals + models:
            setattr(cls, name, method)


def run(model_path: str, prompts: list[str], max_new_tokens: int, batch_size: int, **engine_kwargs) -> dict:
    from minisgl.entrypoints.engine import Engine
    from minisgl.model_executor.graph_runner import get_batch_sizes_to_capture

    engine = Engine(model_path=model_path, **engine_kwargs)
    # Warm up; with compile, every bucket a batch of batch_size can shrink to (requests of a
    # speculative batch finish in different rounds), so no compile falls inside the timing.
    compiled = engine_kwargs.get("enable_torch_compile")
    warm_up = get_batch_sizes_to_capture(batch_size) if compiled else [1]
    for n in warm_up:
        engine.generate(prompts[:n], {"max_new_tokens": 4})
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    outputs = []
    with phase_timer({}) as timings:
        start = time.perf_counter()
        for i in range(0, len(prompts), batch_size):
            outputs += engine.generate(prompts[i : i + batch_size], params)
        seconds = time.perf_counter() - start
    engine.shutdown()
    aborted = [o["meta_info"]["finish_reason"] for o in outputs if o["meta_info"]["finish_reason"]["type"] == "abort"]
    if aborted:
        return {"error": aborted[0].get("message", "aborted")}
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    result = {"tok_s": tokens / seconds, "seconds": seconds, "outputs": [o["output_ids"] for o in outputs]}
    metas = [o["meta_info"] for o in outputs]
    if "spec_verify_ct" in metas[0]:
        result["accept_length"] = sum(m["completion_tokens"] for m in metas) / sum(m["spec_verify_ct"] for m in metas)
        result["accept_rate"] = sum(m["spec_accept_token_num"] for m in metas) / sum(
            m["spec_draft_token_num"] for m in metas
        )
        rounds = max(1, timings.get("verify_calls", 0))
        result["draft_ms"] = 1000 * timings.get("draft", 0.0) / rounds
        result["verify_ms"] = 1000 * timings.get("verify", 0.0) / rounds
        result["model_ms"] = 1000 * timings.get("model", 0.0) / rounds
    return result


def describe(result: dict, base: dict | None) -> str:
    """One run's line: its rate and, for a speculative one, how it drafted and verified."""
    if "error" in result:
        return f"failed: {result['error']}"
    line = f"{result['tok_s']:.1f} tok/s"
    if base and "tok_s" in base and "accept_length" in result:
        line += (
            f", speedup {result['tok_s'] / base['tok_s']:.2f}x over the best plain run so far, accept length "
            f"{result['accept_length']:.2f}, draft {result['draft_ms']:.1f} ms and verify {result['verify_ms']:.1f} ms "
            f"per round ({result['model_ms']:.1f} of them in model forwards), same tokens as plain decode: "
            f"{result['outputs'] == base['outputs']}"
        )
    return line


def eagle_head(algorithm: str, given: str | None, model_path: str) -> tuple[str, str | None]:
    """(head folder, EAGLE's token map or None): the given folder, or train_eagle's cached default head."""
    if given is None:
        from minisgl.tools.train_eagle import main as train_eagle

        given = train_eagle(["--model-path", model_path, "--algorithm", algorithm])["out"]
    token_map = Path(given) / "hot_token_map.pt"
    return given, str(token_map) if algorithm == "EAGLE" and token_map.is_file() else None


def configurations(args, model_path: str, workdir: str) -> list[tuple[str, dict]]:
    """(row label, engine arguments) of every speculative configuration asked for."""
    from minisgl.tools.make_draft_model import make_truncated_model

    configs = []
    if "STANDALONE" in args.algorithms:
        for n in args.draft_layers:
            draft = str(make_truncated_model(model_path, Path(workdir) / f"layers{n}", n))
            for k in args.num_steps:
                spec = dict(speculative_draft_model_path=draft, speculative_num_steps=k)
                configs.append((f"STANDALONE {n} layers, k={k}", dict(speculative_algorithm="STANDALONE", **spec)))
    for algorithm, given in (("EAGLE", args.eagle_head), ("EAGLE3", args.eagle3_head)):
        if algorithm in args.algorithms:
            head, token_map = eagle_head(algorithm, given, model_path)
            for k in args.num_steps:
                for topk in args.eagle_topk:
                    for tokens in [k + 1] if topk == 1 else args.num_draft_tokens:
                        spec = dict(
                            speculative_algorithm=algorithm, speculative_draft_model_path=head, speculative_num_steps=k
                        )
                        spec.update(
                            speculative_eagle_topk=topk,
                            speculative_num_draft_tokens=tokens,
                            speculative_token_map=token_map,
                        )
                        shape = f"k={k}" if topk == 1 else f"k={k} tree {topk}x{tokens}"
                        configs.append((f"{algorithm} head, {shape}", spec))
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--algorithms", nargs="+", default=["STANDALONE", "EAGLE", "EAGLE3"])
    parser.add_argument("--draft-layers", type=int, nargs="+", default=[15], help="STANDALONE's cut of the target")
    parser.add_argument("--num-steps", type=int, nargs="+", default=[3])
    parser.add_argument("--eagle-topk", type=int, nargs="+", default=[1], help="EAGLE branches per step (1: chain)")
    parser.add_argument("--num-draft-tokens", type=int, nargs="+", default=[8], help="nodes a tree (topk > 1) verifies")
    parser.add_argument("--eagle-head", help="an EAGLE head folder (default: train_eagle's, trained once)")
    parser.add_argument("--eagle3-head", help="an EAGLE3 head folder (default: train_eagle's, trained once)")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="runs of every configuration, in turn; the best is shown")
    parser.add_argument("--enable-torch-compile", action="store_true", help="CPUGraphRunner in every configuration")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from minisgl.model_loader.gguf import resolve_model_path

    model_path = resolve_model_path(args.model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in (QUESTIONS * (args.num_prompts // len(QUESTIONS) + 1))[: args.num_prompts]
    ]
    rows = []
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="minisgl-draft-") as workdir:
        configs = [("none (plain decode)", {})] + configurations(args, model_path, workdir)
        for dtype in args.dtype:
            common = dict(dtype=dtype, max_total_tokens=16384, disable_radix_cache=True)
            if args.enable_torch_compile:
                common.update(enable_torch_compile=True, torch_compile_max_bs=max(args.batch_size))
            for bs in args.batch_size:
                best: dict[str, dict] = {}
                for _ in range(args.rounds):  # every configuration once per round, so all see the same machine
                    for label, spec in configs:
                        result = run(model_path, prompts, args.max_new_tokens, bs, **common, **spec)
                        if label not in best or best[label].get("tok_s", 0) < result.get("tok_s", 0):
                            best[label] = result
                        print(f"{dtype} bs={bs} {label}: {describe(result, best[configs[0][0]])}", flush=True)
                base = best[configs[0][0]]
                for label, _ in configs:
                    row = {"dtype": dtype, "batch_size": bs, "draft": label, **best[label]}
                    if "error" not in row and "error" not in base:  # one broken run should not end a long one
                        row.update(speedup=row["tok_s"] / base["tok_s"], same_tokens=row["outputs"] == base["outputs"])
                    rows.append(row)
    rounds = f", best of {args.rounds} rounds" if args.rounds > 1 else ""
    print(f"\nCPU: {cpu_name()}; {args.num_prompts} prompts x {args.max_new_tokens} tokens, greedy{rounds}")
    head = (
        f"{'dtype':<8} | {'bs':>3} | {'draft':<30} | {'tok/s':>6} | {'speedup':>7} | {'acc len':>7} | {'acc rate':>8}"
    )
    print(f"{head} | {'draft ms':>8} | {'verify ms':>9} | {'model ms':>8} | same")
    for r in rows:
        if "error" in r:
            print(f"{r['dtype']:<8} | {r['batch_size']:>3} | {r['draft']:<30} | failed: {r['error']}")
            continue
        spec = (
            f"{r['accept_length']:7.2f} | {r['accept_rate']:8.2f} | {r['draft_ms']:8.1f} | {r['verify_ms']:9.1f} | "
            f"{r['model_ms']:8.1f} | {r.get('same_tokens')}"
            if "accept_length" in r
            else f"{'':>7} | {'':>8} | {'':>8} | {'':>9} | {'':>8} |"
        )
        label = f"{r['dtype']:<8} | {r['batch_size']:>3} | {r['draft']:<30}"
        print(f"{label} | {r['tok_s']:6.1f} | {r.get('speedup', float('nan')):6.2f}x | {spec}")
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in rows], indent=2))


if __name__ == "__main__":
    main()
