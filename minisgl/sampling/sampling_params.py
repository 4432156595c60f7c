"""Per-request sampling parameters, validated where they enter the engine.

Mirrors python/sglang/srt/sampling/sampling_params.py (SamplingParams, verify,
normalize). SGLang also has regex/JSON/EBNF constraints and a per-request
stream_interval; minisgl refuses those keys (io_struct.UNSUPPORTED_SAMPLING_PARAMS).
"""

from __future__ import annotations

import re
from typing import Any, Optional, Union

_SAMPLING_EPS = 1e-6


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
        # SGLang's further keys (sampling_params.py at 64bca53); checked in _verify_sglang_keys.
        min_new_tokens: int = 0,
        sampling_seed: Optional[int] = None,
        stop_regex: Optional[Union[str, list[str]]] = None,
        no_stop_trim: bool = False,
        spaces_between_special_tokens: bool = True,
        custom_params: Optional[dict[str, Any]] = None,
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.stop_strs = [stop] if isinstance(stop, str) else list(stop or [])
        self.stop_token_ids = set(stop_token_ids or [])
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.frequency_penalty = frequency_penalty
        self.presence_penalty = presence_penalty
        self.repetition_penalty = repetition_penalty
        self.ignore_eos = ignore_eos
        self.skip_special_tokens = skip_special_tokens
        self.logit_bias = {int(k): float(v) for k, v in (logit_bias or {}).items()}
        self.seed = seed
        self.n = n
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
            self.top_k = 1 << 30  # "no limit"

    @property
    def is_greedy(self) -> bool:
        return self.top_k == 1

    def verify(self, vocab_size: int) -> None:
        """Raise ValueError with a readable message for any out-of-range field."""
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be -1 (disable) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.max_new_tokens is None or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        for token_id in list(self.logit_bias) + list(self.stop_token_ids):
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"token id {token_id} is outside the vocabulary [0, {vocab_size})")

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
