"""PythonicDetector: calls written as a Python list of calls (Llama 4, and prompts that ask for it).

Mirrors python/sglang/srt/function_call/pythonic_detector.py. Format::

    [get_weather(city="Paris"), get_time(zone="CET")]

The list is read with ``ast`` (its arguments are Python literals, not JSON), so a
stream gets its calls whole when the list closes (SGLang streams them as they parse).
Omitted: Llama 4's <|python_start|> tokens.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from typing import Sequence

from minisgl.function_call.base_format_detector import BaseFormatDetector
from minisgl.function_call.core_types import StreamingParseResult, ToolCallItem

logger = logging.getLogger(__name__)

_CALLS_START = re.compile(r"\[\s*[A-Za-z_]\w*\(")
_MAYBE_START = re.compile(r"\[\s*[A-Za-z_]?\w*$")


class PythonicDetector(BaseFormatDetector):
    bot_token = "["

    def has_tool_call(self, text: str) -> bool:
        return self.calls_start(text) >= 0

    def calls_start(self, text: str) -> int:
        match = _CALLS_START.search(text)
        return match.start() if match else -1

    def held_back(self, text: str) -> int:
        match = _MAYBE_START.search(text)
        return len(text) - match.start() if match else 0

    def detect_and_parse(self, text: str, tools: Sequence) -> StreamingParseResult:
        start = self.calls_start(text)
        end = _matching_bracket(text, start) if start >= 0 else -1
        if end < 0:
            return StreamingParseResult(normal_text=text if start < 0 else text[:start])
        normal_text = text[:start] + text[end + 1 :]
        try:
            parsed = ast.parse(text[start : end + 1], mode="eval").body
        except SyntaxError:
            return StreamingParseResult(normal_text=text)
        if not isinstance(parsed, ast.List) or not all(isinstance(e, ast.Call) for e in parsed.elts):
            return StreamingParseResult(normal_text=text)
        known = {tool.function.name for tool in tools}
        calls = []
        for call in parsed.elts:
            name = call.func.id if isinstance(call.func, ast.Name) else None
            if name not in known:
                logger.warning("the model called an undefined function: %r", name)
                continue
            try:
                arguments = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
            except ValueError:  # an argument that is not a literal (a variable, a call)
                logger.warning("a call of %s has an argument that is not a literal", name)
                continue
            calls.append(ToolCallItem(len(calls), name, json.dumps(arguments, ensure_ascii=False)))
        return StreamingParseResult(normal_text=normal_text, calls=calls)

    def stream_calls(self, tools: Sequence) -> list[ToolCallItem]:
        """A pythonic list is read with ``ast`` once it closes: its calls go out whole."""
        calls = self.detect_and_parse(self._buffer, tools).calls
        new, self._num_sent = calls[self._num_sent :], len(calls)
        return new


def _matching_bracket(text: str, start: int) -> int:
    """The index of the ``]`` that closes the ``[`` at ``start`` (brackets in strings skipped), or -1."""
    depth, quote, i = 0, None, start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1
