"""Messages between the front end (Engine / TokenizerManager) and the Scheduler.

Mirrors python/sglang/srt/managers/io_struct.py (GenerateReqInput,
TokenizedGenerateReqInput, BatchTokenIDOutput, AbortReq, FlushCacheReqInput,
ExpertDistributionReq, GetInternalStateReq). SGLang sends these over ZMQ between
processes; minisgl passes them in memory, or, with tensor parallelism, over a
pipe to rank 0's scheduler process.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Optional, Union

from minisgl.sampling.sampling_params import SamplingParams

# Samples per prompt. OpenAI allows 128; every sample holds its own KV, and a small pool
# would spend itself on one request.
MAX_N = 16
# The per-request options a batch may give as one value for all prompts or as a list.
_PER_REQUEST = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_hidden_states",
    "return_routed_experts",
    "custom_logit_processor",
)
_DEFAULTS = {"return_logprob": False, "logprob_start_len": -1, "top_logprobs_num": 0}

# SGLang's GenerateReqInput fields (io_struct.py at 64bca53) that minisgl refuses, with why. A field
# is refused only when it is given a value other than SGLang's default (None, False, ...): SGLang's
# own clients send some of them with their defaults. docs/chapters/serving.md's table is checked
# against these dicts (tests/test_sglang_fields.py).
UNSUPPORTED_REQUEST_FIELDS: dict[str, tuple[Any, str]] = {
    "input_embeds": (None, "input embeddings"),
    "image_data": (None, "multimodal inputs"),
    "video_data": (None, "multimodal inputs"),
    "audio_data": (None, "multimodal inputs"),
    "modalities": (None, "multimodal inputs"),
    "need_wait_for_image": (None, "multimodal inputs"),
    "num_items_assigned": (None, "multimodal inputs"),
    "max_dynamic_patch": (None, "multimodal inputs"),
    "min_dynamic_patch": (None, "multimodal inputs"),
    "image_max_dynamic_patch": (None, "multimodal inputs"),
    "video_max_dynamic_patch": (None, "multimodal inputs"),
    "session_params": (None, "sessions"),
    "lora_path": (None, "LoRA adapters"),
    "lora_id": (None, "LoRA adapters"),
    "bootstrap_host": (None, "prefill/decode disaggregation"),
    "bootstrap_port": (None, "prefill/decode disaggregation"),
    "bootstrap_room": (None, "prefill/decode disaggregation"),
    "bootstrap_pair_key": (None, "prefill/decode disaggregation"),
    "decode_tp_size": (None, "prefill/decode disaggregation"),
    "data_parallel_rank": (None, "data parallelism"),
    "routed_experts_start_len": (0, "a start position for routed experts (all positions are returned)"),
    "require_reasoning": (False, "reasoning parsers"),
    "background": (False, "background requests"),
    "conversation_id": (None, "conversations"),
    "priority": (None, "priority scheduling"),
    "extra_key": (None, "cache-isolation keys"),
    "routing_key": (None, "routing keys"),
    "no_logs": (False, "request logging switches (minisgl logs no requests)"),
    "log_metrics": (True, "per-request metrics switches"),
    "custom_labels": (None, "metric labels"),
    "return_bytes": (False, "byte outputs"),
    "return_entropy": (False, "entropy outputs"),
    "external_trace_header": (None, "external trace headers"),
}
# SGLang's sampling_params keys (sampling/sampling_params.py at 64bca53) that minisgl refuses.
# json_schema, regex and ebnf are supported (minisgl/constrained/); structural tags are not.
UNSUPPORTED_SAMPLING_PARAMS: dict[str, tuple[Any, str]] = {
    "stream_interval": (None, "a per-request stream interval (every step streams)"),
    "structural_tag": (None, "constrained decoding with structural tags"),
}


def refuse_unsupported(where: dict, table: dict[str, tuple[Any, str]]) -> dict:
    """A ValueError naming the first field of ``where`` that ``table`` refuses (given a non-default
    value); else ``where`` without the table's fields. The one refusal loop: /generate, the
    sampling params and the OpenAI request models all come through here."""
    for name, (default, what) in table.items():
        if name in where and where[name] != default:
            raise ValueError(f"minisgl does not support {name} ({what})")
    return {k: v for k, v in where.items() if k not in table}


@dataclasses.dataclass
class GenerateReqInput:
    """One generation request as a client sends it: one prompt or a batch, text or ids.

    Mirrors GenerateReqInput in io_struct.py (normalize_batch_and_arguments,
    __getitem__). ``normalize_batch_and_arguments`` decides single against batch,
    expands ``n`` (SGLang's parallel_sample_num: a single prompt with n > 1 becomes
    a batch) and turns every per-request option into one value per request, so
    ``obj[i]`` is request i. Types are checked here, strictly (a bool is not an
    int, a float is not an id), because JSON decoders and keyword callers hand
    over whatever they were given. SGLang's other fields (multimodal inputs, LoRA,
    sessions, disaggregation, routing keys, ...) are refused by ``from_dict``, from
    UNSUPPORTED_REQUEST_FIELDS.
    """

    text: Optional[Union[str, list[str]]] = None
    input_ids: Optional[Union[list[int], list[list[int]]]] = None
    sampling_params: Optional[Union[dict, list[dict]]] = None
    rid: Optional[Union[str, list[str]]] = None
    return_logprob: Optional[Union[bool, list[bool]]] = None
    logprob_start_len: Optional[Union[int, list[int]]] = None
    top_logprobs_num: Optional[Union[int, list[int]]] = None
    token_ids_logprob: Optional[Union[list[int], list[list[int]]]] = None
    stream: bool = False
    return_hidden_states: Union[bool, list[bool]] = False
    return_routed_experts: Union[bool, list[bool]] = False
    return_text_in_logprobs: bool = False
    # A serialized CustomLogitProcessor (sampling/custom_logit_processor.py); needs
    # --enable-custom-logit-processor, since the server then runs the client's code.
    custom_logit_processor: Optional[Union[str, list[Optional[str]]]] = None

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> "GenerateReqInput":
        """A request from a JSON body: SGLang's fields minisgl lacks are refused by name, unknown ones too."""
        # SGLang's /generate ignores ``model`` (sglang-router sends it).
        body = refuse_unsupported({k: v for k, v in body.items() if k != "model"}, UNSUPPORTED_REQUEST_FIELDS)
        known = {f.name for f in dataclasses.fields(cls)}
        extra = [k for k in body if k not in known]
        if extra:
            raise ValueError(f"unknown field in the request: {extra[0]!r}")
        return cls(**body)

    def normalize_batch_and_arguments(self) -> None:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("pass exactly one of text and input_ids")
        check_type("stream", self.stream, bool)
        check_type("return_text_in_logprobs", self.return_text_in_logprobs, bool)
        if self.text is not None:
            self.is_single = isinstance(self.text, str)
            prompts = [self.text] if self.is_single else _as_list("text", self.text)
            for t in prompts:
                check_text("text", t)
        else:
            ids = _as_list("input_ids", self.input_ids)
            self.is_single = not ids or not isinstance(ids[0], list)
            prompts = [ids] if self.is_single else ids
            for p in prompts:
                for t in _as_list("input_ids", p):
                    check_type("input_ids", t, int)
        self.batch_size = len(prompts)
        if self.batch_size == 0:
            raise ValueError("the batch of prompts is empty")

        params = self.sampling_params
        param_list = [params] * self.batch_size if params is None or isinstance(params, dict) else params
        param_list = _per_prompt("sampling_params", _as_list("sampling_params", param_list), self.batch_size)
        for p in param_list:
            if p is not None and not isinstance(p, dict):
                raise ValueError(f"sampling_params must be an object, got {type(p).__name__}")
        ns = [(p or {}).get("n", 1) for p in param_list]
        for n in ns:
            # Checked before the batch is expanded n-fold: a huge n must not build a huge list.
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
                raise ValueError(f"n must be an integer in [1, {MAX_N}], got {n!r}")
        if len(set(ns)) > 1:
            raise ValueError("n must be the same for every prompt of a batch")
        self.parallel_sample_num = n = ns[0]
        if n > 1:
            self.is_single = False
        num = self.batch_size * n

        # Request i is sample i % n of prompt i // n (SGLang orders prompt-major too).
        self.prompts = [prompts[i // n] for i in range(num)]
        self.sampling_params = [{k: v for k, v in (param_list[i // n] or {}).items() if k != "n"} for i in range(num)]
        for name in _PER_REQUEST:
            value = getattr(self, name)
            values = _per_prompt(name, value, self.batch_size) if isinstance(value, list) else [value] * self.batch_size
            setattr(self, name, [_DEFAULTS.get(name) if values[i // n] is None else values[i // n] for i in range(num)])
        ids_logprob = self.token_ids_logprob
        if ids_logprob is not None:
            _as_list("token_ids_logprob", ids_logprob)
        if not ids_logprob or not isinstance(ids_logprob[0], list):
            ids_logprob = [ids_logprob or None] * self.batch_size
        ids_logprob = _per_prompt("token_ids_logprob", ids_logprob, self.batch_size)
        self.token_ids_logprob = [ids_logprob[i // n] for i in range(num)]
        self.rid = self._normalize_rid(num)

    def _normalize_rid(self, num: int) -> list[str]:
        if self.rid is None:
            return [uuid.uuid4().hex for _ in range(num)]
        if isinstance(self.rid, str):
            check_text("rid", self.rid)
            return [self.rid] if num == 1 else [f"{self.rid}_{i}" for i in range(num)]
        rids = _per_prompt("rid", _as_list("rid", self.rid), self.batch_size)
        for r in rids:
            check_text("rid", r)
        if self.parallel_sample_num > 1:
            return [f"{rids[i // self.parallel_sample_num]}_{i % self.parallel_sample_num}" for i in range(num)]
        return list(rids)

    def __len__(self) -> int:
        return len(self.rid)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Request i's options, after normalize_batch_and_arguments."""
        return {
            "rid": self.rid[i],
            "prompt": self.prompts[i],
            "sampling_params": self.sampling_params[i],
            "sample_index": i % self.parallel_sample_num,
            **{name: getattr(self, name)[i] for name in (*_PER_REQUEST, "token_ids_logprob")},
        }


def _as_list(name: str, value) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{name} must be a list, got {type(value).__name__}")
    return value


def _per_prompt(name: str, values: list, batch_size: int) -> list:
    if len(values) != batch_size:
        raise ValueError(f"{name} has {len(values)} entries for a batch of {batch_size} prompts")
    return values


def check_type(name: str, value, kind: type):
    """Return value if it is a ``kind``; else a ValueError. bool is a subclass of int in
    Python, never in JSON, so True is not an int here."""
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"{name} must be of type {kind.__name__}, got {value!r}")
    return value


def check_text(name: str, value) -> None:
    """A ValueError unless value is a str that UTF-8 can carry (no lone surrogate)."""
    check_type(name, value, str)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid UTF-8 (it holds a lone surrogate)") from None


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
    custom_logit_processor: Optional[str] = None


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


@dataclasses.dataclass
class ProfileReq:
    """SGLang's ProfileReq: start or stop the torch profiler in the scheduler (scheduler_profiler.py)."""

    action: str  # "start" | "stop"
    output_dir: Optional[str] = None
    activities: Optional[list[str]] = None  # SGLang's names: "CPU", "GPU"
