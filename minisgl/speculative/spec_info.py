"""SpeculativeAlgorithm: which speculative decoding the engine runs, and the worker that runs it.

Mirrors python/sglang/srt/speculative/spec_info.py (SpeculativeAlgorithm with
from_string, is_none, create_worker). SGLang also has EAGLE,
EAGLE3 and NGRAM, overlap-scheduled "v2" workers and tree drafts (topk > 1);
minisgl keeps STANDALONE, a separate small draft model drafting a chain. What that
worker cannot do exactly is refused here, at start-up (check_server_args) and at the
front door (check_request), so that the refusals live with the speculation they protect.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from minisgl.managers.io_struct import TokenizedGenerateReqInput
    from minisgl.server_args import ServerArgs
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


def check_server_args(args: "ServerArgs") -> None:
    """Normalize the speculative flags and refuse what the chain drafter cannot do (at start-up)."""
    if args.speculative_algorithm is None:
        return
    if args.speculative_algorithm.upper() != "STANDALONE":
        raise ValueError(f"speculative_algorithm must be STANDALONE, got {args.speculative_algorithm!r}")
    args.speculative_algorithm = "STANDALONE"
    if args.speculative_draft_model_path is None:
        raise ValueError("speculative_algorithm STANDALONE needs speculative_draft_model_path")
    if args.speculative_num_steps is None:
        draft_tokens = args.speculative_num_draft_tokens
        args.speculative_num_steps = 3 if draft_tokens is None else draft_tokens - 1
    if args.speculative_num_steps < 1:
        raise ValueError("speculative_num_steps must be >= 1")
    # SGLang's rule for a chain (topk 1): one draft token per step, plus the last verified token.
    if args.speculative_num_draft_tokens not in (None, args.speculative_num_steps + 1):
        raise ValueError(
            f"speculative_num_draft_tokens must be speculative_num_steps + 1 = {args.speculative_num_steps + 1} "
            "(minisgl drafts a chain, not a tree)"
        )
    args.speculative_num_draft_tokens = args.speculative_num_steps + 1
    if args.page_size != 1:
        raise ValueError("speculative decoding needs page_size 1: rejected drafts free single slots")
    if args.enable_return_routed_experts or args.expert_distribution_recorder_mode:
        raise ValueError("speculative decoding does not record experts: the draft would replace the target's hooks")


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
