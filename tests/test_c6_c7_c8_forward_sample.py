"""C6: forward() bumps forward_pass_id, opens the recorder's pass, dispatches on ForwardMode,
and attn_backend.init_forward_metadata runs before model.forward.
C7: sample() runs _preprocess_logits, then the Sampler; with a grammar, the vocab mask is built and
applied inside _preprocess_logits (traces/sampling_vocab_mask.jsonl).
C8: forward_batch_generation is ForwardBatch.init_new -> forward -> sample; a verify forward stops before sampling.
Checked against traces/model_runner_forward_sample.jsonl."""

import pytest
import torch

from minisgl import tracing
from tests._traces import children, fresh_and_golden, top_level_spans


@pytest.mark.parametrize("name", ["model_runner_forward_sample", "sampling_vocab_mask"])
def test_golden_trace_matches(name):
    fresh, golden = fresh_and_golden(name)
    assert fresh == golden, f"{name} trace changed: review, then python -m minisgl.tools.refresh_traces {name}"


def test_c6_forward_dispatch():
    fresh, _ = fresh_and_golden("model_runner_forward_sample")
    forwards = children(fresh, "ModelRunner.forward")
    assert len(forwards) == 2  # one prefill, then one decode (max_new_tokens=2)
    branches = []
    for inside in forwards:
        names = [e["event"] for e in inside]
        assert names[0] == "ExpertDistributionRecorder.with_forward_pass"
        branches.append(next(e["branch"] for e in inside if e["event"] == "ModelRunner.forward.dispatch"))
        assert top_level_spans(inside) == ["attn_backend.init_forward_metadata", "model.forward"]
    assert branches == ["extend", "decode"]


def test_c6_forward_pass_id_and_output(tiny_llama):
    from minisgl.entrypoints.engine import Engine
    from minisgl.model_executor.model_runner import ModelRunnerOutput

    engine = Engine(model_path=tiny_llama, max_total_tokens=128)
    runner = engine.scheduler.tp_worker.model_runner
    outputs = []
    original = runner.forward
    runner.forward = lambda fb, **kw: outputs.append(original(fb, **kw)) or outputs[-1]
    engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert runner.forward_pass_id == 3
    assert all(isinstance(o, ModelRunnerOutput) for o in outputs)
    # One row of logits per request and step: the prefill keeps only the last position.
    assert [o.logits_output.next_token_logits.shape[0] for o in outputs] == [1, 1, 1]


def test_c7_sample_order():
    fresh, _ = fresh_and_golden("model_runner_forward_sample")
    for inside in children(fresh, "ModelRunner.sample"):
        assert top_level_spans(inside) == ["ModelRunner._preprocess_logits", "Sampler.forward"]


def test_c7_preprocess_applies_logit_bias(tiny_llama):
    from minisgl.entrypoints.engine import Engine

    engine = Engine(model_path=tiny_llama, max_total_tokens=128)
    # A huge bias on one token makes it the greedy choice at every step.
    out = engine.generate(
        input_ids=[1, 2, 3],
        sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "logit_bias": {"7": 100.0}},
    )
    assert out["output_ids"] == [7, 7, 7, 7]


def test_c8_forward_batch_generation_order():
    fresh, _ = fresh_and_golden("model_runner_forward_sample")
    for inside in children(fresh, "TpModelWorker.forward_batch_generation"):
        assert top_level_spans(inside) == ["ForwardBatch.init_new", "ModelRunner.forward", "ModelRunner.sample"]


def test_c8_verify_returns_unsampled(tiny_llama):
    from minisgl.entrypoints.engine import Engine
    from minisgl.managers.io_struct import TokenizedGenerateReqInput
    from minisgl.sampling.sampling_params import SamplingParams

    engine = Engine(model_path=tiny_llama, max_total_tokens=128)
    scheduler = engine.scheduler
    scheduler.handle_generate_request(
        TokenizedGenerateReqInput(
            rid="v", input_text=None, input_ids=[4, 5, 6], sampling_params=SamplingParams(temperature=0)
        )
    )
    batch = scheduler.get_next_batch_to_run()
    with tracing.record() as events:
        result = scheduler.tp_worker.forward_batch_generation(batch.get_model_worker_batch(), is_verify=True)
    assert result.next_token_ids is None and result.logits_output.next_token_logits.shape[0] == 1
    assert "ModelRunner.sample" not in [e["event"] for e in events]
    assert torch.isfinite(result.logits_output.next_token_logits).all()


def test_c7_mask_is_built_and_applied_in_preprocess_logits_before_the_sampler():
    fresh, _ = fresh_and_golden("sampling_vocab_mask")
    samples = children(fresh, "ModelRunner.sample")
    assert len(samples) == 2  # the prefill, then one decode (max_new_tokens=2)
    for inside in samples:
        assert top_level_spans(inside) == ["ModelRunner._preprocess_logits", "Sampler.forward"]
        (pre,) = children(inside, "ModelRunner._preprocess_logits")
        assert top_level_spans(pre) == ["SamplingBatchInfo.update_regex_vocab_mask", "XGrammarGrammar.apply_vocab_mask"]
        # One constrained request and one free one share the batch, and one mask.
        assert pre[0]["batch_size"] == 2 and pre[0]["num_grammars"] == 1
    # The request waited in the grammar queue and was admitted before the first batch ran.
    assert fresh[0]["event"] == "GrammarManager.get_ready_grammar_requests" and fresh[0]["num_ready"] == 1
