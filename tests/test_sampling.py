"""Sampling parameters end to end: stop conditions, seeds, truncation, penalties, distribution."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.entrypoints.engine import Engine
from tests._models import tiny_model_dir

PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def engine():
    return Engine(model_path=tiny_model_dir("llama"), max_total_tokens=4096)


def _gen(engine, prompts=None, **params):
    return engine.generate(input_ids=prompts or PROMPT, sampling_params=params)


def test_stop_token_ids_and_ignore_eos(engine):
    free = _gen(engine, temperature=0, max_new_tokens=12, ignore_eos=True)["output_ids"]
    stop_at = free[4]
    out = _gen(engine, temperature=0, max_new_tokens=12, ignore_eos=True, stop_token_ids=[stop_at])
    first = free.index(stop_at)
    assert out["output_ids"] == free[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}


def test_stop_string_trims_text(engine):
    free = _gen(engine, temperature=0, max_new_tokens=16, ignore_eos=True)
    text = free["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    out = _gen(engine, temperature=0, max_new_tokens=16, ignore_eos=True, stop=stop)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in out["text"] and text.startswith(out["text"])


def test_seed_is_reproducible_and_batch_invariant(engine):
    params = dict(temperature=1.0, max_new_tokens=10, ignore_eos=True, seed=1234)
    alone = _gen(engine, **params)["output_ids"]
    again = _gen(engine, **params)["output_ids"]
    batched = engine.generate(
        input_ids=[[1, 2, 3], PROMPT, [4] * 9],
        sampling_params=[{**params, "seed": 1}, params, {**params, "seed": 2}],
    )[1]["output_ids"]
    assert alone == again == batched
    other = _gen(engine, **{**params, "seed": 99})["output_ids"]
    assert other != alone


def test_seed_does_not_depend_on_how_the_prompt_was_chunked():
    """A chunk's row draws nothing from its request's generator: a 40-token prompt prefilled in
    one piece, in chunks of 16, or in chunks of 8 samples the same tokens under one seed."""
    prompt = [(13 * i) % 400 + 3 for i in range(40)]
    params = dict(temperature=1.0, max_new_tokens=10, ignore_eos=True, seed=1234)
    runs = []
    for chunk in (64, 16, 8):
        engine = Engine(model_path=tiny_model_dir("llama"), max_total_tokens=4096, chunked_prefill_size=chunk)
        runs.append(_gen(engine, [prompt], **params)[0]["output_ids"])
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_truncation_to_one_token_is_greedy(engine):
    greedy = _gen(engine, temperature=0, max_new_tokens=8, ignore_eos=True)["output_ids"]
    for params in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        out = _gen(engine, temperature=1.3, max_new_tokens=8, ignore_eos=True, seed=7, **params)
        assert out["output_ids"] == greedy, params


def test_first_token_distribution_matches_softmax(engine):
    """Draws over many seeds follow softmax(logits / T) of HF's model (a chi-square-style bound)."""
    temperature, n = 0.8, 400
    prompts = [PROMPT] * n
    params = [{"temperature": temperature, "max_new_tokens": 1, "seed": s} for s in range(n)]
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    counts = torch.bincount(torch.tensor([o["output_ids"][0] for o in outs]), minlength=512).float()
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"), dtype=torch.float32)
    with torch.no_grad():
        probs = torch.softmax(hf(torch.tensor([PROMPT])).logits[0, -1] / temperature, dim=-1)
    top = probs.topk(5).indices
    for token in top.tolist():
        expected = probs[token].item() * n
        sigma = (n * probs[token].item() * (1 - probs[token].item())) ** 0.5
        assert abs(counts[token].item() - expected) <= 4 * sigma + 1, (token, counts[token].item(), expected)
    # Nothing is drawn that the model makes (nearly) impossible.
    assert counts[probs < 1e-6].sum() == 0


def test_top_k_limits_support(engine):
    prompts = [PROMPT] * 60
    params = [{"temperature": 5.0, "top_k": 3, "max_new_tokens": 1, "seed": s} for s in range(60)]
    firsts = {o["output_ids"][0] for o in engine.generate(input_ids=prompts, sampling_params=params)}
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"), dtype=torch.float32)
    with torch.no_grad():
        allowed = set(hf(torch.tensor([PROMPT])).logits[0, -1].topk(3).indices.tolist())
    assert firsts <= allowed and len(firsts) > 1


@pytest.mark.parametrize(
    "penalties",
    [
        {"frequency_penalty": 1.5},
        {"presence_penalty": 1.5},
        {"repetition_penalty": 1.8},
        {"frequency_penalty": 0.5, "presence_penalty": 0.5},
    ],
)
def test_penalties_match_a_reference(engine, penalties):
    """Greedy decoding under penalties equals the same rule applied to HF's logits by hand."""
    steps = 12
    got = _gen(engine, temperature=0, max_new_tokens=steps, ignore_eos=True, **penalties)["output_ids"]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"), dtype=torch.float32)
    freq, pres = penalties.get("frequency_penalty", 0.0), penalties.get("presence_penalty", 0.0)
    rep = penalties.get("repetition_penalty", 1.0)
    out: list[int] = []
    for _ in range(steps):
        with torch.no_grad():
            logits = hf(torch.tensor([PROMPT + out])).logits[0, -1]
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.numel()).float()
        logits = logits - freq * counts - pres * (counts > 0).float()
        seen = torch.zeros_like(logits, dtype=torch.bool)
        seen[torch.tensor(PROMPT + out)] = True
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
        out.append(int(logits.argmax()))
    assert got == out
    plain = _gen(engine, temperature=0, max_new_tokens=steps, ignore_eos=True)["output_ids"]
    assert got != plain, "the penalty should change this tiny model's greedy path"
