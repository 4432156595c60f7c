"""CustomLogitProcessor: a client-defined edit of the logits, sent over the wire as a serialized class.

Mirrors python/sglang/srt/sampling/custom_logit_processor.py (CustomLogitProcessor,
to_str, from_str, DisallowedTokensLogitsProcessor). A client subclasses
CustomLogitProcessor, sends ``cls.to_str()`` as ``custom_logit_processor`` and its
per-request arguments as ``sampling_params["custom_params"]``. Deserializing the class
(dill) runs whatever code the client put in it, so the server refuses both fields
unless it was started with --enable-custom-logit-processor. Omitted: SGLang's
thinking-budget processors, and the ``__req__`` entry SGLang adds to custom_params.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Optional

import torch


@functools.lru_cache(maxsize=None)
def _class_from_str(json_str: str):
    import dill

    try:
        return dill.loads(bytes.fromhex(json.loads(json_str)["callable"]))
    except Exception as e:  # whatever the client sent, it is not a processor we can load
        raise ValueError(f"custom_logit_processor could not be deserialized: {e!r}") from None


class CustomLogitProcessor:
    """Subclass and define ``__call__(logits, custom_param_list) -> logits`` (rows of one processor)."""

    def __call__(self, logits: torch.Tensor, custom_param_list: Optional[list[dict[str, Any]]] = None) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def to_str(cls) -> str:
        import dill

        return json.dumps({"callable": dill.dumps(cls).hex()})

    @classmethod
    def from_str(cls, json_str: str) -> "CustomLogitProcessor":
        processor_cls = _class_from_str(json_str)
        if not callable(processor_cls):
            raise ValueError("custom_logit_processor must be a serialized CustomLogitProcessor class")
        return processor_cls()


class DisallowedTokensLogitsProcessor(CustomLogitProcessor):
    """SGLang's example: custom_params ``{"token_ids": [...]}`` are never sampled."""

    def __call__(self, logits: torch.Tensor, custom_param_list: Optional[list[dict[str, Any]]] = None) -> torch.Tensor:
        for row, params in enumerate(custom_param_list or []):
            logits[row, (params or {}).get("token_ids", [])] = -float("inf")
        return logits
