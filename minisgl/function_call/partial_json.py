"""partial_json_loads: what a JSON object cut off mid-stream already says for certain.

SGLang reads a call in progress with the ``partial_json_parser`` package
(python/sglang/srt/function_call/utils.py:_partial_json_loads, with its ``Allow`` flags).
minisgl does the same job in one pass of its own: walk the text, remember the last place
where cutting it and closing what is open gives valid JSON, and parse that. What counts as
certain, so that what is sent is never taken back:

- a complete value; an object or array so far (``{"a": 1`` reads as ``{"a": 1}``);
- a string value so far, when ``partial_strings`` (``"Par`` reads as ``"Par"``), cut before
  an escape that is not finished; never a key on its own, or a key without its value;
- a number or ``true``/``false``/``null`` only once something follows it: ``12`` may
  still become ``123`` or ``12e-1``.
"""

from __future__ import annotations

import json
from typing import Any, Optional

_DECODER = json.JSONDecoder(strict=False)  # a raw control character in a string, as decode_json_sequence
_TOKEN_CHARS = set("0123456789+-.eEtrufalsn")


def partial_json_loads(text: str, partial_strings: bool = True) -> tuple[Any, Optional[int]]:
    """(the value ``text`` begins with, as far as it is certain, or None; where it ends if it is complete).

    ``text`` starts at the value's first character (a ``{`` for a call)."""
    stack: list[str] = []  # the closers of the open containers, innermost last
    expect_key: list[bool] = []  # per open container: an object waiting for a key (not a value)
    safe, safe_closers = 0, None  # the last cut that closes to valid JSON, and what closes it
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "{[":
            stack.append("}" if c == "{" else "]")
            expect_key.append(c == "{")
            i += 1
            safe, safe_closers = i, "".join(reversed(stack))
        elif c in "}]":
            if not stack or stack[-1] != c:
                break  # not JSON: keep what was certain before
            stack.pop()
            expect_key.pop()
            i += 1
            if not stack:
                return _decode(text[:i]), i
            safe, safe_closers = i, "".join(reversed(stack))
        elif c == '"':
            end, last_whole = _string_end(text, i)
            is_key = bool(expect_key) and expect_key[-1]
            if end is None:  # the string is cut off
                if partial_strings and not is_key:
                    safe, safe_closers = last_whole, '"' + "".join(reversed(stack))
                break
            i = end
            if not is_key:
                safe, safe_closers = i, "".join(reversed(stack))
            else:
                expect_key[-1] = False  # the key read; its value comes next
        elif c == ",":
            if expect_key and stack[-1] == "}":
                expect_key[-1] = True
            i += 1
        elif c in _TOKEN_CHARS:
            j = i
            while j < n and text[j] in _TOKEN_CHARS:
                j += 1
            if j == n:
                break  # a number or literal that may go on
            i = j
            safe, safe_closers = i, "".join(reversed(stack))
        else:  # ':' and white space
            i += 1
    return (None if safe_closers is None else _decode(text[:safe] + safe_closers)), None


def _string_end(text: str, start: int) -> tuple[Optional[int], int]:
    """(the index after the string opened at ``start``, or None if it is cut off; the end of its
    last whole character, so that a cut there never splits an escape like ``\\u00e9`` or a
    surrogate pair)."""
    i, n = start + 1, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return i + 1, i
        if c == "\\":
            width = 6 if text.startswith("u", i + 1) else 2
            if width == 6 and text[i + 2 : i + 4].lower() in ("d8", "d9", "da", "db"):
                width = 12  # a high surrogate: one character with the low one that follows
            if i + width > n:
                return None, i
            i += width
        else:
            i += 1
    return None, i


def _decode(candidate: str) -> Any:
    """The value, or None where the text is not JSON after all (a call then reads as nothing)."""
    try:
        return _DECODER.decode(candidate)
    except json.JSONDecodeError:
        return None


def common_prefix(a: str, b: str) -> str:
    """SGLang's _find_common_prefix: what two readings of a call in progress agree on."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
