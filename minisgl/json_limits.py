"""How deeply a JSON text nests, measured without parsing it.

Python's json module and xgrammar's schema converter recurse once per level, so a body of
``[`` x 5,000 (or a schema nested 500 deep) ends in a RecursionError far from the input
that caused it. Both front doors (the HTTP body, a request's json_schema) measure the depth
first and refuse a text deeper than their limit with a message naming it. SGLang has no
such check; its server answers such a body with a 500.
"""

from __future__ import annotations

import re
from itertools import accumulate

# Strings first (a bracket inside one does not nest), then runs of brackets.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_BRACKETS = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (0 for a scalar). Not a validator:
    on malformed JSON it still returns a number, and the parser then gives the real error."""
    stripped = _STRING.sub('""', text)
    steps = (_BRACKET_STEP[m] for m in _BRACKETS.findall(stripped))
    return max(accumulate(steps, initial=0))
