"""Sampling parameters as a hostile client sends them: every bad value is refused with a
ValueError that names the field, and every value that is accepted samples without error or NaN.

The named cases are the issue's (each once killed the scheduler or was wrongly accepted);
hypothesis then draws dictionaries over every field, mixing valid values, edge values and
wrong types, and runs what verify accepts through the real SamplingBatchInfo and Sampler.
"""

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.layers.sampler import Sampler
from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.managers.schedule_batch import Req
from minisgl.sampling.sampling_batch_info import SamplingBatchInfo
from minisgl.sampling.sampling_params import SamplingParams

VOCAB = 50
NAN, INF = float("nan"), float("inf")

BAD = [
    ({"temperature": NAN}, "temperature"),
    ({"temperature": INF}, "temperature"),
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"temperature": 10**400}, "temperature"),
    ({"top_p": NAN}, "top_p"),
    ({"top_p": 0.0}, "top_p"),
    ({"min_p": NAN}, "min_p"),
    ({"min_p": INF}, "min_p"),
    ({"frequency_penalty": NAN}, "frequency_penalty"),
    ({"presence_penalty": -INF}, "presence_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": NAN}, "repetition_penalty"),
    ({"seed": 2**63}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"top_k": 2**63}, "top_k"),
    ({"top_k": VOCAB + 1}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"logit_bias": {"1": 1e39}}, "logit_bias"),
    ({"logit_bias": {"1": INF}}, "logit_bias"),
    ({"logit_bias": {"1": NAN}}, "logit_bias"),
    ({"logit_bias": {"1": 100.5}}, "logit_bias"),
    ({"logit_bias": {"1": True}}, "logit_bias"),
    ({"logit_bias": {str(VOCAB): 1}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ({"logit_bias": {"one": 1}}, "logit_bias"),
    ({"logit_bias": {"1.0": 1}}, "logit_bias"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"max_new_tokens": "10"}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": None}, "max_new_tokens"),
    ({"stop": ["\ud800"]}, "stop"),
    ({"stop": "ok\udfff"}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": [True]}, "stop_token_ids"),
    ({"stop_token_ids": 3}, "stop_token_ids"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"skip_special_tokens": "no"}, "skip_special_tokens"),
    ({"n": 0}, "n"),
    ({"n": 2.0}, "n"),
    ({"bogus": 1}, "bogus"),
]


@pytest.mark.parametrize("params, field", BAD, ids=[f"{f}={next(iter(p.values()))!r}"[:40] for p, f in BAD])
def test_a_bad_value_is_refused_by_name(params, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        SamplingParams.from_dict(params).verify(VOCAB)


def test_edge_values_inside_the_ranges_are_accepted():
    for params in (
        {"temperature": 0},
        {"top_k": -1},
        {"top_k": 0},
        {"top_k": VOCAB},
        {"seed": 2**63 - 1},
        {"seed": -(2**63)},
        {"logit_bias": {"0": -100, str(VOCAB - 1): 100}},
        {"repetition_penalty": 2},
        {"max_new_tokens": 0},
        {"stop": "é"},
    ):
        SamplingParams.from_dict(params).verify(VOCAB)


def sample_once(params: list[SamplingParams]) -> None:
    """One sampling step of a tiny batch, as the scheduler and the model runner do it."""
    reqs = []
    for i, p in enumerate(params):
        generator = None
        if not p.is_greedy:
            generator = torch.Generator().manual_seed(p.seed if p.seed is not None else i)
        recv = TokenizedGenerateReqInput(rid=f"r{i}", input_text=None, input_ids=[1, 2, 3], sampling_params=p)
        req = Req(recv, eos_token_ids={0}, max_req_len=64, generator=generator)
        req.output_ids = [4, 5, 4]
        reqs.append(req)
    info = SamplingBatchInfo.from_reqs(reqs, VOCAB, "cpu")
    logits = torch.randn(len(reqs), VOCAB, generator=torch.Generator().manual_seed(0)) * 8
    info.apply_logits_bias(logits)
    out = LogitsProcessorOutput(next_token_logits=logits)
    ids = Sampler()(out, info, True, [3] * len(reqs), [[0, 1]] * len(reqs))
    assert ((ids >= 0) & (ids < VOCAB)).all(), ids
    assert not torch.isnan(out.next_token_logprobs).any(), out.next_token_logprobs
    assert all(not math.isnan(v) for row in out.next_token_top_logprobs_val for v in row)


def _floats(lo: float, hi: float):
    # Mostly in range, sometimes at or past an edge, sometimes not a float at all.
    return st.one_of(
        st.floats(lo, hi),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([lo, hi, 0, 1, -1, 1e-300, 1e39]),
        st.integers(-(2**70), 2**70),
        st.booleans(),
        st.text(max_size=3),
        st.none(),
    )


def _ints(lo: int, hi: int):
    return st.one_of(
        st.integers(lo, hi),
        st.integers(-(2**70), 2**70),
        st.sampled_from([-1, 0, 1, hi + 1, 2**63, -(2**63)]),
        st.floats(allow_nan=True),
        st.booleans(),
        st.text(alphabet="0123456789", max_size=3),
        st.none(),
    )


TOKEN_KEY = st.one_of(st.integers(-5, VOCAB + 5).map(str), st.integers(0, VOCAB - 1), st.text(max_size=3))
PARAM_FIELDS = {
    "max_new_tokens": _ints(0, 64),
    "temperature": _floats(0, 2),
    "top_p": _floats(0, 1),
    "top_k": _ints(-1, VOCAB),
    "min_p": _floats(0, 1),
    "frequency_penalty": _floats(-2, 2),
    "presence_penalty": _floats(-2, 2),
    "repetition_penalty": _floats(0, 2),
    "seed": _ints(-(2**63), 2**63 - 1),
    "logit_bias": st.one_of(st.dictionaries(TOKEN_KEY, _floats(-100, 100), max_size=3), st.lists(st.integers())),
    "stop": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=2), st.integers()),
    "stop_token_ids": st.one_of(st.lists(_ints(0, VOCAB - 1), max_size=3), st.integers()),
    "ignore_eos": st.one_of(st.booleans(), st.integers(0, 1)),
    "skip_special_tokens": st.one_of(st.booleans(), st.none()),
    "n": _ints(1, 4),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({}, optional=PARAM_FIELDS), min_size=1, max_size=3))
def test_any_params_are_refused_or_sample_cleanly(dicts):
    accepted = []
    for d in dicts:
        try:
            params = SamplingParams.from_dict(d)
            params.verify(VOCAB)
        except ValueError as e:
            assert str(e), d
            continue
        accepted.append(params)
    if accepted:
        sample_once(accepted)
