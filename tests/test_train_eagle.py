"""minisgl.tools.train_eagle at tiny size: the checkpoint follows SGLang's EAGLE / EAGLE3 format,
training on a deterministic stream beats an untrained head on the tool's acceptance estimate,
and the Engine's hidden states that EAGLE trains on are the target's, position by position."""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from minisgl.tools.eagle_data import engine_features, generate, self_prompts, target_features, topic_prompts
from minisgl.tools.make_tiny_model import make_tiny_model
from minisgl.tools.train_eagle import epoch_batches, served_walk, train


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("target"))


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_trained_head_format_and_acceptance(tiny_target, tmp_path, algorithm):
    # A toy stream the target reads: each row counts up by 5 from its own start (prompt length 1).
    sequences = [([3 + (start + 5 * j) % 400 for j in range(40)], 1) for start in range(16)]
    data = target_features(str(tiny_target), sequences, eagle3=algorithm == "EAGLE3")
    args = argparse.Namespace(
        algorithm=algorithm,
        seed=0,
        held_out=0.25,
        hot_vocab_size=96,
        num_steps=2,
        train_steps=40,
        batch_size=4,
        lr=3e-3,
    )
    head, stats = train(args, data, log=lambda *_: None)
    assert stats["acceptance_by_steps"][-1] > stats["acceptance_untrained_by_steps"][-1]
    assert 1.0 <= stats["acceptance_by_steps"][0] <= stats["acceptance_by_steps"][1] <= 3.0
    assert 1.0 <= stats["acceptance_served_walk"] <= 3.0

    target_config = json.loads((tiny_target / "config.json").read_text())
    files = head.save(tmp_path, target_config, torch.bfloat16, data["aux_layers"])
    config = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(tmp_path / "model.safetensors")
    hidden, vocab, n = target_config["hidden_size"], target_config["vocab_size"], stats["hot_vocab_size"]
    kv = target_config["num_key_value_heads"] * hidden // target_config["num_attention_heads"]
    mlp = {f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    attn = {f"self_attn.{p}_proj.weight" for p in "qkvo"}
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["hidden_size"] == hidden and config["vocab_size"] == vocab and config["torch_dtype"] == "bfloat16"
    assert all(t.dtype == torch.bfloat16 for k, t in tensors.items() if k not in ("d2t", "t2d"))
    assert not any(k.startswith(("embed_tokens", "model.")) for k in tensors)  # the target's embedding is shared
    if algorithm == "EAGLE":
        assert config["architectures"] == ["LlamaForCausalLMEagle"]
        layer = {"post_attention_layernorm.weight"} | attn | mlp
        assert set(tensors) == {"fc.weight", "fc.bias"} | {f"layers.0.{k}" for k in layer}
        assert tensors["fc.weight"].shape == (hidden, 2 * hidden) and tensors["fc.bias"].shape == (hidden,)
        assert tensors["layers.0.self_attn.k_proj.weight"].shape == (kv, hidden)
        hot = torch.load(tmp_path / "hot_token_map.pt")
        assert files[-1] == "hot_token_map.pt" and hot.dtype == torch.int64 and hot.shape == (n,)
        assert hot.unique().numel() == n and int(hot.max()) < vocab
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == n
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == data["aux_layers"]
        norms = {"input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight"}
        layer = {f"midlayer.{k}" for k in norms | attn | mlp}
        assert set(tensors) == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | layer
        assert tensors["fc.weight"].shape == (hidden, 3 * hidden) and tensors["lm_head.weight"].shape == (n, hidden)
        assert tensors["midlayer.self_attn.q_proj.weight"].shape == (hidden, 2 * hidden)
        assert tensors["midlayer.self_attn.k_proj.weight"].shape == (kv, 2 * hidden)
        d2t, t2d = tensors["d2t"], tensors["t2d"]
        assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (vocab,)
        assert torch.equal(torch.nonzero(t2d).flatten(), d2t + torch.arange(n))  # draft index i -> i + d2t[i]


def test_served_walk_starts_each_round_where_the_last_one_ended():
    # kept[i]: drafts kept by the chain started at i. Rounds start at 2, then 2 + 3 = 5 (two kept),
    # 5 + 1 = 6 (none kept), 6 + 4 = 10 (three kept): 10 is not before the end, so it stops there.
    kept = [9, 9, 2, 9, 9, 0, 3, 9, 9, 9, 9]
    assert served_walk(kept, first=2, end=10) == [3, 1, 4]
    assert served_walk(kept, first=2, end=2) == []  # an answer too short for a whole chain


def test_epoch_batches_cover_every_row_once_with_less_padding():
    torch.manual_seed(0)
    lengths = torch.randint(20, 300, (500,))
    rows = torch.arange(10, 500)  # the first 10 are held out
    batches = epoch_batches(rows, lengths, batch_size=8)
    assert sorted(torch.cat(batches).tolist()) == rows.tolist()
    assert all(1 <= len(b) <= 8 for b in batches) and sum(len(b) < 8 for b in batches) <= 4  # a short one per pool

    def padding(batches):
        return sum(int(lengths[b].max()) * len(b) - int(lengths[b].sum()) for b in batches)

    random_order = rows[torch.randperm(len(rows))].split(8)
    assert padding(batches) < padding(random_order) / 4
    assert epoch_batches(rows, lengths, batch_size=8)[0].tolist() != batches[0].tolist()  # a new order each epoch


def test_self_prompts_sample_the_users_turn_and_keep_finished_questions():
    # Magpie: the prompt is the chat template cut where the user's message would start; each
    # question gets its own seed; only messages that ended on their own and say something stay.
    class Tokenizer:
        def apply_chat_template(self, messages, tokenize):
            assert not tokenize
            return f"<|system|>hi<|end|><|user|>{messages[0]['content']}<|end|>"

    class FakeEngine:
        tokenizer = Tokenizer()

        def generate(self, prompts, params):
            self.prompts, self.params = prompts, params
            texts = [
                "What makes rain fall?",
                "What makes rain fall?",
                "Too short",
                "Cut off by the limit and",
                "  How do tides work?  ",
            ]
            reasons = ["stop", "stop", "stop", "length", "stop"]
            return [{"text": t, "meta_info": {"finish_reason": {"type": r}}} for t, r in zip(texts, reasons)]

    engine = FakeEngine()
    assert self_prompts(engine, 5, seed=1) == ["What makes rain fall?", "How do tides work?"]
    assert engine.prompts == ["<|system|>hi<|end|><|user|>"] * 5
    assert len({p["seed"] for p in engine.params}) == 5 and all(p["temperature"] == 1.0 for p in engine.params)


def test_topic_prompts_are_distinct_repeatable_and_never_the_benchmarks_subjects():
    # The head is judged on bench_speculative.py's questions, so its training prompts must not ask
    # about their subjects: every question's subject is below, and no topic prompt may name one.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_speculative import QUESTIONS

    prompts = topic_prompts(10_000, seed=0)
    assert len(prompts) == len(set(prompts)) > 2000
    assert topic_prompts(50, seed=0) == prompts[:50] and topic_prompts(50, seed=1) != prompts[:50]
    subjects = [
        "france",
        "hash table",
        "sea",
        "plant",
        "language",
        "sky",
        "cpu",
        "salad",
        "water cycle",
        "weather",
        "climate",
        "bicycle",
        "cinderella",
        "prime number",
        "vaccine",
        "planet",
        "machine learning",
    ]
    patterns = [re.compile(rf"\b{subject}s?\b", re.IGNORECASE) for subject in subjects]
    assert all(any(p.search(q) for p in patterns) for q in QUESTIONS)  # every question's subject is listed
    for subject, pattern in zip(subjects, patterns):
        assert not [p for p in prompts if pattern.search(p)], subject


def test_engine_features_are_the_targets_final_hidden_states(tiny_target):
    # EAGLE trains on the hidden states the Engine returned with its answers (bf16). Position j's
    # must be transformers' final hidden state at j over the same tokens, prompt and answer alike;
    # pairing a token with its neighbour's state (an off-by-one) must not pass.
    sequences, features = generate(str(tiny_target), ["count to ten", "name a colour"], 0, seed=0, max_new_tokens=6)
    data = engine_features(str(tiny_target), sequences, features)
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32)
    for row, (seq, prompt_len) in enumerate(sequences):
        assert len(seq) == prompt_len + 6 and int(data["lengths"][row]) == len(seq) - 1 == len(features[row])
        assert data["greedy"][row, : len(seq) - 1].tolist() == seq[1:]
        with torch.no_grad():
            reference = model.model(input_ids=torch.tensor([seq])).last_hidden_state[0, :-1]
        got = data["final"][row, : len(seq) - 1]
        assert F.cosine_similarity(got, reference, dim=-1).min() > 0.99
        assert F.cosine_similarity(got[1:], reference[:-1], dim=-1).max() < 0.9
