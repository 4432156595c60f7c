"""SpeculativeAlgorithm: which speculative decoding the engine runs, and the worker that runs it.

Mirrors python/sglang/srt/speculative/spec_info.py (SpeculativeAlgorithm with
from_string, is_none, is_eagle, is_eagle3, create_worker). minisgl has STANDALONE, a
separate small draft model drafting a chain (standalone_worker.py), and EAGLE / EAGLE3, a
draft head on the target's hidden states drafting a chain or a tree (eagle_worker.py; with
enable_multi_layer_eagle, one runner per draft step: multi_layer_eagle_worker.py). SGLang
also has NGRAM and overlap-scheduled "v2" workers; omitted. A request that
worker cannot serve exactly is refused here (check_request, called by the front door), so
that the refusals live with the speculation they protect; the flags' own rules stay in
ServerArgs, which must not import this package.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from minisgl.managers.io_struct import TokenizedGenerateReqInput
    from minisgl.managers.tp_worker import TpModelWorker
    from minisgl.server_args import ServerArgs


class SpeculativeAlgorithm(Enum):
    NONE = auto()
    STANDALONE = auto()
    EAGLE = auto()
    EAGLE3 = auto()

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

    def is_eagle(self) -> bool:
        """EAGLE or EAGLE3: the draft is a head on the target's hidden states (SGLang's is_eagle)."""
        return self in (SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.EAGLE3)

    def is_eagle3(self) -> bool:
        return self == SpeculativeAlgorithm.EAGLE3

    def create_worker(self, server_args: "ServerArgs") -> type["TpModelWorker"]:
        assert not self.is_none(), "no worker for SpeculativeAlgorithm.NONE"
        if self.is_eagle() and server_args.enable_multi_layer_eagle:
            from minisgl.speculative.multi_layer_eagle_worker import MultiLayerEagleWorker

            return MultiLayerEagleWorker
        if self.is_eagle():
            from minisgl.speculative.eagle_worker import EAGLEWorker

            return EAGLEWorker
        from minisgl.speculative.standalone_worker import StandaloneWorker

        return StandaloneWorker


def check_request(req: "TokenizedGenerateReqInput") -> None:
    """Refuse, at the front door, a request the draft-verify round would not serve exactly."""
    params = req.sampling_params
    if req.return_hidden_states:
        # A round's hidden states are not gathered per token (its logprobs are): refused by name.
        raise ValueError("speculative decoding does not return hidden states")
    if params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0:
        # A drafted position's penalties would depend on the drafts before it.
        raise ValueError("speculative decoding does not apply frequency, presence or repetition penalties")
    if params.grammar_key is not None:
        raise ValueError("speculative decoding does not support json_schema, regex or ebnf constraints")
