"""Docs that cannot rot, SGLang's side: every ``python/sglang/srt/<path>:<line>`` reference in docs/
and every row of a chapter's concordance table resolves against the SGLang index that ships in
docs/reference/ (scripts/make_sglang_index.py writes it from an SGLang checkout at the pinned commit).
The minisgl side of the same pages is test_docs.py's."""

from __future__ import annotations

import functools
import json
import re

import pytest

from tests.docs_markdown import CHAPTERS, DOCS, PAGES, load, span_texts

SGLANG_INDEX = DOCS / "reference" / "sglang-index-64bca53.json"  # made by scripts/make_sglang_index.py

_R_SGLANG = re.compile(r"python/sglang/srt/([\w/]+\.py)(?::(\d+))?")
_R_SGLANG_DIR = re.compile(r"^python/sglang/srt/([\w/]+)/$")


@functools.lru_cache(maxsize=None)
def sglang_index() -> dict[str, dict[int, set[str]]]:
    """file -> {line: names}: definitions, the calls of the key methods, and the runner reads and calls listed."""
    data = json.loads(SGLANG_INDEX.read_text(encoding="utf-8"))
    files: dict[str, dict[int, set[str]]] = {}
    for rel, entry in data["files"].items():
        lines = files.setdefault(rel, {})
        calls = [c for method in entry.get("calls", {}).values() for c in method]
        facts = entry["defs"] + calls + entry.get("reads", []) + entry.get("forward_calls", [])
        for line, name in facts:
            lines.setdefault(line, set()).update({name, name.removeprefix("self.")})
    return files


@pytest.mark.parametrize("path", PAGES)
def test_sglang_references_are_in_the_index(path):
    index = sglang_index()
    problems = []
    for span in load(path).spans:
        where = f"{path}:{span.line}: `{span.text}`"
        m = _R_SGLANG_DIR.match(span.text)
        if m and not any(f.startswith(m.group(1) + "/") for f in index):
            problems.append(f"{where}: no indexed SGLang file under this folder")
        for m in _R_SGLANG.finditer(span.text):
            rel, line = m.group(1), m.group(2)
            if rel not in index:
                problems.append(f"{where}: {rel} is not in the SGLang index at 64bca53")
            elif line and int(line) not in index[rel]:
                problems.append(f"{where}: line {line} of {rel} is not a line the index lists")
    assert not problems, "\n".join(problems)


def concordance_tables(path: str):
    for _, rows in load(path).tables():
        header = rows[0][1]
        if len(header) >= 2 and header[0] == "minisgl" and header[1].startswith("SGLang"):
            yield rows[1:]


@pytest.mark.parametrize("path", CHAPTERS)
def test_chapter_concordance_rows(path):
    index = sglang_index()
    tables = list(concordance_tables(path))
    assert tables, f"{path} has no concordance table (| minisgl | SGLang at 64bca53 | ... |)"
    problems = []
    for rows in tables:
        for line, cells in rows:
            where = f"{path}:{line}"
            minisgl = [t for t in span_texts(cells[0]) if t.startswith("minisgl/")]
            if not minisgl:
                problems.append(f"{where}: the minisgl cell names no minisgl/ file")
            spans = span_texts(cells[1])
            refs = [s for s in spans if _R_SGLANG.fullmatch(s) and ":" in s]
            if len(refs) != 1:
                problems.append(f"{where}: the SGLang cell needs exactly one `python/sglang/srt/<file>:<line>`")
                continue
            rel, lineno = _R_SGLANG.fullmatch(refs[0]).groups()
            names = index.get(rel, {}).get(int(lineno), set())
            for symbol in [s for s in spans if s != refs[0]]:
                if names and symbol not in names:
                    problems.append(f"{where}: the index has {sorted(names)} at {rel}:{lineno}, not {symbol!r}")
    assert not problems, "\n".join(problems)


def test_concordance_page_is_generated():
    text = (DOCS / "concordance.md").read_text(encoding="utf-8")
    assert "<!-- concordance:generated -->" in text, "concordance.md lost the marker the mkdocs hook fills"
    assert not list(concordance_tables("concordance.md")), "concordance.md must not hold tables by hand"
