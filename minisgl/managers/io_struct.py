"""Messages between the front end (Engine / TokenizerManager) and the Scheduler.

Mirrors python/sglang/srt/managers/io_struct.py (GenerateReqInput,
TokenizedGenerateReqInput, BatchTokenIDOutput, AbortReq, FlushCacheReqInput,
ExpertDistributionReq, GetInternalStateReq). SGLang sends these over ZMQ between
processes; minisgl passes them in memory, or, with tensor parallelism, over a
pipe to rank 0's scheduler process.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from minisgl.sampling.sampling_params import SamplingParams


@dataclasses.dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: Optional[str]
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    return_hidden_states: bool = False
    return_routed_experts: bool = False
    stream: bool = False


@dataclasses.dataclass
class ReqOutput:
    """One request's progress after a scheduler step: new tokens, and meta_info once finished."""

    rid: str
    new_output_ids: list[int]
    finished: bool
    meta_info: Optional[dict[str, Any]] = None


@dataclasses.dataclass
class AbortReq:
    rid: str


# Control requests. With tensor parallelism they travel to every rank's scheduler like
# generation requests (rank 0 receives, then broadcasts), and rank 0 sends the reply.


@dataclasses.dataclass
class FlushCacheReqInput:
    pass


@dataclasses.dataclass
class ExpertDistributionReq:
    action: str  # "start" | "stop" | "dump"
    output_path: Optional[str] = None


@dataclasses.dataclass
class GetInternalStateReq:
    pass
