"""mkdocs hooks for the minisgl book (listed under `hooks:` in mkdocs.yml).

One job: fill the concordance page. Each chapter ends with a concordance table
(header `| minisgl | SGLang at 64bca53 | ... |`); `docs/concordance.md` holds the
marker `<!-- concordance:generated -->`, which this hook replaces with every
chapter's rows, grouped by chapter and then sorted by SGLang file. The page can
therefore never disagree with the chapters, and tests/test_docs.py checks the
chapters' rows against the SGLang index.
"""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "<!-- concordance:generated -->"
_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
_SGLANG_REF = re.compile(r"python/sglang/srt/([\w/]+\.py):(\d+)")


def _split_row(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def concordance_rows(markdown: str) -> list[list[str]]:
    """The body rows of every concordance table in a page (code fences ignored)."""
    lines = _FENCE.sub("", markdown).splitlines()
    rows: list[list[str]] = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            continue
        header = _split_row(line)
        if len(header) < 2 or header[0] != "minisgl" or not header[1].startswith("SGLang"):
            continue
        if i > 0 and lines[i - 1].lstrip().startswith("|"):
            continue  # a row that merely looks like a header, inside another table
        for body in lines[i + 2 :]:
            if not body.lstrip().startswith("|"):
                break
            rows.append(_split_row(body))
    return rows


def _chapters(config) -> list[tuple[str, str]]:
    """(title, path relative to docs/) of the chapters, in nav order."""
    out: list[tuple[str, str]] = []

    def walk(items):
        for item in items:
            if isinstance(item, dict):
                for title, value in item.items():
                    if isinstance(value, list):
                        walk(value)
                    elif isinstance(value, str) and value.startswith("chapters/"):
                        out.append((title, value))

    walk(config["nav"] or [])
    return out


def _render(config) -> str:
    docs = Path(config["docs_dir"])
    by_chapter: list[str] = []
    by_file: list[tuple[str, int, str, str, str]] = []
    for title, rel in _chapters(config):
        rows = concordance_rows((docs / rel).read_text(encoding="utf-8"))
        if not rows:
            continue
        by_chapter.append(f"### [{title}]({rel})\n")
        by_chapter.append("| minisgl | SGLang at 64bca53 | What to compare |")
        by_chapter.append("|---|---|---|")
        for row in rows:
            minisgl, sglang, note = (row + ["", "", ""])[:3]
            by_chapter.append(f"| {minisgl} | {sglang} | {note} |")
            m = _SGLANG_REF.search(sglang)
            if m:
                by_file.append((m.group(1), int(m.group(2)), sglang, minisgl, f"[{title.split(' — ')[0]}]({rel})"))
        by_chapter.append("")
    lines = ["## By chapter\n", *by_chapter, "## By SGLang file\n"]
    lines.append("Read this table from the right if you arrive from SGLang with a file open.\n")
    lines.append("| SGLang at 64bca53 | minisgl | Chapter |")
    lines.append("|---|---|---|")
    for _, _, sglang, minisgl, chapter in sorted(by_file):
        lines.append(f"| {sglang} | {minisgl} | {chapter} |")
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "concordance.md" and MARKER in markdown:
        return markdown.replace(MARKER, _render(config))
    return markdown
