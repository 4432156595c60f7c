"""How the docs tests read docs/ (test_docs.py, test_docs_parity.py): each page's prose with its
fenced code blocks blanked out, the blocks themselves, the inline code spans and the pipe tables."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

# Every page of both editions: the Chinese page.zh.md beside page.md is checked like the English one.
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
CHAPTERS = [p for p in PAGES if p.startswith("chapters/")]
TRANSLATED = re.compile(r"\.zh\.md$")


def english_page(path: str) -> str:
    """The English page a page translates (itself for an English page)."""
    return TRANSLATED.sub(".md", path)


_FENCE_OPEN = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
BEING_BUILT = "(being built)"


@dataclass
class Span:
    line: int  # 1-based
    text: str
    after: str  # the rest of the line after the span
    full: str  # the whole line


@dataclass
class Block:
    line: int  # line of the opening fence
    info: str  # what follows the fence: language and attributes
    body: list[str]

    @property
    def lang(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""


@dataclass
class Page:
    path: str
    prose: list[str]  # the page's lines, fenced blocks blanked out
    blocks: list[Block] = field(default_factory=list)

    @functools.cached_property
    def spans(self) -> list[Span]:
        out = []
        for i, line in enumerate(self.prose, 1):
            following = self.prose[i] if i < len(self.prose) else ""
            for m in SPAN.finditer(line):
                # A marker may wrap onto the next line: "... `path`\n*(being built)* ...".
                after = line[m.end() :] if line[m.end() :].strip() else following
                out.append(Span(i, m.group(2).strip(), after, line))
        return out

    def tables(self) -> list[tuple[int, list[list[str]]]]:
        """(first line, rows) of each pipe table; rows[0] is the header, the divider dropped."""
        out, current, start = [], [], 0
        for i, line in enumerate(self.prose + [""], 1):
            if line.lstrip().startswith("|"):
                if not current:
                    start = i
                current.append((i, line))
                continue
            if len(current) >= 2:
                rows = [_cells(text) for _, text in current]
                lines = [n for n, _ in current]
                out.append((start, [(lines[0], rows[0])] + list(zip(lines[2:], rows[2:]))))
            current = []
        return out


def _cells(line: str) -> list[str]:
    # Split on pipes outside code spans.
    masked = SPAN.sub(lambda m: m.group(0).replace("|", "\0"), line.strip())
    return [c.replace("\0", "|").strip() for c in masked.strip("|").split("|")]


@functools.lru_cache(maxsize=None)
def load(path: str) -> Page:
    prose, blocks, fence, block = [], [], None, None
    for i, line in enumerate((DOCS / path).read_text(encoding="utf-8").splitlines(), 1):
        if fence is None:
            m = _FENCE_OPEN.match(line)
            if m:
                fence = m.group(2)
                block = Block(i, m.group(3).strip(), [])
                prose.append("")
                continue
            prose.append(line)
        else:
            stripped = line.strip()
            if stripped.startswith(fence[0] * len(fence)) and set(stripped) == {fence[0]}:
                blocks.append(block)
                fence = None
            else:
                block.body.append(line)
            prose.append("")
    assert fence is None, f"{path}: unclosed code fence opened at line {block.line}"
    return Page(path, prose, blocks)


def span_texts(cell: str) -> list[str]:
    return [m.group(2).strip() for m in SPAN.finditer(cell)]
