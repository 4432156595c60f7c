"""Speculative decoding against plain decoding on the same workload, greedy.

    python benchmarks/bench_speculative.py          # SmolLM2-135M (30 layers), drafts of 15, 25 and 30 layers
    python benchmarks/bench_speculative.py --draft-layers 20 25 --num-steps 2 4 --batch-size 1 4
    python benchmarks/bench_speculative.py --model-path DIR --num-prompts 4 --max-new-tokens 32   # quicker

The draft is the target itself cut to its first --draft-layers layers
(minisgl.tools.make_draft_model): no training, same tokenizer. A draft of all the layers
is the target itself, the reference where every draft is accepted. Workload: --num-prompts
chat questions (the model's chat template), --max-new-tokens tokens each, EOS ignored so
every engine generates exactly the same number of tokens, run --batch-size requests at a
time. For each configuration it prints generated tokens/s, the speedup over plain
decoding, the accept length (tokens per target forward, SGLang's spec_accept_length), the
accept rate (draft tokens kept / drafted), and whether the output equals plain decoding's
token for token (it must, greedy).

Where speculation pays: decoding one request is bound by reading the weights, so the
target scores k + 1 positions for about the price of one; a draft of d of L layers costs
roughly (d + LM head) / (L + LM head) of a target step per drafted token. The round
wins when accept length > verify cost + k * draft cost, in target steps (plus overhead).
An untrained cut of a small model agrees with it rarely (SmolLM2 cut to 25 of 30 layers
keeps about a quarter of its drafts), so expect slowdowns with it; the benchmark shows
the mechanism and its costs, and a trained draft moves the accept length. Large batches
are compute-bound, where verifying rejected drafts is pure waste.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

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


def run(model_path: str, prompts: list[str], max_new_tokens: int, batch_size: int, **engine_kwargs) -> dict:
    from minisgl.entrypoints.engine import Engine

    engine = Engine(model_path=model_path, **engine_kwargs)
    engine.generate(prompts[0], {"max_new_tokens": 2})  # warm up
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    outputs = []
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        outputs += engine.generate(prompts[i : i + batch_size], params)
    seconds = time.perf_counter() - start
    engine.shutdown()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    result = {"tok_s": tokens / seconds, "seconds": seconds, "outputs": [o["output_ids"] for o in outputs]}
    metas = [o["meta_info"] for o in outputs]
    if "spec_verify_ct" in metas[0]:
        result["accept_length"] = sum(m["completion_tokens"] for m in metas) / sum(m["spec_verify_ct"] for m in metas)
        result["accept_rate"] = sum(m["spec_accept_token_num"] for m in metas) / sum(
            m["spec_draft_token_num"] for m in metas
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    parser.add_argument("--draft-layers", type=int, nargs="+", default=[15, 25, 30])
    parser.add_argument("--num-steps", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from minisgl.model_loader.gguf import resolve_model_path
    from minisgl.tools.make_draft_model import make_truncated_model

    model_path = resolve_model_path(args.model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in (QUESTIONS * (args.num_prompts // len(QUESTIONS) + 1))[: args.num_prompts]
    ]
    common = dict(dtype=args.dtype, max_total_tokens=16384, disable_radix_cache=True)
    num_layers = json.loads((Path(model_path) / "config.json").read_text())["num_hidden_layers"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="minisgl-draft-") as workdir:
        drafts = {n: str(make_truncated_model(model_path, Path(workdir) / f"layers{n}", n)) for n in args.draft_layers}
        for bs in args.batch_size:
            base = run(model_path, prompts, args.max_new_tokens, bs, **common)
            rows.append({"batch_size": bs, "draft": "none (plain decode)", "tok_s": base["tok_s"], "speedup": 1.0})
            print(f"bs={bs} plain decode: {base['tok_s']:.1f} tok/s", flush=True)
            for n, draft in drafts.items():
                for k in args.num_steps:
                    spec = run(
                        model_path,
                        prompts,
                        args.max_new_tokens,
                        bs,
                        speculative_algorithm="STANDALONE",
                        speculative_draft_model_path=draft,
                        speculative_num_steps=k,
                        **common,
                    )
                    row = {
                        "batch_size": bs,
                        "draft": f"{n} layers{' (=target)' if n == num_layers else ''}, k={k}",
                        "tok_s": spec["tok_s"],
                        "speedup": spec["tok_s"] / base["tok_s"],
                        "accept_length": spec["accept_length"],
                        "accept_rate": spec["accept_rate"],
                        "same_tokens": spec["outputs"] == base["outputs"],
                    }
                    rows.append(row)
                    print(
                        f"bs={bs} draft {row['draft']}: {row['tok_s']:.1f} tok/s, speedup {row['speedup']:.2f}x, "
                        f"accept length {row['accept_length']:.2f}, accept rate {row['accept_rate']:.2f}, "
                        f"same tokens as plain decode: {row['same_tokens']}",
                        flush=True,
                    )
    print()
    print(
        f"{'bs':>3} | {'draft':<26} | {'tok/s':>7} | {'speedup':>7} | {'accept len':>10} | {'accept rate':>11} | same"
    )
    for r in rows:
        accept = (
            f"{r['accept_length']:10.2f} | {r['accept_rate']:11.2f} | {r['same_tokens']}"
            if "accept_length" in r
            else f"{'':>10} | {'':>11} |"
        )
        print(f"{r['batch_size']:>3} | {r['draft']:<26} | {r['tok_s']:7.1f} | {r['speedup']:6.2f}x | {accept}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
