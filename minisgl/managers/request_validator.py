"""RequestValidator: every check a request passes before it reaches the scheduler.

Mirrors TokenizerManager._validate_one_request and the TokenizedGenerateReqInput
half of _create_tokenized_object in python/sglang/srt/managers/tokenizer_manager.py,
with SamplingParams.verify (sampling/sampling_params.py) for the sampling fields.
This is the one place minisgl validates a request: the Engine and the server both
come through TokenizerManager, so both refuse the same inputs with the same message
(a ValueError, which the server answers with a 400). Being strict here is what keeps
the scheduler alive: a value it cannot hold (an id outside the vocabulary, a logprob
start past the prompt) would otherwise fail inside a batch, for every request in it.
"""

from __future__ import annotations

from typing import Any, Optional

from minisgl.managers.io_struct import (
    UNSUPPORTED_SAMPLING_PARAMS,
    TokenizedGenerateReqInput,
    check_type,
    refuse_unsupported,
)
from minisgl.managers.tp_worker import WorkerInfo
from minisgl.sampling.sampling_params import SamplingParams
from minisgl.server_args import ServerArgs
from minisgl.speculative.spec_info import check_request


class RequestValidator:
    """Turns one normalized request (GenerateReqInput[i]) into a checked TokenizedGenerateReqInput."""

    def __init__(self, server_args: ServerArgs, worker_info: WorkerInfo, is_moe: bool) -> None:
        self.server_args = server_args
        self.info = worker_info
        self.vocab_size = worker_info.vocab_size
        self.context_len = worker_info.max_req_len
        self.is_moe = is_moe
        self.speculative = server_args.speculative_algorithm is not None

    def check_text_length(self, name: str, text: str, max_token_chars: int) -> None:
        """Refuse, before tokenizing it, a text that cannot fit the context: no token covers more
        than ``max_token_chars`` characters (4x for a normalizer that composes characters), so a
        longer text is more tokens than the context holds. Tokenizing 24 MB took 99 s."""
        limit = self.context_len * max_token_chars * 4
        if len(text) > limit:
            raise ValueError(
                f"{name} is {len(text)} characters, more than the {self.context_len}-token context can hold "
                f"(at most {limit} characters)"
            )

    def make_tokenized_request(
        self, spec: dict[str, Any], text: Optional[str], ids: list[int], stream: bool
    ) -> TokenizedGenerateReqInput:
        self._validate_prompt(ids)
        return_logprob = check_type("return_logprob", spec["return_logprob"], bool)
        logprob_start_len = check_type("logprob_start_len", spec["logprob_start_len"], int)
        top_logprobs_num = check_type("top_logprobs_num", spec["top_logprobs_num"], int)
        token_ids_logprob = spec["token_ids_logprob"]
        hidden = check_type("return_hidden_states", spec["return_hidden_states"], bool)
        experts = check_type("return_routed_experts", spec["return_routed_experts"], bool)
        if not -1 <= logprob_start_len < len(ids):
            raise ValueError(
                f"logprob_start_len ({logprob_start_len}) must be -1 or a position in the prompt [0, {len(ids)})"
            )
        if not 0 <= top_logprobs_num <= self.vocab_size:
            raise ValueError(f"top_logprobs_num must be in [0, {self.vocab_size}], got {top_logprobs_num}")
        if token_ids_logprob is not None:
            if not isinstance(token_ids_logprob, list):
                raise ValueError("token_ids_logprob must be a list of token ids")
            self._check_ids("token_ids_logprob", token_ids_logprob)
        if hidden and not self.server_args.enable_return_hidden_states:
            raise ValueError("return_hidden_states needs the server started with --enable-return-hidden-states")
        if experts and not self.server_args.enable_return_routed_experts:
            raise ValueError("return_routed_experts needs the server started with --enable-return-routed-experts")
        if experts and not self.is_moe:
            raise ValueError("return_routed_experts needs a mixture-of-experts model")
        sampling = self._make_sampling_params(spec["sampling_params"], len(ids), spec["sample_index"])
        processor = spec["custom_logit_processor"]
        if processor is not None or sampling.custom_params is not None:
            if not self.server_args.enable_custom_logit_processor:
                # Deserializing a processor runs the client's code in the server (SGLang's rule too).
                raise ValueError(
                    "custom_logit_processor and custom_params need the server started with "
                    "--enable-custom-logit-processor"
                )
            if processor is not None:
                from minisgl.sampling.custom_logit_processor import CustomLogitProcessor

                CustomLogitProcessor.from_str(check_type("custom_logit_processor", processor, str))
        req = TokenizedGenerateReqInput(
            rid=spec["rid"],
            input_text=text,
            input_ids=ids,
            sampling_params=sampling,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            token_ids_logprob=token_ids_logprob,
            return_hidden_states=hidden,
            return_routed_experts=experts,
            stream=stream,
            custom_logit_processor=processor,
        )
        if self.speculative:
            check_request(req)
        return req

    def _check_ids(self, name: str, ids: list) -> None:
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise ValueError(f"{name} must be token ids in [0, {self.vocab_size}), got {t!r}")

    def _validate_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("the prompt is empty")
        self._check_ids("input_ids", ids)
        if len(ids) > self.info.max_req_input_len:
            raise ValueError(
                f"The input ({len(ids)} tokens) is longer than the model's context length ({self.context_len} tokens)."
            )
        if len(ids) + 1 > self.info.max_total_num_tokens:
            raise ValueError(
                f"The input ({len(ids)} tokens) does not fit the KV cache ({self.info.max_total_num_tokens} tokens)."
            )

    def _make_sampling_params(self, params: dict, prompt_len: int, sample_index: int) -> SamplingParams:
        params = refuse_unsupported(params, UNSUPPORTED_SAMPLING_PARAMS)
        user_max_new_tokens = params.get("max_new_tokens")
        if "max_new_tokens" in params and user_max_new_tokens is None:
            params["max_new_tokens"] = self.context_len - prompt_len  # SGLang: None means "to the context length"
        sampling = SamplingParams.from_dict(params)
        try:
            sampling.verify(self.vocab_size)
        except TypeError as e:  # a value of the wrong type, compared with a number
            raise ValueError(f"bad sampling_params: {e}") from None
        if sampling.seed is not None and sample_index:
            # The n samples of one prompt must differ, yet repeat under the same seed.
            sampling.seed = (sampling.seed + sample_index) % (1 << 63)
        if any(not isinstance(s, str) or not s for s in sampling.stop_strs):
            raise ValueError("stop must be a non-empty string or a list of them")
        if user_max_new_tokens is not None and prompt_len + sampling.max_new_tokens > self.context_len:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {self.context_len} "
                f"tokens. You requested a total of {prompt_len + sampling.max_new_tokens} tokens: {prompt_len} "
                f"tokens from the input messages and {sampling.max_new_tokens} tokens for the completion."
            )
        return sampling
