"""C9: side outputs converge in the execution shell, and they are right.

Logprobs (output, prompt, top-k, chosen ids) equal log_softmax of HF's logits; hidden
states equal HF's final hidden states (the LM head's input); routed experts equal the
top-k of HF's router logits at every position and layer; the recorder's `stat` counts
equal the histogram of those routed experts. All with requests batched together, and
with the side outputs off the trace shows no capture and no device-to-host copy.
Checked against traces/side_outputs.jsonl."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.entrypoints.engine import Engine
from tests._models import tiny_model_dir
from tests._traces import children, fresh_and_golden

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
TOL = dict(atol=1e-4, rtol=1e-4)


def _hf(arch):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), dtype=torch.float32).eval()


@torch.no_grad()
def _hf_full(model, ids, **kwargs):
    return model(torch.tensor([ids]), output_hidden_states=True, **kwargs)


@pytest.fixture(scope="module")
def llama_engine():
    return Engine(model_path=tiny_model_dir("llama"), max_total_tokens=512, enable_return_hidden_states=True)


@pytest.fixture(scope="module")
def moe_engine():
    return Engine(
        model_path=tiny_model_dir("qwen3_moe"),
        max_total_tokens=512,
        enable_return_routed_experts=True,
        expert_distribution_recorder_mode="stat",
    )


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_output_logprobs_match_hf(llama_engine, temperature):
    params = {"temperature": temperature, "max_new_tokens": 5, "ignore_eos": True, "seed": 3}
    outs = llama_engine.generate(
        input_ids=PROMPTS, sampling_params=params, return_logprob=True, top_logprobs_num=3,
        token_ids_logprob=[[4, 9]] * len(PROMPTS),
    )  # fmt: skip
    hf = _hf("llama")
    for ids, out in zip(PROMPTS, outs):
        full = ids + out["output_ids"]
        logits = _hf_full(hf, full).logits[0]
        # Position p predicts token p + 1; sampled under temperature, so scale first.
        expected = torch.log_softmax(logits / (temperature or 1.0), dim=-1)[len(ids) - 1 : len(full) - 1]
        meta = out["meta_info"]
        got = torch.tensor([lp for lp, _, _ in meta["output_token_logprobs"]])
        want = expected[torch.arange(len(out["output_ids"])), torch.tensor(out["output_ids"])]
        torch.testing.assert_close(got, want, **TOL)
        assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
        for step, top in enumerate(meta["output_top_logprobs"]):
            vals, idx = expected[step].topk(3)
            assert [t for _, t, _ in top] == idx.tolist()
            torch.testing.assert_close(torch.tensor([lp for lp, _, _ in top]), vals, **TOL)
        for step, chosen in enumerate(meta["output_token_ids_logprobs"]):
            assert [t for _, t, _ in chosen] == [4, 9]
            torch.testing.assert_close(torch.tensor([lp for lp, _, _ in chosen]), expected[step, [4, 9]], **TOL)


def test_prompt_logprobs_match_hf(llama_engine):
    outs = llama_engine.generate(
        input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 1},
        return_logprob=True, logprob_start_len=0, top_logprobs_num=2,
    )  # fmt: skip
    hf = _hf("llama")
    for ids, out in zip(PROMPTS, outs):
        expected = torch.log_softmax(_hf_full(hf, ids).logits[0], dim=-1)
        entries = out["meta_info"]["input_token_logprobs"]
        assert [t for _, t, _ in entries] == ids
        assert entries[0][0] is None  # nothing predicts the first token
        got = torch.tensor([lp for lp, _, _ in entries[1:]])
        torch.testing.assert_close(got, expected[torch.arange(len(ids) - 1), torch.tensor(ids[1:])], **TOL)
        tops = out["meta_info"]["input_top_logprobs"]
        assert tops[0] is None and [t for _, t, _ in tops[1]] == expected[0].topk(2).indices.tolist()


def test_hidden_states_match_hf(llama_engine):
    outs = llama_engine.generate(
        input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 4, "ignore_eos": True},
        return_hidden_states=True,
    )  # fmt: skip
    hf = _hf("llama")
    for ids, out in zip(PROMPTS, outs):
        full = ids + out["output_ids"]
        # HF's last hidden state is after the final norm: the LM head's input, SGLang's definition.
        expected = _hf_full(hf, full).hidden_states[-1][0, : len(full) - 1]
        got = torch.tensor(out["meta_info"]["hidden_states"])
        assert got.shape == expected.shape  # every position that ran: prompt + all but the last output
        torch.testing.assert_close(got, expected, **TOL)


def test_routed_experts_and_recorder_match_hf(moe_engine):
    moe_engine.start_expert_distribution_record()
    outs = moe_engine.generate(
        input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 4, "ignore_eos": True},
        return_routed_experts=True,
    )  # fmt: skip
    moe_engine.stop_expert_distribution_record()
    dump = moe_engine.dump_expert_distribution_record()
    hf = _hf("qwen3_moe")
    histogram = torch.zeros(2, 8, dtype=torch.int64)
    for ids, out in zip(PROMPTS, outs):
        full = ids + out["output_ids"]
        router_logits = _hf_full(hf, full, output_router_logits=True).router_logits  # per layer [T, E]
        got = out["meta_info"]["routed_experts"]  # [tokens, layers, top_k]
        assert got.shape == (len(full) - 1, 2, 2)
        for layer, logits in enumerate(router_logits):
            want = logits[: len(full) - 1].topk(2, dim=-1).indices
            assert torch.equal(got[:, layer].long().sort(dim=-1).values, want.sort(dim=-1).values), f"layer {layer}"
            histogram[layer] += torch.bincount(got[:, layer].flatten().long(), minlength=8)
    assert torch.equal(dump["stat"], histogram)


def test_golden_trace_matches():
    fresh, golden = fresh_and_golden("side_outputs")
    assert fresh == golden, "side-output trace changed: review, then python -m minisgl.tools.refresh_traces"


def test_c9_paths_converge_in_the_shell():
    fresh, _ = fresh_and_golden("side_outputs")
    for inside in children(fresh, "ModelRunner.forward"):
        names = [e["event"] for e in inside]
        # The recorder opens the pass, select_experts reports per layer, the capturer copies at the end.
        assert names[0] == "ExpertDistributionRecorder.with_forward_pass"
        assert [e["layer"] for e in inside if e["event"] == "ExpertDistributionRecorder.on_select_experts"] == [0, 1]
        assert "LogitsProcessor.capture_hidden_states" in names
        assert names[-1] == "RoutedExpertsCapturer.on_forward_end"
    assert fresh[-1]["event"] == "RoutedExpertsCapturer.get_routed_experts"


def test_off_means_no_capture_and_no_copy():
    fresh, _ = fresh_and_golden("model_runner_forward_sample")
    names = {e["event"] for e in fresh}
    assert not names & {
        "LogitsProcessor.capture_hidden_states",
        "RoutedExpertsCapturer.on_forward_end",
        "RoutedExpertsCapturer.capture",
    }


@pytest.mark.parametrize("mode", ["per_pass", "per_token"])
def test_recorder_modes_agree_with_stat(mode, tmp_path):
    from minisgl.eplb.expert_distribution import expert_load

    path = tiny_model_dir("qwen3_moe")
    loads = {}
    for m in ("stat", mode):
        engine = Engine(model_path=path, max_total_tokens=512, expert_distribution_recorder_mode=m)
        engine.start_expert_distribution_record()
        engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 3, "ignore_eos": True})
        engine.stop_expert_distribution_record()
        dump = engine.dump_expert_distribution_record(str(tmp_path / f"{m}.pt"))
        assert torch.load(tmp_path / f"{m}.pt")["mode"] == m  # the documented file format
        loads[m] = expert_load(dump)
    assert torch.equal(loads["stat"], loads[mode])
    if mode == "per_pass":
        assert len(dump["per_pass"]) == 3  # one prefill, two decodes
    else:
        assert dump["per_token"][0]["topk_ids"].shape == (2, sum(map(len, PROMPTS)), 2)  # [layers, tokens, top_k]


def test_recorder_off_refuses_clearly():
    # The recorder is process-global, as in SGLang: the newest engine's setting is the one in force.
    engine = Engine(model_path=tiny_model_dir("qwen3_moe"), max_total_tokens=128)
    with pytest.raises(RuntimeError, match="expert_distribution_recorder_mode"):
        engine.start_expert_distribution_record()
