"""Per-request sampling parameters, validated where they enter the engine.

Mirrors python/sglang/srt/sampling/sampling_params.py (SamplingParams, verify,
normalize). A request may carry one constraint, ``json_schema``, ``regex`` or ``ebnf``,
which the grammar backend (minisgl/constrained/) turns into a vocab mask. SGLang also has
structural tags and custom logit processors; omitted.
"""

from __future__ import annotations

import json
from typing import Optional, Union

_SAMPLING_EPS = 1e-6
# The sampling params that carry a constraint, and the kind each compiles as (SGLang's grammar keys).
GRAMMAR_KINDS = {"json_schema": "json", "regex": "regex", "ebnf": "ebnf"}


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
        # SGLang takes the schema as a JSON string; a dict (the offline Engine's convenience) becomes one.
        self.json_schema = json.dumps(json_schema) if isinstance(json_schema, dict) else json_schema
        self.regex = regex
        self.ebnf = ebnf
        if 0.0 <= self.temperature < _SAMPLING_EPS:
            # Greedy is temperature 0; SGLang expresses it as top_k = 1 with a neutral temperature.
            self.temperature = 1.0
            self.top_k = 1
        if self.top_k == -1 or self.top_k == 0:
            self.top_k = 1 << 30  # "no limit"

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

    @classmethod
    def from_dict(cls, params: Optional[dict]) -> "SamplingParams":
        params = dict(params or {})
        try:
            return cls(**params)
        except TypeError as e:
            raise ValueError(f"bad sampling_params: {e}") from None
