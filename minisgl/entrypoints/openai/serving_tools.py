"""ChatTools: one chat request's tools, from the prompt to the calls in its response.

Mirrors the tool handling of python/sglang/srt/entrypoints/openai/serving_chat.py
(_validate_request's tool checks, _process_messages' tools and constraint,
_process_tool_calls, _process_tool_call_stream). ``tool_choice``:
- ``none``: the template gets no tools, the reply is text;
- ``auto``: the template renders the tools, and --tool-call-parser's detector reads any
  calls out of the reply (without a parser the reply stays text, as in SGLang);
- ``required`` or a named function: the output is constrained by the grammar backend to a
  JSON array of calls (function_call_parser.get_json_schema_constraint), so even a model
  that never saw a tool makes a call whose arguments follow the function's schema.
A reply with calls that stopped by itself finishes with ``"tool_calls"``.
"""

from __future__ import annotations

import json
import uuid
from typing import AsyncIterator, Optional

from minisgl.entrypoints.openai.protocol_tools import FunctionResponse, ToolCall, ToolChoice
from minisgl.function_call.base_format_detector import BaseFormatDetector
from minisgl.function_call.core_types import ToolCallItem
from minisgl.function_call.function_call_parser import FunctionCallParser, get_json_schema_constraint
from minisgl.function_call.json_array_parser import JsonArrayParser


class ChatTools:
    """What the tools of one request change: template, constraint, and the reading of the reply."""

    def __init__(self, request, tool_call_parser: Optional[str]) -> None:
        self.tools = request.tools or []
        self.choice = request.tool_choice or ("auto" if self.tools else "none")
        self.parallel = request.parallel_tool_calls
        self.constrained = self.choice == "required" or isinstance(self.choice, ToolChoice)
        self.tool_call_parser = tool_call_parser
        # Whether the reply is read for calls at all.
        self.active = bool(self.tools) and (
            self.constrained or (self.choice == "auto" and tool_call_parser is not None)
        )

    @staticmethod
    def validate(request) -> Optional[str]:
        """SGLang's checks of tools against tool_choice, as an error message or None."""
        choice = request.tool_choice
        if choice == "required" and not request.tools:
            return "tool_choice 'required' needs tools"
        if isinstance(choice, ToolChoice):
            if not request.tools:
                return "a named tool_choice needs tools"
            if choice.function.name not in {tool.function.name for tool in request.tools}:
                return f"tool_choice names {choice.function.name!r}, which is not in tools"
        if choice == "required" or isinstance(choice, ToolChoice):
            fields = ("response_format", "json_schema", "regex", "ebnf")
            given = [f for f in fields if getattr(request, f) is not None]
            if given:
                kind = "required" if choice == "required" else "named"
                return f"tool_choice {kind} constrains the output; it cannot be combined with {given[0]}"
        return None

    def template_tools(self) -> Optional[list[dict]]:
        """The tools the chat template renders: none for ``none``, the named one alone for a named choice."""
        if not self.tools or self.choice == "none":
            return None
        chosen = self.tools
        if isinstance(self.choice, ToolChoice):
            chosen = [t for t in self.tools if t.function.name == self.choice.function.name]
        return [t.model_dump(exclude_none=True) for t in chosen]

    def json_schema(self) -> Optional[str]:
        if not self.constrained:
            return None
        return json.dumps(get_json_schema_constraint(self.tools, self.choice, self.parallel))

    def _detector(self) -> BaseFormatDetector:
        if self.constrained:
            return JsonArrayParser()
        return FunctionCallParser(self.tools, self.tool_call_parser).detector

    def _limit(self, calls: list[ToolCallItem]) -> list[ToolCallItem]:
        # parallel_tool_calls=false: one call (a required choice's grammar already allows only one).
        return calls if self.parallel else calls[:1]

    # ---- the whole reply ---------------------------------------------------------------------

    def parse(self, text: str, finish_reason: Optional[dict]) -> tuple[Optional[str], Optional[list[ToolCall]], dict]:
        """(the text left, the calls or None, the finish reason) of a finished reply."""
        if not self.active:
            return text, None, finish_reason
        result = self._detector().detect_and_parse(text, self.tools)
        calls = self._limit(result.calls)
        if not calls:
            return text, None, finish_reason
        return result.normal_text or None, [_tool_call(c) for c in calls], _tool_calls_finish(finish_reason)

    # ---- a streamed reply --------------------------------------------------------------------

    async def stream(self, chunks: AsyncIterator[dict]) -> AsyncIterator[dict]:
        """The chunks of deltas, with each choice's calls taken out of its text into ``tool_calls``."""
        detectors: dict[int, BaseFormatDetector] = {}
        called: set[int] = set()  # the choices that made a call
        async for chunk in chunks:
            index = chunk.get("index", 0)
            detector = detectors.setdefault(index, self._detector())
            result = detector.parse_streaming_increment(chunk["text"], self.tools)
            # A call's name and its argument pieces share its tool_index; without parallel calls, only the first's.
            calls = [c for c in result.calls if self.parallel or c.tool_index == 0]
            if calls:
                called.add(index)
            meta, text = chunk["meta_info"], result.normal_text
            if meta["finish_reason"] is not None:
                text += detector.flush()
                if index in called:
                    meta = {**meta, "finish_reason": _tool_calls_finish(meta["finish_reason"])}
            yield {**chunk, "text": text, "meta_info": meta, "tool_calls": [_tool_call(c) for c in calls]}


def _tool_call(item: ToolCallItem) -> ToolCall:
    """A call, or in a stream one delta of it: the id and name go with a call's first delta; the
    next carry its index and an arguments piece (id and name null, as SGLang sends them)."""
    if item.name is None:
        return ToolCall(index=item.tool_index, function=FunctionResponse(arguments=item.parameters))
    return ToolCall(
        id=f"call_{uuid.uuid4().hex[:24]}",  # SGLang's id format
        index=item.tool_index,
        function=FunctionResponse(name=item.name, arguments=item.parameters),
    )


def _tool_calls_finish(finish_reason: dict) -> dict:
    # Only a reply that ended by itself becomes "tool_calls"; one cut by max_tokens stays "length".
    if finish_reason["type"] == "stop":
        return {"type": "tool_calls", "matched": None}
    return finish_reason
