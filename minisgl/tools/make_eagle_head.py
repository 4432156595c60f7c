"""Write a random EAGLE or EAGLE3 draft head for a target checkpoint, in SGLang's format.

    python -m minisgl.tools.make_eagle_head --model-path DIR --algorithm EAGLE3 --out HEAD_DIR

The head fits the target (hidden size, vocabulary, positions) and loads with
--speculative-draft-model-path; its weights are random, so it drafts badly and every
output is still the target's: what the tests and the golden trace need. The format is
SGLang's: config.json and model.safetensors with the names minisgl/models/llama_eagle.py and
llama_eagle3.py load (no embedding, and for EAGLE no LM head: the target's are shared).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import save_file

from minisgl.model_loader.gguf import resolve_model_path


def make_eagle_head(
    model_path: str, out_dir, algorithm: str = "EAGLE", seed: int = 0, draft_vocab_size: Optional[int] = None
) -> Path:
    """draft_vocab_size (EAGLE3 only): the head's vocabulary, a random subset of the target's."""
    target = json.loads((Path(resolve_model_path(model_path)) / "config.json").read_text())
    h, vocab = target["hidden_size"], target["vocab_size"]
    heads = target["num_attention_heads"]
    config = dict(
        model_type="llama",
        hidden_size=h,
        intermediate_size=2 * h,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=h // heads,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=target["max_position_embeddings"],
        vocab_size=vocab,
        num_hidden_layers=1,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return 0.2 * torch.randn(shape, generator=gen)

    qkv_in = h if algorithm == "EAGLE" else 2 * h
    prefix = "layers.0." if algorithm == "EAGLE" else "midlayer."
    weights = {
        f"{prefix}self_attn.q_proj.weight": rand(h, qkv_in),
        f"{prefix}self_attn.k_proj.weight": rand(h, qkv_in),
        f"{prefix}self_attn.v_proj.weight": rand(h, qkv_in),
        f"{prefix}self_attn.o_proj.weight": rand(h, h),
        f"{prefix}post_attention_layernorm.weight": 1 + rand(h) / 2,
        f"{prefix}mlp.gate_proj.weight": rand(2 * h, h),
        f"{prefix}mlp.up_proj.weight": rand(2 * h, h),
        f"{prefix}mlp.down_proj.weight": rand(h, 2 * h),
    }
    if algorithm == "EAGLE":
        config["architectures"] = ["LlamaForCausalLMEagle"]
        weights.update({"fc.weight": rand(h, 2 * h), "fc.bias": rand(h)})
    elif algorithm == "EAGLE3":
        n = draft_vocab_size or vocab
        hot = torch.randperm(vocab, generator=gen)[:n].sort().values
        config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=n)
        weights.update(
            {
                "fc.weight": rand(h, 3 * h),
                "midlayer.input_layernorm.weight": 1 + rand(h) / 2,
                "midlayer.hidden_norm.weight": 1 + rand(h) / 2,
                "norm.weight": 1 + rand(h) / 2,
                "lm_head.weight": rand(n, h),
                "d2t": hot - torch.arange(n),
                "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, hot, True),
            }
        )
    else:
        raise ValueError(f"algorithm must be EAGLE or EAGLE3, got {algorithm!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(
        {k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--algorithm", choices=("EAGLE", "EAGLE3"), default="EAGLE")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(make_eagle_head(args.model_path, args.out, args.algorithm, args.seed))


if __name__ == "__main__":
    main()
