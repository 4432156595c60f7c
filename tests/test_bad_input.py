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
    assert (
        engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})["meta_info"]["completion_tokens"]
        == 2
    )


def test_empty_prompt(engine):
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.generate(input_ids=[], sampling_params={"max_new_tokens": 2})
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.generate("", {"max_new_tokens": 2})


def test_prompt_longer_than_context(engine):
    # One bad prompt refuses the whole batch, before anything runs (as the server's 400 does).
    with pytest.raises(ValueError, match="context length"):
        engine.generate(input_ids=[[1] * 300, [1, 2]], sampling_params={"max_new_tokens": 2})
    assert (
        engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    )


def test_out_of_vocab_ids(engine):
    with pytest.raises(ValueError, match="input_ids must be token ids"):
        engine.generate(input_ids=[1, 10**7], sampling_params={"max_new_tokens": 2})


def test_generation_stops_at_context_length(engine):
    # max_new_tokens None means "up to the context length" (SGLang's rule); an explicit
    # count that does not fit is refused.
    out = engine.generate(input_ids=[1] * 250, sampling_params={"max_new_tokens": None, "ignore_eos": True})
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert out["meta_info"]["completion_tokens"] == 6
    with pytest.raises(ValueError, match="maximum context length"):
        engine.generate(input_ids=[1] * 250, sampling_params={"max_new_tokens": 100})


def test_missing_model_path(tmp_path):
    with pytest.raises((FileNotFoundError, ValueError), match="not found"):
        Engine(model_path=str(tmp_path / "missing"))


def test_unknown_engine_argument(tiny_llama):
    with pytest.raises(ValueError, match="unknown engine argument"):
        Engine(model_path=tiny_llama, not_a_flag=1)


def test_side_output_not_enabled(engine):
    with pytest.raises(ValueError, match="enable-return-hidden-states"):
        engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2}, return_hidden_states=True)
    with pytest.raises(ValueError, match="enable-return-routed-experts"):
        engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2}, return_routed_experts=True)
