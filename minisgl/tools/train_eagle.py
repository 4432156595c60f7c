"""Distil an EAGLE or EAGLE3 draft head for a model, on CPU, from the model's own outputs.

    python -m minisgl.tools.train_eagle --algorithm EAGLE     # the default model, cached
    python -m minisgl.tools.train_eagle --model-path DIR --algorithm EAGLE3 --out HEAD_DIR

No trained head can be downloaded here, so the tool makes one (SGLang serves heads trained
elsewhere, e.g. by SpecForge; this is the small version of that recipe):

1. Self-distillation data. The prompts come from three places: the text the repository ships
   (the book's headings and paragraphs, README, benchmarks/data) made into chat questions,
   questions the model writes itself (Magpie, Xu et al. 2024: given the chat template up
   to the user's turn and nothing else, an instruct model samples a typical user message),
   and short general questions on a list of subjects (eagle_data.topic_prompts); the last two
   stand in for the chat data SpecForge trains on, which cannot be downloaded here.
   minisgl's own Engine (bfloat16, batched) then generates greedy answers to all of them, EOS
   ignored, as the benchmark decodes: the head learns the text it will be asked to draft.
2. Features, what the serving draft reads. EAGLE's is the target's final hidden state (after
   the final norm), which the same Engine returns with every answer (return_hidden_states),
   so it costs no second pass over the data. EAGLE3's are the residual stream entering
   layers [2, n // 2, n - 3], which the Engine does not return: Hugging Face transformers
   runs the target over each prompt + answer once more (teacher forcing) with hooks there.
   The target's greedy token at every answer position is the answer's next token.
3. Training (eagle_head.py): every position drafts a chain of --num-steps tokens, each step
   reading its own previous output as the feature, as decode steps 2..k do. The loss is
   EAGLE's: cross-entropy against the target's next-token distribution over the reduced
   vocabulary, plus (EAGLE only) SmoothL1 regression of the target's next feature; later
   chain steps weigh 0.8^s (EAGLE-3's training-time test). Each step takes --batch-size
   sequences of similar length (epoch_batches), in a shuffled order that covers all of them
   before it repeats (epochs). Where the CPU multiplies bf16 natively (AVX512-BF16, AMX) the
   head trains under bf16 autocast, about 2.8x faster here with the same loss curve;
   elsewhere in float32.
4. A reduced vocabulary, for a cheaper draft LM head: the --hot-vocab-size tokens the
   target predicts most often. EAGLE gets it as --speculative-token-map FILE, EAGLE3 as its
   draft_vocab_size with d2t/t2d (SGLang's formats; see eagle_head.py).
5. Held-out estimate: on prompts not trained on, the chain's mean acceptance length
   (1 + the drafts matching the target's greedy tokens before the first miss) from every
   answer position, for the trained head and an untrained one; and the same along the walk
   serving takes (each round starting where the last one ended), the number the engine
   reports as spec_accept_length.

The result is cached like the GGUF conversion: the same model and arguments reuse the head
(and both algorithms reuse the generated answers) under $MINISGL_CACHE_DIR/eagle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import time

import torch
import torch.nn.functional as F

from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH, cache_root, resolve_model_path
from minisgl.tools.eagle_data import (
    bf16_autocast,
    engine_features,
    generate,
    repo_prompts,
    target_features,
    topic_prompts,
)
from minisgl.tools.eagle_head import ALGORITHMS, EagleHead

# Bump when the recipe changes, so cached files are not reused across recipes: DATA_VERSION for
# the generated answers, VERSION for the training (a new one retrains on the cached answers).
DATA_VERSION, VERSION = 4, 4


def progress(message: str) -> None:
    print(message, flush=True)  # visible as it happens when the output goes to a file


def chain_losses(head: EagleHead, data: dict, rows, num_steps: int, target_rows: torch.Tensor):
    """EAGLE's loss over a chain of num_steps drafts from every position of the given rows."""
    length = int(data["lengths"][rows].max())
    n = length - num_steps
    tokens, final = data["tokens"][rows, :length], data["final"][rows, :length]
    results = head.unroll(tokens, data["first_feature"][rows, :n], num_steps)
    index = torch.arange(n)
    # The target's next-token distribution over the hot ids at positions 1..length - 1, once:
    # chain step s reads it shifted by s.
    teacher = (final[:, 1:] @ target_rows.T).softmax(-1)
    total = 0.0
    for s, (logits, feature) in enumerate(results):
        target = final[:, s + 1 : s + 1 + n]  # the target at position i + s + 1 predicts token i + s + 2
        valid = (index + s + 1 < data["lengths"][rows, None]).float()  # [b, n]
        probs = teacher[:, s : s + n]
        loss = -(probs * logits.log_softmax(-1)).sum(-1)
        if not head.eagle3:  # EAGLE regresses the next feature too (EAGLE-1's weights: 1.0 and 0.1)
            loss = 0.1 * loss + F.smooth_l1_loss(feature, target, reduction="none").mean(-1)
        total = total + 0.8**s * (loss * valid).sum() / valid.sum()
    return total


def epoch_batches(rows: torch.Tensor, lengths: torch.Tensor, batch_size: int, pool: int = 16) -> list[torch.Tensor]:
    """One epoch of batches in a random order, each of rows of similar length.

    A batch is padded to its longest row, and with rows drawn at random 18% of a batch of the
    default data was padding. Shuffled rows are taken ``pool`` batches at a time and sorted by
    length before they are cut (a bucketing sampler), so batches stay random but tight.
    Every row is in one batch; a pool's last batch may be short.
    """
    order = rows[torch.randperm(len(rows))]
    batches = []
    for start in range(0, len(order), batch_size * pool):
        group = order[start : start + batch_size * pool]
        group = group[lengths[group].argsort()]
        batches += list(group.split(batch_size))
    return [batches[i] for i in torch.randperm(len(batches)).tolist()]


def served_walk(kept: list[int], first: int, end: int) -> list[int]:
    """Tokens per verify of the rounds serving runs over one answer: the first chain starts at
    ``first``, and each next one where the last round ended, one past its kept drafts (kept[i]:
    the drafts kept by the chain started at i; chains start before ``end``)."""
    rounds, i = [], first
    while i < end:
        rounds.append(kept[i] + 1)
        i += kept[i] + 1
    return rounds


@torch.no_grad()
def acceptance(head: EagleHead, data: dict, rows, num_steps: int) -> tuple[list[float], float]:
    """Mean acceptance length of chains of k = 1..num_steps drafts, started at every answer
    position; and at k = num_steps along serving's walk (served_walk).

    A chain started at i (last token at i + 1, the target's feature at i) keeps draft s while
    it equals the target's greedy token at i + s + 1; verify adds one token of its own. Serving
    starts a chain only where the last round ended, right after a miss, and those positions are
    harder to guess than the average one: the walk's mean is the one the engine reports.
    """
    accepted, starts, rounds = torch.zeros(num_steps), 0, []
    for start in range(0, len(rows), 8):
        chunk = rows[start : start + 8]
        length = int(data["lengths"][chunk].max())
        n = length - num_steps
        results = head.unroll(data["tokens"][chunk, :length], data["first_feature"][chunk, :n], num_steps)
        alive = torch.ones(len(chunk), n, dtype=torch.bool)
        index = torch.arange(n)
        valid = (index >= data["prompt_lengths"][chunk, None] - 1) & (index + num_steps < data["lengths"][chunk, None])
        kept = torch.zeros(len(chunk), n, dtype=torch.long)
        for s, (logits, _) in enumerate(results):
            drafted = head.hot_ids[logits.argmax(-1)]
            alive &= drafted == data["greedy"][chunk, s + 1 : s + 1 + n]
            accepted[s] += (alive & valid).sum()
            kept += alive.long()
        starts += int(valid.sum())
        for b, row in enumerate(chunk.tolist()):
            end = int(data["lengths"][row]) - num_steps  # the last chain start `valid` allows, plus one
            rounds += served_walk(kept[b].tolist(), int(data["prompt_lengths"][row]) - 1, end)
    by_steps = [1 + float(accepted[:k].sum()) / starts for k in range(1, num_steps + 1)]
    return by_steps, sum(rounds) / len(rounds) if rounds else float("nan")


def train(args: argparse.Namespace, data: dict, log=progress) -> tuple[EagleHead, dict]:
    """Pick the hot vocabulary, train the head, estimate acceptance on the held-out rows."""
    torch.manual_seed(args.seed)
    num_rows = len(data["tokens"])
    held_out = max(1, round(num_rows * args.held_out))
    train_rows, eval_rows = torch.arange(held_out, num_rows), torch.arange(held_out)
    positions = torch.arange(data["tokens"].shape[1])

    def answers(rows):  # the positions whose greedy token is one the target chose
        return (positions >= data["prompt_lengths"][rows, None] - 1) & (positions < data["lengths"][rows, None])

    counts = torch.bincount(data["greedy"][train_rows][answers(train_rows)], minlength=data["config"].vocab_size)
    hot_ids = counts.topk(min(args.hot_vocab_size, int((counts > 0).sum()))).indices.sort().values
    in_eval = answers(eval_rows)
    coverage = torch.isin(data["greedy"][eval_rows][in_eval], hot_ids).float().mean().item()

    head = EagleHead(data["config"], args.algorithm, data["embed"], data["lm_head"], hot_ids)
    untrained, _ = acceptance(head.eval(), data, eval_rows, args.num_steps)
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
    batches: list[torch.Tensor] = []
    for step in range(args.train_steps):
        if not batches:  # a new epoch: every training row once, in a new order
            batches = epoch_batches(train_rows, data["lengths"], args.batch_size)
        rows = batches.pop()
        with bf16_autocast():
            loss = chain_losses(head, data, rows, args.num_steps, target_rows)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        optimizer.step()
        schedule.step()
        if step % max(1, args.train_steps // 10) == 0 or step == args.train_steps - 1:
            log(f"step {step + 1}/{args.train_steps}: loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)")
    train_seconds = time.perf_counter() - start
    trained, walk = acceptance(head.eval(), data, eval_rows, args.num_steps)
    stats = {
        "train_seconds": train_seconds,
        "params": sum(p.numel() for p in head.state_dict().values()),
        "hot_vocab_size": len(hot_ids),
        "hot_coverage": coverage,
        "acceptance_by_steps": trained,
        "acceptance_served_walk": walk,
        "acceptance_untrained_by_steps": untrained,
        "held_out_prompts": held_out,
    }
    return head, stats


def cache_key(args: argparse.Namespace, model_path: str, fields: tuple[str, ...], version: int = VERSION) -> str:
    """A digest of the recipe's version, the target's files (config, weight sizes) and the named arguments."""
    model = pathlib.Path(model_path)
    weights = sorted((f.name, f.stat().st_size) for f in model.glob("*.safetensors"))
    payload = {"version": version, "config": (model / "config.json").read_text(), "weights": weights}
    payload.update({f: getattr(args, f) for f in fields})
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def self_distillation_data(args: argparse.Namespace, model_path: str, log=progress):
    """The generated sequences and their final hidden states, cached once per (model, prompts,
    lengths) for both algorithms."""
    fields = ("num_prompts", "num_self_prompts", "num_topic_prompts", "max_new_tokens", "seed")
    key = cache_key(args, model_path, fields, DATA_VERSION)
    path = cache_root() / "eagle" / f"answers-{key}.pt"
    if path.is_file():
        return torch.load(path)
    prompts = repo_prompts(args.num_prompts, args.seed) + topic_prompts(args.num_topic_prompts, args.seed)
    log(
        f"generating {args.num_self_prompts} questions, then greedy answers of {args.max_new_tokens} tokens"
        f" to them and {len(prompts)} prompts from the repository and the topic list, with minisgl's Engine"
    )
    start = time.perf_counter()
    sequences, features = generate(model_path, prompts, args.num_self_prompts, args.seed, args.max_new_tokens, log)
    log(f"generated {sum(len(s) for s, _ in sequences)} tokens in {time.perf_counter() - start:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save((sequences, features), path)
    return sequences, features


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=DEFAULT_MODEL_PATH)
    parser.add_argument("--algorithm", choices=ALGORITHMS, required=True)
    parser.add_argument("--out", help="the head's folder (default: a cache folder named by the inputs)")
    parser.add_argument("--num-prompts", type=int, default=400, help="prompts made from the repository's text")
    parser.add_argument("--num-self-prompts", type=int, default=700, help="questions the model writes itself")
    parser.add_argument("--num-topic-prompts", type=int, default=1500, help="general questions on listed subjects")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="greedy answer length per prompt")
    parser.add_argument("--held-out", type=float, default=0.1, help="share of prompts kept for the estimate")
    parser.add_argument("--hot-vocab-size", type=int, default=2048, help="tokens the head can draft")
    parser.add_argument("--num-steps", type=int, default=3, help="draft chain length trained and estimated")
    parser.add_argument("--train-steps", type=int, default=1300)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per training step")
    parser.add_argument("--lr", type=float, default=3e-3)
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
        sequences, features = self_distillation_data(args, model_path)
        start = time.perf_counter()
        if args.algorithm == "EAGLE":
            data = engine_features(model_path, sequences, features)
        else:
            data = target_features(model_path, sequences, eagle3=True)
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
    if "acceptance_served_walk" in stats:  # heads trained before the walk was estimated lack it
        print(f"held-out, rounds as serving runs them at k={args.num_steps}: {stats['acceptance_served_walk']:.2f}")
    if args.algorithm == "EAGLE":
        print(f"serve with: --speculative-token-map {out / 'hot_token_map.pt'}")
    stats["out"] = str(out)
    return stats


if __name__ == "__main__":
    main()
