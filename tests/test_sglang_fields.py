"""Every SGLang request field and sampling param (at 64bca53) is supported or refused, and the docs say which.

The lists below are SGLang's field names, read from python/sglang/srt/managers/io_struct.py
(GenerateReqInput), sampling/sampling_params.py (SamplingParams.__init__) and
entrypoints/openai/protocol.py (CompletionRequest, ChatCompletionRequest) at 64bca53. A name
must be a field minisgl takes or an entry of a refusal table, and docs/chapters/serving.md's
table must say the same, so neither the code nor the docs can drift.
"""

import dataclasses
import inspect
import pathlib
import re

import pytest

from minisgl.entrypoints.openai.protocol import UNSUPPORTED_OPENAI_FIELDS, ChatCompletionRequest, CompletionRequest
from minisgl.managers.io_struct import UNSUPPORTED_REQUEST_FIELDS, UNSUPPORTED_SAMPLING_PARAMS, GenerateReqInput
from minisgl.sampling.sampling_params import SamplingParams

SGLANG_REQUEST_FIELDS = (
    "text input_ids input_embeds image_data video_data audio_data sampling_params return_logprob logprob_start_len "
    "top_logprobs_num token_ids_logprob return_text_in_logprobs stream log_metrics return_hidden_states "
    "return_routed_experts routed_experts_start_len modalities session_params lora_path lora_id custom_logit_processor "
    "bootstrap_host bootstrap_port bootstrap_room bootstrap_pair_key decode_tp_size require_reasoning "
    "data_parallel_rank background conversation_id priority extra_key routing_key no_logs custom_labels return_bytes "
    "return_entropy external_trace_header need_wait_for_image num_items_assigned max_dynamic_patch min_dynamic_patch "
    "image_max_dynamic_patch video_max_dynamic_patch rid"
).split()
SGLANG_SAMPLING_PARAMS = (
    "max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p frequency_penalty presence_penalty "
    "repetition_penalty min_new_tokens n json_schema regex ebnf structural_tag ignore_eos skip_special_tokens "
    "spaces_between_special_tokens no_stop_trim custom_params stream_interval logit_bias sampling_seed"
).split()
SGLANG_OPENAI_FIELDS = (
    "model prompt best_of echo frequency_penalty logit_bias logprobs max_tokens n presence_penalty seed stop stream "
    "stream_options suffix temperature top_p user return_hidden_states return_routed_experts "
    "return_cached_tokens_details top_k min_p min_tokens json_schema regex ebnf repetition_penalty stop_token_ids "
    "stop_regex no_stop_trim ignore_eos skip_special_tokens lora_path session_params response_format custom_params "
    "custom_logit_processor bootstrap_host bootstrap_port bootstrap_room data_parallel_rank rid extra_key cache_salt "
    "priority custom_labels messages top_logprobs max_completion_tokens tools tool_choice reasoning_effort "
    "continue_final_message separate_reasoning stream_reasoning chat_template_kwargs max_dynamic_patch "
    "min_dynamic_patch"
).split()

SUPPORTED_REQUEST = {f.name for f in dataclasses.fields(GenerateReqInput)}
SUPPORTED_SAMPLING = set(inspect.signature(SamplingParams.__init__).parameters) - {"self"}
SUPPORTED_OPENAI = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
TABLES = {
    "GenerateReqInput": (SGLANG_REQUEST_FIELDS, SUPPORTED_REQUEST, UNSUPPORTED_REQUEST_FIELDS),
    "sampling_params": (SGLANG_SAMPLING_PARAMS, SUPPORTED_SAMPLING, UNSUPPORTED_SAMPLING_PARAMS),
    "OpenAI": (SGLANG_OPENAI_FIELDS, SUPPORTED_OPENAI, UNSUPPORTED_OPENAI_FIELDS),
}


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_every_sglang_field_is_supported_or_refused(kind):
    names, supported, refused = TABLES[kind]
    assert not set(supported) & set(refused), "a field cannot be both"
    assert [n for n in names if n not in supported and n not in refused] == []
    # Nothing in a refusal table that SGLang does not have (a typo would refuse nothing).
    assert set(refused) - set(names) <= {"parallel_tool_calls", "functions", "function_call"}


def _docs_rows() -> dict[str, dict[str, str]]:
    text = (pathlib.Path(__file__).parents[1] / "docs/chapters/serving.md").read_text()
    section = text[text.index("## SGLang request fields in minisgl") :]
    tables: dict[str, dict[str, str]] = {}
    current = None
    for line in section.splitlines():
        heading = re.match(r"### (\S+)", line)
        if heading:
            current = tables.setdefault(heading.group(1), {})
        row = re.match(r"\| `(\w+)` \| (supported|refused)", line)
        if row and current is not None:
            current[row.group(1)] = row.group(2)
    return tables


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_the_docs_table_matches_the_refusal_tables(kind):
    names, _, refused = TABLES[kind]
    rows = _docs_rows()[kind]
    assert sorted(rows) == sorted(set(names) | set(refused))
    assert {n for n, v in rows.items() if v == "refused"} == set(refused)


@pytest.mark.parametrize("method", ["generate", "async_generate"])
def test_the_engine_takes_exactly_generate_req_inputs_fields(method):
    """One table per fact: Engine.generate's parameters are GenerateReqInput's fields (``text``
    named ``prompt``, as SGLang's Engine names it), so neither can gain a field the other lacks."""
    from minisgl.entrypoints.engine import Engine

    params = set(inspect.signature(getattr(Engine, method)).parameters) - {"self"}
    assert params == (SUPPORTED_REQUEST - {"text"}) | {"prompt"}


def test_every_refusal_goes_through_one_function():
    """/generate, the sampling params and the OpenAI request models refuse through io_struct's
    refuse_unsupported: one loop, one message."""
    from minisgl.managers import io_struct

    for where, table in (
        (dict(suffix="x"), UNSUPPORTED_OPENAI_FIELDS),
        (dict(lora_path="a"), UNSUPPORTED_REQUEST_FIELDS),
    ):
        with pytest.raises(ValueError) as e:
            io_struct.refuse_unsupported(where, table)
        message = str(e.value)
        with pytest.raises(ValueError, match=re.escape(message)):
            if table is UNSUPPORTED_OPENAI_FIELDS:
                CompletionRequest(model="m", prompt="p", **where)
            else:
                GenerateReqInput.from_dict({"text": "p", **where})
    assert io_struct.refuse_unsupported({"suffix": None, "prompt": "p"}, UNSUPPORTED_OPENAI_FIELDS) == {"prompt": "p"}
