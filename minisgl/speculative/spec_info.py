"""SpeculativeAlgorithm: which speculative decoding the engine runs, and the worker that runs it.

Mirrors python/sglang/srt/speculative/spec_info.py (SpeculativeAlgorithm with
from_string, is_none, create_worker). SGLang also has EAGLE,
EAGLE3 and NGRAM, overlap-scheduled "v2" workers and tree drafts (topk > 1);
minisgl keeps STANDALONE, a separate small draft model drafting a chain. A request that
worker cannot serve exactly is refused here (check_request, called by the front door), so
that the refusals live with the speculation they protect; the flags' own rules stay in
ServerArgs, which must not import this package.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from minisgl.managers.io_struct import TokenizedGenerateReqInput
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


def check_request(req: "TokenizedGenerateReqInput") -> None:
    """Refuse, at the front door, a request the draft-verify round would not serve exactly."""
    params = req.sampling_params
    if req.return_logprob or req.return_hidden_states:
        raise ValueError("speculative decoding does not return logprobs or hidden states")
    if params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0:
        # A drafted position's penalties would depend on the drafts before it.
        raise ValueError("speculative decoding does not apply frequency, presence or repetition penalties")
    if params.grammar_key is not None:
        raise ValueError("speculative decoding does not support json_schema, regex or ebnf constraints")
