"""JsonArrayParser: the calls of a required or named tool choice, which the grammar makes a JSON array.

Mirrors python/sglang/srt/function_call/json_array_parser.py and the non-streamed reading in
serving_chat.py's _process_tool_calls. The output is constrained (function_call_parser.py's
get_json_schema_constraint) to ``[{"name": ..., "parameters": {...}}, ...]``, whatever the
model's own format, so no --tool-call-parser is needed. SGLang reads this array only when a
parser is configured; minisgl always does. It is Mistral's format without the marker.
"""

from __future__ import annotations

from minisgl.function_call.mistral_detector import MistralDetector


class JsonArrayParser(MistralDetector):
    bot_token = "["
