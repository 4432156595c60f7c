"""A whole MoE model served end to end: the fused MoE kernels against the loop over experts.

    python benchmarks/bench_moe_model.py                  # 6 layers of 64 experts, top 8, hidden 1024
    python benchmarks/bench_moe_model.py --dtypes bfloat16 --rounds 3

bench_moe.py times one layer's experts; this times the engine on a Qwen3-MoE-shaped model, so that
attention, the router, the LM head and the scheduler are in the time too. There is no MoE checkpoint
on PyPI, so the model is random (seed 0, weights N(0, 0.02)) with Qwen3-MoE's layer layout, written
once as safetensors under --cache-dir with SmolLM2's tokenizer (the vocabulary matches). Each
(dtype, path) runs in a fresh process, alternated over --rounds: "fused" is the engine as it is
(fused_experts_cpu, kernels/cpu/moe.cpp), "loop" the same engine with every MoE layer left on
fused_experts_native's loop over experts. Each process serves --requests prompts of --prompt-len
tokens with --output-len greedy tokens each (after a short warm-up) and prints tok/s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from roofline import cpu_name  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

CHILD = r"""
import json, sys, time
args = json.loads(sys.argv[1])
if args["path"] == "loop":  # every MoE layer keeps the per-expert list and the loop
    import minisgl.layers.quantization.unquant as unquant
    unquant._fused_experts_cpu_layout = lambda w13, w2: None
from minisgl.entrypoints.engine import Engine
engine = Engine(model_path=args["model"], dtype=args["dtype"], max_total_tokens=16384, disable_radix_cache=True)
prompts = [[(i * 37 + j) % 40000 + 100 for j in range(args["prompt_len"])] for i in range(args["requests"])]
engine.generate(input_ids=prompts[:2], sampling_params={"max_new_tokens": 4, "ignore_eos": True})
start = time.perf_counter()
engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": args["output_len"], "ignore_eos": True,
                                                    "temperature": 0})
print(json.dumps({"tok_s": args["requests"] * args["output_len"] / (time.perf_counter() - start)}))
"""


def build_model(out: Path, layers: int, hidden: int, experts: int, top_k: int, inter: int) -> Path:
    """The random Qwen3-MoE-shaped checkpoint, written once per shape."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH, resolve_model_path

    out = out / f"qwen3moe-l{layers}-h{hidden}-e{experts}-k{top_k}-i{inter}"
    if (out / "model.safetensors").exists():
        return out
    config = Qwen3MoeConfig(
        vocab_size=49152, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256), head_dim=64, intermediate_size=2 * hidden,
        moe_intermediate_size=inter, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=4096, tie_word_embeddings=False,
        dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    model.save_pretrained(out)
    tokenizer = Path(resolve_model_path(DEFAULT_MODEL_PATH))  # SmolLM2's: 49,152 tokens
    for f in tokenizer.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name in ("vocab.json", "merges.txt"):
            shutil.copy(f, out / f.name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "minisgl" / "bench-moe")
    args = parser.parse_args()
    model = build_model(args.cache_dir, args.layers, args.hidden, args.experts, args.top_k, args.intermediate)
    print(f"CPU: {cpu_name()}; {model.name}; {args.requests} requests x {args.prompt_len} + {args.output_len} tokens")
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for dtype in args.dtypes:
            for path in ("fused", "loop"):
                child = dict(vars(args), model=str(model), dtype=dtype, path=path, cache_dir=None)
                run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(child)], capture_output=True, text=True)
                if run.returncode != 0:
                    raise SystemExit(f"{dtype} {path} failed:\n{run.stderr[-2000:]}")
                results.setdefault((dtype, path), []).append(json.loads(run.stdout.splitlines()[-1])["tok_s"])
    print("dtype    | fused tok/s (each round) | loop tok/s (each round) | fused / loop (best of each)")
    for dtype in args.dtypes:
        fused, loop = results[(dtype, "fused")], results[(dtype, "loop")]
        each = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
        print(f"{dtype:8} | {each(fused):24} | {each(loop):23} | {max(fused) / max(loop):.2f}x")


if __name__ == "__main__":
    main()
