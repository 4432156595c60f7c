"""JsonArrayParser: the calls of a required or named tool choice, which the grammar makes a JSON array.

Mirrors python/sglang/srt/function_call/json_array_parser.py and the non-streamed reading in
serving_chat.py's _process_tool_calls. The output is constrained (function_call_parser.py's
get_json_schema_constraint) to ``[{"name": ..., "parameters": {...}}, ...]``, whatever the
model's own format, so no --tool-call-parser is needed. SGLang reads this array only when a
parser is configured; minisgl always does.
"""

from __future__ import annotations

from typing import Sequence

from minisgl.function_call.base_format_detector import BaseFormatDetector, decode_json_sequence
from minisgl.function_call.core_types import StreamingParseResult


class JsonArrayParser(BaseFormatDetector):
    bot_token = "["

    def detect_and_parse(self, text: str, tools: Sequence) -> StreamingParseResult:
        start = text.find(self.bot_token)
        if start < 0:
            return StreamingParseResult(normal_text=text)
        actions, _ = decode_json_sequence(text[start + 1 :], ",")
        return StreamingParseResult(calls=self.parse_base_json(actions, tools))
