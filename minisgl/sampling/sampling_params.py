"""Per-request sampling parameters, validated where they enter the engine.

Mirrors python/sglang/srt/sampling/sampling_params.py (SamplingParams, verify,
normalize). A request may carry one constraint, ``json_schema``, ``regex`` or ``ebnf``,
which the grammar backend (minisgl/constrained/) turns into a vocab mask. SGLang also has
structural tags and a per-request stream_interval; minisgl refuses those keys
(io_struct.UNSUPPORTED_SAMPLING_PARAMS).

Validation is in two steps, as a request's values arrive from JSON: the constructor
refuses a value of the wrong type (``True`` is not an int, ``"10"`` is not an int,
``1.5`` is not an int), since its normalization compares and converts them; ``verify``
refuses a value out of range, including those the sampler cannot hold (NaN, a seed
outside int64, a token id outside the vocabulary). Every error is a ValueError that
names the field, so the front end can answer 400.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional, Union

_SAMPLING_EPS = 1e-6
# The sampling params that carry a constraint, and the kind each compiles as (SGLang's grammar keys).
GRAMMAR_KINDS = {"json_schema": "json", "regex": "regex", "ebnf": "ebnf"}
# "No top-k limit": larger than any vocabulary (SGLang's TOP_K_ALL).
TOP_K_ALL = 1 << 30
# torch.Generator.manual_seed takes a signed or unsigned 64-bit seed; int64 is what every
# client library sends (the 2^63 seed overflowed it).
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# OpenAI's range for logit_bias values.
_MAX_LOGIT_BIAS = 100.0
_TOKEN_ID_KEY = re.compile(r"-?[0-9]{1,18}")  # a JSON object key naming a token id: ASCII digits only


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad(message: str) -> ValueError:
    return ValueError(f"bad sampling_params: {message}")


def _show(value) -> str:
    """A client's value, quoted in an error message at a bounded length."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _as_float(name: str, value) -> float:
    if not _is_number(value):
        raise _bad(f"{name} must be a number, got {_show(value)}")
    try:
        return float(value)
    except OverflowError:  # an integer beyond float's range
        raise _bad(f"{name} must be a finite number, got {_show(value)}") from None


class SamplingParams:
    def __init__(
        self,
        max_new_tokens: int = 128,
        stop: Optional[Union[str, list[str]]] = None,
        stop_token_ids: Optional[list[int]] = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        ignore_eos: bool = False,
        skip_special_tokens: bool = True,
        logit_bias: Optional[dict[str, float]] = None,
        seed: Optional[int] = None,
        n: int = 1,
        json_schema: Optional[Union[str, dict]] = None,
        regex: Optional[str] = None,
        ebnf: Optional[str] = None,
        # SGLang's further keys (sampling_params.py at 64bca53); checked in _verify_sglang_keys.
        min_new_tokens: int = 0,
        sampling_seed: Optional[int] = None,
        stop_regex: Optional[Union[str, list[str]]] = None,
        no_stop_trim: bool = False,
        spaces_between_special_tokens: bool = True,
        custom_params: Optional[dict[str, Any]] = None,
    ) -> None:
        for name, value in (("max_new_tokens", max_new_tokens), ("top_k", top_k), ("n", n)):
            if not _is_int(value):
                raise _bad(f"{name} must be an integer, got {_show(value)}")
        if seed is not None and not _is_int(seed):
            raise _bad(f"seed must be an integer, got {_show(seed)}")
        for name, value in (("ignore_eos", ignore_eos), ("skip_special_tokens", skip_special_tokens)):
            if not isinstance(value, bool):
                raise _bad(f"{name} must be true or false, got {_show(value)}")
        self.max_new_tokens = max_new_tokens
        self.stop_strs = _stop_strs(stop)
        self.stop_token_ids = _token_id_set(stop_token_ids)
        self.temperature = _as_float("temperature", temperature)
        self.top_p = _as_float("top_p", top_p)
        self.top_k = top_k
        self.min_p = _as_float("min_p", min_p)
        self.frequency_penalty = _as_float("frequency_penalty", frequency_penalty)
        self.presence_penalty = _as_float("presence_penalty", presence_penalty)
        self.repetition_penalty = _as_float("repetition_penalty", repetition_penalty)
        self.ignore_eos = ignore_eos
        self.skip_special_tokens = skip_special_tokens
        self.logit_bias = _logit_bias(logit_bias)
        self.seed = seed
        self.n = n
        # SGLang takes the schema as a JSON string; a dict (the offline Engine's convenience) becomes one.
        self.json_schema = json.dumps(json_schema) if isinstance(json_schema, dict) else json_schema
        self.regex = regex
        self.ebnf = ebnf
        self.min_new_tokens = min_new_tokens
        self.stop_regex_strs = [stop_regex] if isinstance(stop_regex, str) else list(stop_regex or [])
        self.no_stop_trim = no_stop_trim
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.custom_params = custom_params
        self._verify_sglang_keys(sampling_seed)
        if 0.0 <= self.temperature < _SAMPLING_EPS:
            # Greedy is temperature 0; SGLang expresses it as top_k = 1 with a neutral temperature.
            self.temperature = 1.0
            self.top_k = 1
        if self.top_k == -1 or self.top_k == 0:
            self.top_k = TOP_K_ALL  # "no limit" (0 too, as vLLM and the OpenAI-style clients send it)

    @property
    def is_greedy(self) -> bool:
        return self.top_k == 1

    @property
    def grammar_key(self) -> Optional[tuple[str, str]]:
        """("json" | "regex" | "ebnf", spec) for a constrained request, the grammar cache's key; else None."""
        for name, kind in GRAMMAR_KINDS.items():
            if getattr(self, name) is not None:
                return kind, getattr(self, name)
        return None

    def verify(self, vocab_size: int) -> None:
        """Raise ValueError naming the field for any value out of range.

        SGLang's ranges, plus finiteness (NaN passes every comparison SGLang makes) and the
        bounds the sampler's tensors need. repetition_penalty is SGLang's [0, 2] without 0,
        which divides by zero: below _SAMPLING_EPS a logit divided by it overflows float32."""
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:  # NaN fails every comparison, so it is refused here
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != TOP_K_ALL and not 1 <= self.top_k <= vocab_size:
            raise ValueError(f"top_k must be -1 (disable) or in [1, {vocab_size}], got {self.top_k:.3g}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not _SAMPLING_EPS <= self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in [{_SAMPLING_EPS}, 2], got {self.repetition_penalty}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {_show(self.max_new_tokens)}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {_show(self.n)}")
        if self.seed is not None and not _INT64_MIN <= self.seed <= _INT64_MAX:
            raise ValueError(f"seed must fit in a signed 64-bit integer, got {_show(self.seed)}")
        for token_id, bias in self.logit_bias.items():
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"logit_bias: token id {token_id} is outside the vocabulary [0, {vocab_size})")
            if not -_MAX_LOGIT_BIAS <= bias <= _MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias[{token_id}] must be in [-100, 100], got {bias}")
        for token_id in self.stop_token_ids:
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"stop_token_ids: token id {token_id} is outside the vocabulary [0, {vocab_size})")
        self._verify_grammar()

    def _verify_grammar(self) -> None:
        given = [name for name in GRAMMAR_KINDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"at most one of json_schema, regex and ebnf may be set, got {' and '.join(given)}")
        if not given:
            return
        if not isinstance(getattr(self, given[0]), str):
            raise ValueError(f"{given[0]} must be a string, got {type(getattr(self, given[0])).__name__}")
        try:
            # Imported here: xgrammar takes seconds to import, and unconstrained requests never need it.
            from minisgl.constrained.xgrammar_backend import check_grammar
        except ImportError:
            raise ValueError(f"{given[0]} needs the xgrammar package, which is not installed") from None
        check_grammar(*self.grammar_key)

    def _verify_sglang_keys(self, sampling_seed) -> None:
        """Types of the keys minisgl took over from SGLang; sampling_seed is SGLang's name for
        seed (the OpenAI name, which minisgl's /generate also accepts)."""
        if sampling_seed is not None:
            if self.seed is not None:
                raise ValueError("give seed or sampling_seed, not both")
            self.seed = sampling_seed
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"sampling_seed must be an integer, got {self.seed!r}")
        if isinstance(self.min_new_tokens, bool) or not isinstance(self.min_new_tokens, int):
            raise ValueError(f"min_new_tokens must be an integer, got {self.min_new_tokens!r}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        for name in ("no_stop_trim", "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        if self.custom_params is not None and not isinstance(self.custom_params, dict):
            raise ValueError(f"custom_params must be an object, got {self.custom_params!r}")
        for pattern in self.stop_regex_strs:
            if not isinstance(pattern, str) or not pattern:
                raise ValueError("stop_regex must be a non-empty string or a list of them")
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"stop_regex {pattern!r} is not a valid regular expression: {e}") from None

    @classmethod
    def from_dict(cls, params: Optional[dict]) -> "SamplingParams":
        params = dict(params or {})
        try:
            return cls(**params)
        except TypeError as e:
            raise ValueError(f"bad sampling_params: {e}") from None


def _stop_strs(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        return []
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise _bad(f"stop must be a non-empty string or a list of them, got {_show(stop)}")
    for s in stops:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"): no token sequence can ever match it
            raise _bad(f"stop must be valid UTF-8, got {_show(s)}") from None
    return list(stops)


def _token_id_set(ids) -> set[int]:
    if ids is None:
        return set()
    if not isinstance(ids, (list, tuple, set)) or not all(_is_int(t) for t in ids):
        raise _bad(f"stop_token_ids must be a list of integers, got {_show(ids)}")
    return set(ids)


def _logit_bias(logit_bias) -> dict[int, float]:
    """JSON object keys are strings: accept "123" (and 123 from Python), nothing else."""
    if logit_bias is None:
        return {}
    if not isinstance(logit_bias, dict):
        raise _bad(f"logit_bias must be an object mapping token ids to numbers, got {_show(logit_bias)}")
    out = {}
    for key, bias in logit_bias.items():
        if not (_is_int(key) or (isinstance(key, str) and _TOKEN_ID_KEY.fullmatch(key))):
            raise _bad(f"logit_bias keys must be token ids, got {_show(key)}")
        bias = _as_float(f"logit_bias[{_show(key)}]", bias)
        if not math.isfinite(bias):
            raise _bad(f"logit_bias[{_show(key)}] must be a finite number, got {_show(bias)}")
        out[int(key)] = bias
    return out
