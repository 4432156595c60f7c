"""FunctionCallParser: --tool-call-parser's detector, and the grammar for required and named tool choices.

Mirrors python/sglang/srt/function_call/function_call_parser.py (ToolCallParserEnum,
parse_non_stream, parse_stream_chunk, get_structure_constraint) and utils.py's
get_json_schema_constraint. Omitted: structural tags (SGLang constrains ``auto`` with one
when a tool is ``strict``; minisgl leaves ``auto`` unconstrained).
"""

from __future__ import annotations

from typing import Optional, Sequence

from minisgl.function_call.base_format_detector import BaseFormatDetector
from minisgl.function_call.core_types import ToolCallItem
from minisgl.function_call.llama32_detector import Llama32Detector
from minisgl.function_call.mistral_detector import MistralDetector
from minisgl.function_call.pythonic_detector import PythonicDetector
from minisgl.function_call.qwen25_detector import Qwen25Detector

# SGLang's names for these formats (its enum has twenty-odd more).
TOOL_CALL_PARSERS: dict[str, type[BaseFormatDetector]] = {
    "llama3": Llama32Detector,
    "mistral": MistralDetector,
    "pythonic": PythonicDetector,
    "qwen": Qwen25Detector,
    "qwen25": Qwen25Detector,
}


class FunctionCallParser:
    """One response's calls through one detector; a streamed response keeps one parser per choice."""

    def __init__(self, tools: Sequence, tool_call_parser: str) -> None:
        if tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"unknown tool_call_parser {tool_call_parser!r}; choose one of {sorted(TOOL_CALL_PARSERS)}"
            )
        self.detector = TOOL_CALL_PARSERS[tool_call_parser]()
        self.tools = tools

    def has_tool_call(self, text: str) -> bool:
        return bool(self.tools) and self.detector.has_tool_call(text)

    def parse_non_stream(self, full_text: str) -> tuple[str, list[ToolCallItem]]:
        """The text without its calls, and the calls; the text unchanged when there are none."""
        result = self.detector.detect_and_parse(full_text, self.tools)
        return (result.normal_text, result.calls) if result.calls else (full_text, [])

    def parse_stream_chunk(self, chunk_text: str) -> tuple[str, list[ToolCallItem]]:
        result = self.detector.parse_streaming_increment(chunk_text, self.tools)
        return result.normal_text, result.calls


def get_json_schema_constraint(tools: Sequence, tool_choice, parallel_tool_calls: bool = True) -> Optional[dict]:
    """The JSON schema a required (any tool) or named (that tool) choice constrains the output to:
    an array of ``{"name": ..., "parameters": ...}``. SGLang's; ``parallel_tool_calls=false``
    (which SGLang's chat route ignores) limits the array to one call."""
    if tool_choice == "required":
        chosen = list(tools)
    else:
        chosen = [tool for tool in tools if tool.function.name == tool_choice.function.name]
    items = [_tool_schema(tool) for tool in chosen]
    schema = {"type": "array", "minItems": 1, "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if tool_choice != "required" or not parallel_tool_calls:
        schema["maxItems"] = 1
    defs = _tool_schema_defs(chosen)
    if defs:
        schema["$defs"] = defs
    return schema


def _tool_schema(tool) -> dict:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": [tool.function.name]},
            "parameters": tool.function.parameters or {"type": "object", "properties": {}},
        },
        "required": ["name", "parameters"],
    }


def _tool_schema_defs(tools: Sequence) -> dict:
    """Every tool's ``$defs`` (pydantic puts nested models there), lifted to the array's root,
    where ``#/$defs/...`` references resolve."""
    defs: dict = {}
    for tool in tools:
        for name, schema in ((tool.function.parameters or {}).get("$defs") or {}).items():
            if defs.setdefault(name, schema) != schema:
                raise ValueError(f"tools define $defs/{name} differently; a tool choice cannot constrain to both")
    return defs
