"""Distil an EAGLE or EAGLE3 draft head for a model, on CPU, from the model's own outputs.

    python -m minisgl.tools.train_eagle --algorithm EAGLE     # the default model, cached
    python -m minisgl.tools.train_eagle --model-path DIR --algorithm EAGLE3 --out HEAD_DIR

No trained head can be downloaded here, so the tool makes one (SGLang serves heads trained
elsewhere, e.g. by SpecForge; this is the small version of that recipe):

1. Self-distillation data. The prompts come from two places: the text the repository ships
   (the book's headings and paragraphs, README, benchmarks/data) made into chat questions,
   and questions the model writes itself (Magpie, Xu et al. 2024: given the chat template up
   to the user's turn and nothing else, an instruct model samples a typical user message),
   which stand in for the chat data SpecForge trains on and cannot be downloaded here.
   minisgl's own Engine then generates greedy answers to all of them, EOS ignored, as the
   benchmark decodes: the head learns the text it will be asked to draft.
2. Features. Hugging Face transformers runs the target over each prompt + answer once
   (teacher forcing) and keeps what the serving draft reads: the final hidden state after
   the final norm (EAGLE), the residual stream entering layers [2, n // 2, n - 3] (EAGLE3),
   and the target's greedy token at every position.
3. Training (eagle_head.py): every position drafts a chain of --num-steps tokens, each step
   reading its own previous output as the feature, as decode steps 2..k do. The loss is
   EAGLE's: cross-entropy against the target's next-token distribution over the reduced
   vocabulary, plus (EAGLE only) SmoothL1 regression of the target's next feature; later
   chain steps weigh 0.8^s (EAGLE-3's training-time test).
4. A reduced vocabulary, for a cheaper draft LM head: the --hot-vocab-size tokens the
   target predicts most often. EAGLE gets it as --speculative-token-map FILE, EAGLE3 as its
   draft_vocab_size with d2t/t2d (SGLang's formats; see eagle_head.py).
5. Held-out estimate: on prompts not trained on, the chain's mean acceptance length
   (1 + the drafts matching the target's greedy tokens before the first miss), the number
   the engine reports as spec_accept_length, for the trained head and an untrained one.

The result is cached like the GGUF conversion: the same model and arguments reuse the head
(and both algorithms reuse the generated answers) under $MINISGL_CACHE_DIR/eagle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import re
import time

import torch
import torch.nn.functional as F

from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH, cache_root, resolve_model_path
from minisgl.tools.eagle_head import ALGORITHMS, EagleHead

REPO = pathlib.Path(__file__).resolve().parents[2]
VERSION = 2  # bump when the recipe changes, so cached heads are not reused across recipes
INSTRUCTIONS = (
    "Explain this to a beginner: {}",
    "Summarize this in a few sentences: {}",
    "Write a short answer to a question about this: {}",
    "What does this mean, and why does it matter? {}",
)


def progress(message: str) -> None:
    print(message, flush=True)  # visible as it happens when the output goes to a file


def repo_prompts(num_prompts: int, seed: int) -> list[str]:
    """User messages built from the repository's English prose, shuffled deterministically."""
    files = [
        REPO / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
        *sorted((REPO / "benchmarks/data").glob("*.txt")),
    ]
    prompts = []
    for path in files:
        if path.name.endswith(".zh.md") or not path.is_file():
            continue
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # no code blocks
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "")  # links -> their text
        for block in re.split(r"\n\s*\n", text):
            block = " ".join(block.split())
            if block.startswith("#"):
                prompts.append(f"What is {block.lstrip('# ')}?")
            elif len(block) >= 80 and block[0].isalpha():  # prose; tables, lists and HTML start otherwise
                excerpt = block[:240].rsplit(" ", 1)[0] if len(block) > 240 else block  # short, as chat questions are
                prompts.append(INSTRUCTIONS[len(prompts) % len(INSTRUCTIONS)].format(excerpt))
    if not prompts:
        raise FileNotFoundError(f"no prose found under {REPO}: the tool reads the repository's docs/")
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed))
    return [prompts[i] for i in order[:num_prompts]]


def self_prompts(engine, num_prompts: int, seed: int) -> list[str]:
    """User messages the model writes itself: the chat template up to the user's turn, sampled (Magpie).

    Only the messages that end on their own (EOS, not the length limit) and say something
    (16 characters or more) are kept, so a few fewer than num_prompts come back.
    """
    marker = "\x00"  # a character no template emits: everything before it is the pre-query prefix
    chat = engine.tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    prefix = chat[: chat.index(marker)]
    params = [
        {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 64, "seed": seed * 1_000_003 + i}
        for i in range(num_prompts)
    ]
    outputs = engine.generate([prefix] * num_prompts, params)
    texts = [o["text"].strip() for o in outputs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    return [t for t in dict.fromkeys(texts) if len(t) >= 16]  # dict.fromkeys: duplicates dropped, order kept


def generate(model_path: str, prompts: list[str], num_self_prompts: int, seed: int, max_new_tokens: int, log=None):
    """(prompt + greedy answer token ids, prompt length) per prompt, from minisgl's own Engine.

    The model's own questions (self_prompts) join the given prompts, shuffled together so
    that the held-out rows sample both.
    """
    from minisgl.entrypoints.engine import Engine

    engine = Engine(model_path=model_path, dtype="float32", disable_radix_cache=True)
    try:
        own = self_prompts(engine, num_self_prompts, seed) if num_self_prompts else []
        if log:
            log(f"{len(own)} of {num_self_prompts} self-written questions kept, e.g. {own[:2]}")
        prompts = prompts + own
        order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed))
        prompts = [prompts[i] for i in order]
        tokenizer = engine.tokenizer
        chats = [[{"role": "user", "content": p}] for p in prompts]
        ids = [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=True)["input_ids"] for c in chats
        ]
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        outputs = engine.generate(input_ids=ids, sampling_params=params)
    finally:
        engine.shutdown()
    return [(p + o["output_ids"], len(p)) for p, o in zip(ids, outputs)]


def eagle3_layers(num_layers: int) -> list[int]:
    """SGLang's default [2, n // 2, n - 3] (set_eagle3_layers_to_capture), clamped for tiny models."""
    return [min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)]


@torch.no_grad()
def target_features(model_path: str, sequences, eagle3: bool) -> dict:
    """Run the HF target over each sequence: tokens, lengths, greedy tokens, features (right-padded)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    n = model.config.num_hidden_layers
    captured = {}
    layers = eagle3_layers(n) if eagle3 else []
    hooks = [
        model.model.layers[i].register_forward_pre_hook(lambda _m, args, i=i: captured.__setitem__(i, args[0]))
        for i in layers
    ]
    length = max(len(s) for s, _ in sequences)
    tokens = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, (seq, _) in enumerate(sequences):
        tokens[row, : len(seq)] = torch.tensor(seq)
    lengths = torch.tensor([len(s) for s, _ in sequences])
    final = torch.zeros(len(sequences), length, model.config.hidden_size)
    aux = torch.zeros(len(sequences), length, 3 * model.config.hidden_size) if eagle3 else None
    greedy = torch.zeros(len(sequences), length, dtype=torch.long)
    for start in range(0, len(sequences), 8):
        rows = slice(start, start + 8)
        width = int(lengths[rows].max())  # right padding to the chunk's longest: causal attention keeps it exact
        hidden = model.model(input_ids=tokens[rows, :width]).last_hidden_state  # after the final norm
        final[rows, :width] = hidden
        greedy[rows, :width] = model.lm_head(hidden).argmax(-1)
        if eagle3:
            aux[rows, :width] = torch.cat([captured[i] for i in layers], dim=-1)
    for hook in hooks:
        hook.remove()
    return {
        "tokens": tokens,
        "lengths": lengths,
        "prompt_lengths": torch.tensor([p for _, p in sequences]),
        "final": final,
        "first_feature": aux if eagle3 else final,
        "greedy": greedy,
        "embed": model.get_input_embeddings().weight,
        "lm_head": model.get_output_embeddings().weight,
        "config": model.config,
        "aux_layers": layers,
    }


def chain_losses(head: EagleHead, data: dict, rows, num_steps: int, target_rows: torch.Tensor):
    """EAGLE's loss over a chain of num_steps drafts from every position of the given rows."""
    length = int(data["lengths"][rows].max())
    n = length - num_steps
    tokens, final = data["tokens"][rows, :length], data["final"][rows, :length]
    results = head.unroll(tokens, data["first_feature"][rows, :n], num_steps)
    index = torch.arange(n)
    total = 0.0
    for s, (logits, feature) in enumerate(results):
        target = final[:, s + 1 : s + 1 + n]  # the target at position i + s + 1 predicts token i + s + 2
        valid = (index + s + 1 < data["lengths"][rows, None]).float()  # [b, n]
        probs = (target @ target_rows.T).softmax(-1)
        loss = -(probs * logits.log_softmax(-1)).sum(-1)
        if not head.eagle3:  # EAGLE regresses the next feature too (EAGLE-1's weights: 1.0 and 0.1)
            loss = 0.1 * loss + F.smooth_l1_loss(feature, target, reduction="none").mean(-1)
        total = total + 0.8**s * (loss * valid).sum() / valid.sum()
    return total


@torch.no_grad()
def acceptance(head: EagleHead, data: dict, rows, num_steps: int) -> list[float]:
    """Mean acceptance length of chains of k = 1..num_steps drafts, started at every answer position.

    A chain started at i (last token at i + 1, the target's feature at i) keeps draft s while
    it equals the target's greedy token at i + s + 1; verify adds one token of its own.
    """
    accepted, starts = torch.zeros(num_steps), 0
    for start in range(0, len(rows), 8):
        chunk = rows[start : start + 8]
        length = int(data["lengths"][chunk].max())
        n = length - num_steps
        results = head.unroll(data["tokens"][chunk, :length], data["first_feature"][chunk, :n], num_steps)
        alive = torch.ones(len(chunk), n, dtype=torch.bool)
        index = torch.arange(n)
        valid = (index >= data["prompt_lengths"][chunk, None] - 1) & (index + num_steps < data["lengths"][chunk, None])
        for s, (logits, _) in enumerate(results):
            drafted = head.hot_ids[logits.argmax(-1)]
            alive &= drafted == data["greedy"][chunk, s + 1 : s + 1 + n]
            accepted[s] += (alive & valid).sum()
        starts += int(valid.sum())
    return [1 + float(accepted[:k].sum()) / starts for k in range(1, num_steps + 1)]


def train(args: argparse.Namespace, data: dict, log=progress) -> tuple[EagleHead, dict]:
    """Pick the hot vocabulary, train the head, estimate acceptance on the held-out rows."""
    torch.manual_seed(args.seed)
    num_rows = len(data["tokens"])
    held_out = max(1, round(num_rows * args.held_out))
    train_rows, eval_rows = torch.arange(held_out, num_rows), torch.arange(held_out)
    positions = torch.arange(data["tokens"].shape[1])
    in_train = positions < data["lengths"][train_rows, None]
    counts = torch.bincount(data["greedy"][train_rows][in_train], minlength=data["config"].vocab_size)
    hot_ids = counts.topk(min(args.hot_vocab_size, int((counts > 0).sum()))).indices.sort().values
    in_eval = (positions < data["lengths"][eval_rows, None]) & (positions >= data["prompt_lengths"][eval_rows, None])
    coverage = torch.isin(data["greedy"][eval_rows][in_eval], hot_ids).float().mean().item()

    head = EagleHead(data["config"], args.algorithm, data["embed"], data["lm_head"], hot_ids)
    untrained = acceptance(head.eval(), data, eval_rows, args.num_steps)
    target_rows = data["lm_head"].detach().float()[hot_ids]
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    warmup = max(1, args.train_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min((step + 1) / warmup, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.train_steps))),
    )
    head.train()
    start = time.perf_counter()
    for step in range(args.train_steps):
        rows = train_rows[torch.randint(len(train_rows), (args.batch_size,))]
        loss = chain_losses(head, data, rows, args.num_steps, target_rows)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        optimizer.step()
        schedule.step()
        if step % max(1, args.train_steps // 10) == 0 or step == args.train_steps - 1:
            log(f"step {step + 1}/{args.train_steps}: loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)")
    train_seconds = time.perf_counter() - start
    trained = acceptance(head.eval(), data, eval_rows, args.num_steps)
    stats = {
        "train_seconds": train_seconds,
        "params": sum(p.numel() for p in head.state_dict().values()),
        "hot_vocab_size": len(hot_ids),
        "hot_coverage": coverage,
        "acceptance_by_steps": trained,
        "acceptance_untrained_by_steps": untrained,
        "held_out_prompts": held_out,
    }
    return head, stats


def cache_key(args: argparse.Namespace, model_path: str, fields: tuple[str, ...]) -> str:
    """A digest of the target's files (config, weight sizes) and the named arguments."""
    model = pathlib.Path(model_path)
    weights = sorted((f.name, f.stat().st_size) for f in model.glob("*.safetensors"))
    payload = {"version": VERSION, "config": (model / "config.json").read_text(), "weights": weights}
    payload.update({f: getattr(args, f) for f in fields})
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def self_distillation_data(args: argparse.Namespace, model_path: str, log=progress):
    """The generated sequences, cached once per (model, prompts, lengths) for both algorithms."""
    key = cache_key(args, model_path, ("num_prompts", "num_self_prompts", "max_new_tokens", "seed"))
    path = cache_root() / "eagle" / f"answers-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    prompts = repo_prompts(args.num_prompts, args.seed)
    log(
        f"generating {args.num_self_prompts} questions, then greedy answers of {args.max_new_tokens} tokens"
        f" to them and {len(prompts)} prompts from the repository, with minisgl's Engine"
    )
    start = time.perf_counter()
    sequences = generate(model_path, prompts, args.num_self_prompts, args.seed, args.max_new_tokens, log)
    log(f"generated in {time.perf_counter() - start:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sequences))
    return sequences


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=DEFAULT_MODEL_PATH)
    parser.add_argument("--algorithm", choices=ALGORITHMS, required=True)
    parser.add_argument("--out", help="the head's folder (default: a cache folder named by the inputs)")
    parser.add_argument("--num-prompts", type=int, default=128, help="prompts made from the repository's text")
    parser.add_argument("--num-self-prompts", type=int, default=256, help="questions the model writes itself")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="greedy answer length per prompt")
    parser.add_argument("--held-out", type=float, default=0.1, help="share of prompts kept for the estimate")
    parser.add_argument("--hot-vocab-size", type=int, default=2048, help="tokens the head can draft")
    parser.add_argument("--num-steps", type=int, default=3, help="draft chain length trained and estimated")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per training step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)

    model_path = resolve_model_path(args.model_path)
    fields = tuple(k for k in vars(args) if k not in ("model_path", "out"))
    key = cache_key(args, model_path, fields)
    out = pathlib.Path(args.out) if args.out else cache_root() / "eagle" / f"{args.algorithm.lower()}-{key}"
    record = out / "train_eagle.json"
    if record.is_file() and json.loads(record.read_text()).get("key") == key:
        stats = json.loads(record.read_text())
        print(f"reusing the head in {out} (same model and arguments)")
    else:
        sequences = self_distillation_data(args, model_path)
        start = time.perf_counter()
        data = target_features(model_path, sequences, eagle3=args.algorithm == "EAGLE3")
        progress(f"target features for {len(sequences)} sequences in {time.perf_counter() - start:.0f} s")
        head, stats = train(args, data)
        target_config = json.loads((pathlib.Path(model_path) / "config.json").read_text())
        files = head.save(out, target_config, getattr(torch, args.save_dtype), data["aux_layers"])
        stats.update(key=key, bytes=sum((out / f).stat().st_size for f in files), files=files)
        record.write_text(json.dumps(stats, indent=2) + "\n")
    accept = ", ".join(f"k={k + 1}: {a:.2f}" for k, a in enumerate(stats["acceptance_by_steps"]))
    untrained = stats["acceptance_untrained_by_steps"][-1]
    print(f"head: {out} ({args.algorithm}, {stats['params'] / 1e6:.2f} M params, {stats['bytes'] / 1e6:.1f} MB)")
    print(f"training time: {stats['train_seconds']:.0f} s")
    print(f"hot vocabulary: {stats['hot_vocab_size']} tokens, {stats['hot_coverage']:.1%} of held-out greedy tokens")
    print(f"held-out acceptance length (tokens per verify): {accept}; untrained at k={args.num_steps}: {untrained:.2f}")
    if args.algorithm == "EAGLE":
        print(f"serve with: --speculative-token-map {out / 'hot_token_map.pt'}")
    stats["out"] = str(out)
    return stats


if __name__ == "__main__":
    main()
