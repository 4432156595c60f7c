"""The two editions have the same shape: no page abridged, no section only in one language.

For every English page with a Chinese twin (page.md and page.zh.md), in both directions:

- headings: the same levels in the same order, each Chinese heading carrying the English
  heading's anchor (`{#id}`, so a link to page.md#id lands in either edition);
- tables: as many, each with the same number of columns and rows;
- code blocks: the same languages in the same order; a block that is not a diagram (bash,
  python, json...) is identical, a Mermaid diagram has as many lines (its labels may be
  translated);
- figures: the same images in the same order.

A section may exist in one edition only when it is about that edition's language
(ONE_EDITION below); it is dropped before comparing.
"""

from __future__ import annotations

import re

import pytest
from markdown.extensions.toc import slugify

from tests.docs_markdown import DOCS, PAGES, english_page, load

# (page, anchor): sections about one edition's own language, with everything under them.
ONE_EDITION = {("glossary.zh.md", "chinese-only-terms")}
PAIRS = [p for p in PAGES if p.endswith(".zh.md") and english_page(p) in PAGES]
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*(?:\{#([\w-]+)\})?\s*$")
_FIGURE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)")
_TRANSLATED_BLOCKS = {"mermaid"}  # diagrams whose labels a translation may change


def _shape(path: str) -> dict:
    page = load(path)
    headings, figures, dropped_below = [], [], None
    keep = [True] * len(page.prose)
    for i, line in enumerate(page.prose):
        m = _HEADING.match(line)
        if m:
            level, text, anchor = len(m.group(1)), m.group(2), m.group(3) or slugify(m.group(2), "-")
            if dropped_below is not None and level > dropped_below:
                keep[i] = False
                continue
            dropped_below = level if (path, anchor) in ONE_EDITION else None
            if dropped_below is None:
                headings.append((level, anchor, i + 1, text))
        if dropped_below is not None:
            keep[i] = False
            continue
        figures += [(target, i + 1) for target in _FIGURE.findall(line)]
    tables = [(len(rows), len(rows[0][1]), start) for start, rows in page.tables() if keep[start - 1]]
    blocks = [
        (b.lang, len(b.body) if b.lang in _TRANSLATED_BLOCKS else "\n".join(b.body), b.line)
        for b in page.blocks
        if keep[b.line - 1]
    ]
    return {"headings": headings, "tables": tables, "blocks": blocks, "figures": figures}


def _compare(kind: str, english: list, chinese: list, key, en_path: str, zh_path: str) -> list[str]:
    """Problems where the two sequences differ, named by the first place they part."""
    a, b = [key(x) for x in english], [key(x) for x in chinese]
    if a == b:
        return []
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    where_en = f"{en_path}:{english[i][-2 if kind == 'headings' else -1]}" if i < len(english) else f"{en_path}: end"
    where_zh = f"{zh_path}:{chinese[i][-2 if kind == 'headings' else -1]}" if i < len(chinese) else f"{zh_path}: end"
    first_en = a[i] if i < len(a) else "nothing"
    first_zh = b[i] if i < len(b) else "nothing"
    return [
        f"{kind}: {len(a)} in English, {len(b)} in Chinese; they part at item {i + 1}: "
        f"{str(first_en)[:80]!r} ({where_en}) vs {str(first_zh)[:80]!r} ({where_zh})"
    ]


@pytest.mark.parametrize("zh_path", PAIRS)
def test_editions_have_the_same_shape(zh_path):
    en_path = english_page(zh_path)
    en, zh = _shape(en_path), _shape(zh_path)
    problems = _compare("headings", en["headings"], zh["headings"], lambda h: h[:2], en_path, zh_path)
    problems += _compare("tables", en["tables"], zh["tables"], lambda t: t[:2], en_path, zh_path)
    problems += _compare("code blocks", en["blocks"], zh["blocks"], lambda b: b[:2], en_path, zh_path)
    problems += _compare("figures", en["figures"], zh["figures"], lambda f: f[0], en_path, zh_path)
    assert not problems, f"{zh_path} and {en_path} differ in shape:\n" + "\n".join(problems)


def test_every_page_has_both_editions():
    english = [p for p in PAGES if not p.endswith(".zh.md")]
    missing = [p for p in english if p.replace(".md", ".zh.md") not in PAGES]
    assert not missing, f"pages with no Chinese edition: {missing}"


def test_one_edition_sections_exist():
    """Each exception still names a real section, so the list cannot outlive its reason."""
    for path, anchor in ONE_EDITION:
        text = (DOCS / path).read_text(encoding="utf-8")
        assert f"{{#{anchor}}}" in text, f"{path} has no section #{anchor}: drop it from ONE_EDITION"
