"""SpeculativeAlgorithm: which speculative decoding the engine runs, and the worker that runs it.

Mirrors python/sglang/srt/speculative/spec_info.py (SpeculativeAlgorithm with
from_string, is_none, create_worker). SGLang also has EAGLE,
EAGLE3 and NGRAM, overlap-scheduled "v2" workers and tree drafts (topk > 1);
minisgl keeps STANDALONE, a separate small draft model drafting a chain.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from minisgl.speculative.standalone_worker import StandaloneWorker


class SpeculativeAlgorithm(Enum):
    NONE = auto()
    STANDALONE = auto()

    @classmethod
    def from_string(cls, name: Optional[str]) -> "SpeculativeAlgorithm":
        if name is None:
            return cls.NONE
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown speculative algorithm {name!r}") from None

    def is_none(self) -> bool:
        return self == SpeculativeAlgorithm.NONE

    def create_worker(self) -> type["StandaloneWorker"]:
        assert not self.is_none(), "no worker for SpeculativeAlgorithm.NONE"
        from minisgl.speculative.standalone_worker import StandaloneWorker

        return StandaloneWorker
