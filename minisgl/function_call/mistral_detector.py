"""MistralDetector: Mistral's calls, a JSON array after ``[TOOL_CALLS]``.

Mirrors python/sglang/srt/function_call/mistral_detector.py. Format::

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]

Omitted: the compact ``[TOOL_CALLS]name[ARGS]{...}`` form of newer Mistral templates.
"""

from __future__ import annotations

from typing import Sequence

from minisgl.function_call.base_format_detector import BaseFormatDetector, decode_json_sequence
from minisgl.function_call.core_types import StreamingParseResult


class MistralDetector(BaseFormatDetector):
    bot_token = "[TOOL_CALLS] ["

    def detect_and_parse(self, text: str, tools: Sequence) -> StreamingParseResult:
        start = text.find(self.bot_token)
        if start < 0:
            return StreamingParseResult(normal_text=text)
        # The array's complete elements: read one by one, so a stream gets each call as it closes.
        actions, _ = decode_json_sequence(text[start + len(self.bot_token) :], ",")
        return StreamingParseResult(normal_text=text[:start].strip(), calls=self.parse_base_json(actions, tools))
