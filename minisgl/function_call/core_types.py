"""What a detector returns: SGLang's function_call/core_types.py (ToolCallItem, StreamingParseResult)."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass
class ToolCallItem:
    """One call: its position among this response's calls, the function, its arguments as a JSON
    string. Streamed, a call's first item has its name and empty arguments; the next have no
    name and the arguments' next piece."""

    tool_index: int
    name: Optional[str]
    parameters: str


@dataclasses.dataclass
class StreamingParseResult:
    """The text meant for the user, and the calls found (in one go, or new since the last chunk)."""

    normal_text: str = ""
    calls: list[ToolCallItem] = dataclasses.field(default_factory=list)
