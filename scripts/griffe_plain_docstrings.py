"""A griffe extension for the API reference: read minisgl's docstrings as plain text.

minisgl's docstrings are written for a terminal, not for Markdown: `__init__` would
render as a bold "init", and `_handle_*` as italics. This extension wraps every
whitespace-separated word that contains an underscore (identifiers, file paths) in
backticks before mkdocstrings renders the docstring, and leaves existing code spans
and indented code blocks alone. Listed under the python handler's `extensions` in
mkdocs.yml.
"""

from __future__ import annotations

import re

import griffe

_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# A word with an underscore, without the punctuation that usually follows a word.
_UNDERSCORE_WORD = re.compile(r"(?<![\w`*])([\w./*\[\]-]*_[\w./*\[\]-]*?(?:\(\))?)(?=[,;:.)]*(?:\s|$))")


def _plain(line: str) -> str:
    if line.startswith("    ") or not line.strip():
        return line  # an indented block (already code) or a blank line
    out, last = [], 0
    for m in _CODE_SPAN.finditer(line):
        out.append(_UNDERSCORE_WORD.sub(r"`\1`", line[last : m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(_UNDERSCORE_WORD.sub(r"`\1`", line[last:]))
    return "".join(out)


class PlainDocstrings(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = "\n".join(_plain(line) for line in obj.docstring.value.split("\n"))
