"""Bad input gets a clear error and the engine keeps serving."""

import pytest

from minisgl.entrypoints.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine(model_path=tiny_llama, max_total_tokens=2048, context_length=256)


@pytest.mark.parametrize(
    "params,match",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"bogus": 1}, "bogus"),
        ({"logit_bias": {"999999": 1.0}}, "vocabulary"),
    ],
)
def test_bad_sampling_params(engine, params, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(input_ids=[1, 2, 3], sampling_params=params)
    assert engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def test_empty_prompt(engine):
    out = engine.generate(input_ids=[], sampling_params={"max_new_tokens": 2})
    assert out["meta_info"]["finish_reason"] == {"type": "abort", "message": "the prompt is empty"}
    out = engine.generate("", {"max_new_tokens": 2})
    assert out["meta_info"]["finish_reason"]["type"] == "abort"


def test_prompt_longer_than_context(engine):
    outs = engine.generate(input_ids=[[1] * 300, [1, 2]], sampling_params={"max_new_tokens": 2}, show_progress=False)
    assert outs[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert "context length 256" in outs[0]["meta_info"]["finish_reason"]["message"]
    assert outs[1]["meta_info"]["completion_tokens"] == 2  # its neighbour is unaffected


def test_out_of_vocab_ids(engine):
    out = engine.generate(input_ids=[1, 10**7], sampling_params={"max_new_tokens": 2})
    assert "input ids" in out["meta_info"]["finish_reason"]["message"]


def test_generation_stops_at_context_length(engine):
    out = engine.generate(input_ids=[1] * 250, sampling_params={"max_new_tokens": 100, "ignore_eos": True})
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert out["meta_info"]["completion_tokens"] == 6


def test_missing_model_path(tmp_path):
    with pytest.raises((FileNotFoundError, ValueError), match="not found"):
        Engine(model_path=str(tmp_path / "missing"))


def test_unknown_engine_argument(tiny_llama):
    with pytest.raises(ValueError, match="unknown engine argument"):
        Engine(model_path=tiny_llama, not_a_flag=1)


def test_side_output_not_enabled(engine):
    with pytest.raises(ValueError, match="enable_return_hidden_states"):
        engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2}, return_hidden_states=True)
    with pytest.raises(ValueError, match="enable_return_routed_experts"):
        engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2}, return_routed_experts=True)
