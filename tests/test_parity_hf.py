"""minisgl against Hugging Face transformers on the same checkpoints.

Prefill logits agree within 1e-4 (fp32) and greedy generation gives identical ids,
for a batch of prompts of different lengths run together, so continuous batching
is shown not to change results.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.entrypoints.engine import Engine
from tests._models import tiny_model_dir

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog",
    "Once upon a time, in a land far away, there lived a king who",
    "a b c d e f",
    "What is the capital of France?",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness",
    "1 2 3",
    "Tell me a story about the sea.",
    "x",
]


def _hf_model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def hf_greedy(model, ids: list[int], max_new_tokens: int) -> list[int]:
    """Argmax decoding with HF's own KV cache and no EOS handling (HF's generate would
    suppress or stop at EOS; minisgl with ignore_eos does neither)."""
    out = model(torch.tensor([ids]), use_cache=True)
    generated = []
    for _ in range(max_new_tokens):
        next_id = int(out.logits[0, -1].argmax())
        generated.append(next_id)
        out = model(torch.tensor([[next_id]]), past_key_values=out.past_key_values, use_cache=True)
    return generated


def _capture_prefill_logits(engine: Engine) -> list[torch.Tensor]:
    """Record next_token_logits of every extend forward the worker runs (test instrumentation)."""
    worker = engine.scheduler.tp_worker
    captured = []
    original = worker.forward_batch_generation

    def recording(batch, is_verify=False):
        result = original(batch, is_verify)
        if batch.forward_mode.is_extend():
            captured.append(result.logits_output.next_token_logits.clone())
        return result

    worker.forward_batch_generation = recording
    return captured


def _check_parity(path: str, prompts: list[str], max_new_tokens: int, **engine_kwargs) -> None:
    engine = Engine(model_path=path, max_total_tokens=8192, **engine_kwargs)
    tok = engine.tokenizer
    prompt_ids = [tok.encode(p) for p in prompts]
    assert len({len(p) for p in prompt_ids}) > 4, "prompts must have different lengths"
    captured = _capture_prefill_logits(engine)
    outs = engine.generate(
        input_ids=prompt_ids,
        sampling_params={"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    )
    # All prompts were admitted in one extend batch: its rows are the prompts' last positions.
    assert len(captured[0]) == len(prompts)
    hf = _hf_model(path)
    for i, ids in enumerate(prompt_ids):
        with torch.no_grad():
            hf_logits = hf(torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(captured[0][i], hf_logits, atol=1e-4, rtol=1e-4)
        hf_ids = hf_greedy(hf, ids, max_new_tokens)
        assert outs[i]["output_ids"] == hf_ids, f"prompt {i}: greedy tokens differ from HF"
    assert engine.flush_cache()
    allocator = engine.scheduler.token_to_kv_pool_allocator
    assert allocator.available_size() == engine.scheduler.worker_info.max_total_num_tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"])
def test_parity_tiny(arch):
    _check_parity(tiny_model_dir(arch), PROMPTS, max_new_tokens=32)


@pytest.mark.parametrize("page_size", [4])
def test_parity_tiny_paged(page_size):
    _check_parity(tiny_model_dir("llama"), PROMPTS, max_new_tokens=32, page_size=page_size)


def test_parity_smollm2(smollm2):
    """The real checkpoint, kept short for the default suite (HF's own generate dominates)."""
    _check_parity(smollm2, PROMPTS[:6], max_new_tokens=8)


@pytest.mark.slow
def test_parity_smollm2_long(smollm2):
    _check_parity(smollm2, PROMPTS[:8], max_new_tokens=32)
