"""What SGLang's own clients send that minisgl does not implement, at the values that mean "unused".

sglang-router re-serializes every /generate body from its typed struct, and the frontend
language (sglang.lang's RuntimeEndpoint) writes out its full sampling dict, so both send
fields minisgl refuses, though only at their defaults. SGLang's /generate also ignores
``model``. These fields are dropped here when, and only when, they hold SGLang's default
(io_struct.GenerateReqInput and sampling_params.SamplingParams at 64bca53); any other
value stays and is refused by name. ``fill_logprob_texts`` implements
``return_text_in_logprobs``, which the frontend's ``select`` needs (token healing reads
each token's text). A stopgap until GenerateReqInput takes every SGLang field itself.
"""

from __future__ import annotations

from typing import Any, Union

_UNUSED_REQUEST_DEFAULTS = {
    "return_text_in_logprobs": False, "log_metrics": True, "modalities": None, "session_params": None,
    "lora_path": None, "lora_id": None, "custom_logit_processor": None, "bootstrap_host": None,
    "bootstrap_port": None, "bootstrap_room": None, "bootstrap_pair_key": None, "data_parallel_rank": None,
    "background": False, "conversation_id": None, "priority": None, "extra_key": None, "no_logs": False,
    "custom_labels": None, "return_bytes": False, "return_entropy": False, "input_embeds": None,
    "image_data": None, "video_data": None, "audio_data": None,
}  # fmt: skip
_UNUSED_SAMPLING_DEFAULTS = {
    "min_new_tokens": 0, "stop_regex": None, "regex": None, "json_schema": None, "ebnf": None,
    "structural_tag": None, "spaces_between_special_tokens": True, "no_stop_trim": False, "custom_params": None,
}  # fmt: skip


def _unused(value: Any, default: Any) -> bool:
    # The frontend writes an empty tuple where SGLang's default is None (stop_regex).
    return value == default or (default is None and value in ([], ()))


def _drop(d: dict, defaults: dict) -> dict:
    return {k: v for k, v in d.items() if not (k in defaults and _unused(v, defaults[k]))}


def without_sglang_defaults(body: dict) -> tuple[dict, bool]:
    """The body less ``model`` and the unused fields at their defaults, and whether it asked for
    return_text_in_logprobs (which is then taken out: the caller fills the texts)."""
    body = _drop({k: v for k, v in body.items() if k != "model"}, _UNUSED_REQUEST_DEFAULTS)
    want_texts = body.pop("return_text_in_logprobs", False) is True
    params = body.get("sampling_params")
    if isinstance(params, dict):
        body["sampling_params"] = _drop(params, _UNUSED_SAMPLING_DEFAULTS)
    elif isinstance(params, list):
        body["sampling_params"] = [_drop(p, _UNUSED_SAMPLING_DEFAULTS) if isinstance(p, dict) else p for p in params]
    return body, want_texts


def fill_logprob_texts(result: Union[dict, list[dict]], tokenizer: Any) -> None:
    """Put each token's text in the third slot of SGLang's (logprob, token_id, text) triples."""
    for r in result if isinstance(result, list) else [result]:
        for key in ("input_token_logprobs", "output_token_logprobs"):
            triples = r["meta_info"].get(key)
            if triples:
                r["meta_info"][key] = [(lp, t, tokenizer.decode([t])) for lp, t, _ in triples]
