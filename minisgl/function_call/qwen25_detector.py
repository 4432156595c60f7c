"""Qwen25Detector: Qwen 2.5's (and Qwen 3's, and Hermes') calls, one JSON object per tag.

Mirrors python/sglang/srt/function_call/qwen25_detector.py. Format::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Omitted: the structural-tag description SGLang builds for strict tools under auto.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Sequence

from minisgl.function_call.base_format_detector import BaseFormatDetector
from minisgl.function_call.core_types import StreamingParseResult

logger = logging.getLogger(__name__)


class Qwen25Detector(BaseFormatDetector):
    bot_token = "<tool_call>\n"
    eot_token = "\n</tool_call>"

    def detect_and_parse(self, text: str, tools: Sequence) -> StreamingParseResult:
        start = text.find(self.bot_token)
        if start < 0:
            return StreamingParseResult(normal_text=text)
        calls = []
        pattern = rf"{re.escape(self.bot_token)}(.*?){re.escape(self.eot_token)}"
        for body in re.findall(pattern, text, re.DOTALL):
            try:
                calls += self.parse_base_json(json.loads(body.strip()), tools, first_index=len(calls))
            except json.JSONDecodeError as e:
                logger.warning("a tool call is not JSON (%s): %r", e, body)
        return StreamingParseResult(normal_text=text[:start].strip(), calls=calls)
