"""--enable-mixed-chunk (SGLang's mixed-style chunked prefill): while a prompt is prefilled in
chunks, the running requests' decode step rides in the same forward (ForwardMode.MIXED), each as an
extend of one token on its own KV (ScheduleBatch.mix_with_running).

The tokens must be those of the unmixed engine (greedy and seeded, with the radix cache, pages of
4, grammars, retraction, the overlap loop, TP 2) with the KV pool whole afterwards; the logprobs and
hidden states of mixed batches those of the unmixed ones; what cannot mix is refused by name.
"""

import pytest
import torch

from minisgl import tracing
from minisgl.entrypoints.engine import Engine
from minisgl.managers.schedule_batch import ScheduleBatch
from minisgl.server_args import ServerArgs
from tests._models import tiny_model_dir
from tests._traces import fresh_and_golden

# Prompts of 20 to 65 tokens in chunks of 16: later prompts are still prefilling while earlier ones decode.
PROMPTS = [[(7 * i + 3 * j) % 500 + 3 for j in range(20 + 9 * i)] for i in range(6)]
PARAMS = [
    {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True},
    {"temperature": 0.8, "seed": 4, "max_new_tokens": 10, "ignore_eos": True},
    {"temperature": 0, "max_new_tokens": 9, "regex": "[a-z]+ [0-9]+"},
    {"temperature": 1.0, "top_k": 20, "seed": 11, "max_new_tokens": 14, "ignore_eos": True},
    {"temperature": 0, "max_new_tokens": 8, "frequency_penalty": 0.5, "ignore_eos": True},
    {"temperature": 0, "max_new_tokens": 6},  # may stop at EOS
]
KW = dict(max_total_tokens=2048, chunked_prefill_size=16)


def _run(mixed: bool, prompts=PROMPTS, params=PARAMS, arch="llama", **kwargs) -> tuple[list[dict], list[str], Engine]:
    engine = Engine(model_path=tiny_model_dir(arch), enable_mixed_chunk=mixed, **{**KW, **kwargs})
    with tracing.record() as events:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    modes = [e["forward_mode"] for e in events if e["event"] == "Scheduler.get_next_batch_to_run"]
    return outs, modes, engine


def _assert_pool_whole(engine: Engine) -> None:
    sched = engine.scheduler
    assert sched.is_idle() and engine.flush_cache()
    assert sched.token_to_kv_pool_allocator.available_size() == sched.worker_info.max_total_num_tokens
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"page_size": 4}, {"disable_radix_cache": True}, {"disable_overlap_schedule": False}],
    ids=["radix", "page4", "no-radix", "overlap"],
)
def test_mixed_batches_give_the_unmixed_tokens(kwargs):
    want, plain_modes, _ = _run(False, **kwargs)
    got, modes, engine = _run(True, **kwargs)
    assert "MIXED" not in plain_modes and modes.count("MIXED") >= 5
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert [o["meta_info"]["finish_reason"] for o in got] == [o["meta_info"]["finish_reason"] for o in want]
    _assert_pool_whole(engine)


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v2"])
def test_mixed_batches_on_moe_and_mla(arch):
    """The fused MoE, and MLA's absorbed attention, which a mixed batch's decode rows (on a prefix) take."""
    want, _, _ = _run(False, arch=arch)
    got, modes, engine = _run(True, arch=arch)
    assert "MIXED" in modes
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    _assert_pool_whole(engine)


def test_mixed_batches_under_retraction():
    prompts = [[(11 * i + j) % 400 + 3 for j in range(30)] for i in range(8)]
    params = [{"temperature": 0.7, "seed": i, "max_new_tokens": 40, "ignore_eos": True} for i in range(8)]
    want, _, _ = _run(False, prompts, params, max_total_tokens=300)
    got, modes, engine = _run(True, prompts, params, max_total_tokens=300)
    assert "MIXED" in modes and engine.scheduler.num_retracted_reqs > 0
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    _assert_pool_whole(engine)


def test_decode_rows_count_against_the_chunk(monkeypatch):
    """A mixed batch's prompt tokens and decode rows together stay within chunked_prefill_size."""
    sizes = []
    mix = ScheduleBatch.mix_with_running

    def spy(self, running):
        sizes.append((sum(self.extend_lens), len(running.reqs)))
        mix(self, running)

    monkeypatch.setattr(ScheduleBatch, "mix_with_running", spy)
    _run(True)
    assert sizes and all(prompt + decode <= KW["chunked_prefill_size"] for prompt, decode in sizes)
    assert any(prompt + decode == KW["chunked_prefill_size"] for prompt, decode in sizes)


def test_mixed_chunk_golden_trace_matches():
    """A short prompt decodes inside the long one's later chunks (traces/mixed_chunk.jsonl)."""
    fresh, golden = fresh_and_golden("mixed_chunk")
    assert fresh == golden, "mixed-chunk trace changed: review, then python -m minisgl.tools.refresh_traces mixed_chunk"
    modes = [e["forward_mode"] for e in fresh]
    assert modes[:5] == ["EXTEND", "MIXED", "MIXED", "MIXED", "DECODE"]


def test_mixed_batches_return_the_unmixed_logprobs_and_hidden_states():
    """SGLang does not mix when a request wants logprobs; here a decode row's come out as a one-token
    extend's: output and prompt logprobs (top-k, chosen ids) and hidden states as without mixing."""
    # The last two want prompt logprobs: never chunked, they are prefilled whole inside mixed batches.
    side = dict(return_logprob=True, logprob_start_len=[-1] * 4 + [0] * 2, top_logprobs_num=2, token_ids_logprob=[5, 7])
    runs = []
    for mixed in (False, True):
        engine = Engine(
            model_path=tiny_model_dir("llama"), enable_mixed_chunk=mixed, enable_return_hidden_states=True, **KW
        )
        with tracing.record() as events:
            outs = engine.generate(
                input_ids=PROMPTS, sampling_params=PARAMS[:2] * 3, return_hidden_states=[False, True] * 3, **side
            )
        modes = [e["forward_mode"] for e in events if e["event"] == "Scheduler.get_next_batch_to_run"]
        assert ("MIXED" in modes) == mixed
        runs.append(outs)
    unmixed, mixed = runs
    assert [o["output_ids"] for o in mixed] == [o["output_ids"] for o in unmixed]
    for got, want in zip(mixed, unmixed):
        for key in (
            "input_token_logprobs",
            "output_token_logprobs",
            "output_top_logprobs",
            "output_token_ids_logprobs",
        ):
            g, w = _flat(got["meta_info"][key]), _flat(want["meta_info"][key])
            assert [x[1:] for x in g] == [x[1:] for x in w], key  # token ids (and text)
            assert [x[0] is None for x in g] == [x[0] is None for x in w], key
            assert [x[0] or 0.0 for x in g] == pytest.approx([x[0] or 0.0 for x in w], abs=1e-4), key
        if "hidden_states" in want["meta_info"]:
            got_h, want_h = got["meta_info"]["hidden_states"], want["meta_info"]["hidden_states"]
            assert len(got_h) == len(want_h) and torch.tensor(got_h).allclose(torch.tensor(want_h), atol=1e-4)


def _flat(entries: list) -> list[tuple]:
    """(logprob, token id, text) entries, a top-k position's list of them spread out."""
    return [x for e in entries for x in (e if isinstance(e, list) else [e])]


def test_mixed_batches_under_tp2():
    want, _, _ = _run(False, attention_backend="torch_native")
    with Engine(
        model_path=tiny_model_dir("llama"), enable_mixed_chunk=True, tp_size=2, attention_backend="torch_native", **KW
    ) as engine:
        got = engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]


@pytest.mark.parametrize(
    "extra",
    [
        {"chunked_prefill_size": -1},
        {"pp_size": 2},
        {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": tiny_model_dir("llama")},
    ],
    ids=["no-chunked-prefill", "pipeline", "speculative"],
)
def test_what_cannot_mix_is_refused_by_name(extra):
    with pytest.raises(ValueError, match="enable_mixed_chunk needs chunked prefill"):
        ServerArgs(model_path=tiny_model_dir("llama"), enable_mixed_chunk=True, **extra)
