"""Llama32Detector: Llama 3.x's JSON calls, after ``<|python_tag|>`` or as the whole reply.

Mirrors python/sglang/srt/function_call/llama32_detector.py. Format::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

Several calls are separated by ``;``. Llama 3's templates ask for the bare object, so a
reply that starts with ``{`` is read as calls too. Omitted: SGLang's fallback that reads
a Python dict literal where JSON fails.
"""

from __future__ import annotations

from typing import Sequence

from minisgl.function_call.base_format_detector import BaseFormatDetector, decode_json_sequence
from minisgl.function_call.core_types import StreamingParseResult


class Llama32Detector(BaseFormatDetector):
    bot_token = "<|python_tag|>"
    tool_call_separator = ";"

    def has_tool_call(self, text: str) -> bool:
        return self.bot_token in text or text.lstrip().startswith("{")

    def calls_start(self, text: str) -> int:
        if self.bot_token in text:
            return text.find(self.bot_token)
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("{") else -1

    def detect_and_parse(self, text: str, tools: Sequence) -> StreamingParseResult:
        if not self.has_tool_call(text):
            return StreamingParseResult(normal_text=text)
        if self.bot_token in text:
            normal_text, action_text = text.split(self.bot_token, 1)
        else:
            normal_text, action_text = "", text
        actions, _ = decode_json_sequence(action_text, self.tool_call_separator)
        return StreamingParseResult(normal_text=normal_text, calls=self.parse_base_json(actions, tools))
