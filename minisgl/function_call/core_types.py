"""What a detector returns: SGLang's function_call/core_types.py (ToolCallItem, StreamingParseResult)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ToolCallItem:
    """One call: its position among this response's calls, the function, its arguments as a JSON string."""

    tool_index: int
    name: str
    parameters: str


@dataclasses.dataclass
class StreamingParseResult:
    """The text meant for the user, and the calls found (in one go, or new since the last chunk)."""

    normal_text: str = ""
    calls: list[ToolCallItem] = dataclasses.field(default_factory=list)
