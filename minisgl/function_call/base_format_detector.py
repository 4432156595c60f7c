"""BaseFormatDetector: what every tool-call format shares, in one go and streamed.

Mirrors python/sglang/srt/function_call/base_format_detector.py (parse_base_json,
detect_and_parse, parse_streaming_increment, _ends_with_partial_token). A detector
knows where its calls start (``bot_token``) and how to read complete calls from
text. Streamed, a call goes out as SGLang sends it: first its name (with empty
arguments), then its arguments in pieces as they are written, each piece what two
readings of the call so far agree on (partial_json.py), the rest when the call closes;
OpenAI's clients join the pieces into the arguments of the whole reply. The calls of a
JSON format are its top-level ``{...}`` objects after the marker (the markers and
separators between them hold no brace). Differs from SGLang: one reader for every JSON
format where SGLang's detectors each override it, and pythonic calls still go out whole.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional, Sequence

from minisgl.function_call.core_types import StreamingParseResult, ToolCallItem
from minisgl.function_call.partial_json import common_prefix, partial_json_loads

logger = logging.getLogger(__name__)


class BaseFormatDetector:
    """One model family's call format; a fresh instance per streamed response (it holds the stream's state)."""

    bot_token = ""  # what opens the calls ("beginning of tool")

    def __init__(self) -> None:
        self._buffer = ""  # streamed text not yet sent: a possible marker, or the calls so far
        self._in_calls = False
        self._num_sent = 0  # calls whose name has gone out
        self._scanned = 0  # where in the buffer the call in progress (or the next) may begin
        self._sent_args: Optional[str] = None  # the call in progress's arguments sent so far (None: no call)
        self._prev_args = ""  # its arguments as last read, to send only what two readings agree on

    def has_tool_call(self, text: str) -> bool:
        return self.bot_token in text

    def detect_and_parse(self, text: str, tools: Sequence) -> StreamingParseResult:
        """The whole text at once: the text around the calls, and every complete call."""
        raise NotImplementedError

    def parse_base_json(self, action: Any, tools: Sequence, first_index: int = 0) -> list[ToolCallItem]:
        """``{"name": ..., "arguments"|"parameters": {...}}`` (or a list of them) -> calls of known tools."""
        known = {tool.function.name for tool in tools}
        calls = []
        for act in action if isinstance(action, list) else [action]:
            name = act.get("name") if isinstance(act, dict) else None
            if name not in known:
                # SGLang's default too (SGLANG_FORWARD_UNKNOWN_TOOLS off): a call of no given tool is dropped.
                logger.warning("the model called an undefined function: %r", name)
                continue
            arguments = act.get("parameters", act.get("arguments", {}))
            calls.append(ToolCallItem(first_index + len(calls), name, json.dumps(arguments, ensure_ascii=False)))
        return calls

    # ---- streaming ---------------------------------------------------------------------------

    def calls_start(self, text: str) -> int:
        """Where the calls begin in ``text``, or -1."""
        return text.find(self.bot_token)

    def held_back(self, text: str) -> int:
        """How many characters at the end of ``text`` (with no calls in it) may begin the calls."""
        return _ends_with_partial_token(text, self.bot_token)

    def parse_streaming_increment(self, new_text: str, tools: Sequence) -> StreamingParseResult:
        """The next chunk: text safe to show now, and the calls completed by it."""
        self._buffer += new_text
        normal = ""
        if not self._in_calls:
            start = self.calls_start(self._buffer)
            if start < 0:
                # Hold back what may be the start of the marker ("<tool" of "<tool_call>").
                keep = self.held_back(self._buffer)
                normal, self._buffer = (
                    self._buffer[: len(self._buffer) - keep],
                    self._buffer[len(self._buffer) - keep :],
                )
                return StreamingParseResult(normal_text=normal)
            normal, self._buffer = self._buffer[:start], self._buffer[start:]
            self._in_calls = True
        return StreamingParseResult(normal_text=normal, calls=self.stream_calls(tools))

    def stream_calls(self, tools: Sequence) -> list[ToolCallItem]:
        """The deltas the calls in the buffer add: a name item when a call's name is known,
        then argument pieces (SGLang's base parse_streaming_increment, cases 1 and 2)."""
        known, items = {tool.function.name for tool in tools}, []
        while (start := self._buffer.find("{", self._scanned)) >= 0:
            # Until the name is out, a name cut off ("get_wea") is not read as one.
            call, end = partial_json_loads(self._buffer[start:], partial_strings=self._sent_args is not None)
            call = call if isinstance(call, dict) else {}
            if self._sent_args is None:
                name = call.get("name")
                if end is None and name is None:
                    break  # the name is still to come
                if name in known:
                    items.append(ToolCallItem(self._num_sent, name, ""))
                    self._num_sent, self._sent_args, self._prev_args = self._num_sent + 1, "", ""
            if self._sent_args is not None:
                arguments = call.get("parameters", call.get("arguments", {} if end is not None else None))
                now = "" if arguments is None else json.dumps(arguments, ensure_ascii=False)
                # Complete: all that is left; in progress: what this reading and the last agree on
                # (two equal readings agree on their closing brackets too, which may yet move).
                sure = now if end is not None else self._sent_args
                if end is None and now != self._prev_args:
                    sure = common_prefix(self._prev_args, now)
                if len(sure) > len(self._sent_args):
                    items.append(ToolCallItem(self._num_sent - 1, None, sure[len(self._sent_args) :]))
                    self._sent_args = sure
                self._prev_args = now
            if end is None:
                break
            self._scanned, self._sent_args = start + end, None  # the next call, or an unknown one skipped
        return items

    def flush(self) -> str:
        """At the end of the reply: text held back as a possible marker that never became one."""
        held, self._buffer = ("" if self._in_calls else self._buffer), ""
        return held


def _ends_with_partial_token(buffer: str, token: str) -> int:
    """How many characters at the end of ``buffer`` begin ``token`` (SGLang's _ends_with_partial_token)."""
    for i in range(min(len(buffer), len(token) - 1), 0, -1):
        if token.startswith(buffer[-i:]):
            return i
    return 0


def decode_json_sequence(text: str, separator: str) -> tuple[list, int]:
    """The complete JSON values at the start of ``text``, separated by ``separator`` (and white
    space), and where the last one ends; stops at the first value that does not parse yet."""
    # strict=False: a control character inside a string is read as itself; xgrammar's JSON
    # grammar lets a model write one, and the call is no less the model's for it.
    decoder = json.JSONDecoder(strict=False)
    values, pos, end = [], 0, 0
    while True:
        while pos < len(text) and (text[pos].isspace() or text.startswith(separator, pos)):
            pos += 1 if text[pos].isspace() else len(separator)
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return values, end
        values.append(value)
        end = pos
