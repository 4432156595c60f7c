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

from markdown.extensions.toc import slugify

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


# The Chinese edition (mkdocs-static-i18n builds it after the English one) gets the same page
# from `concordance.zh.md`: each chapter's rows come from its `.zh.md` where one exists, and the
# headings and chapter titles are the Chinese ones. These are the generated page's own words.
_LABELS = {
    "en": {
        "by_chapter": "By chapter",
        "by_file": "By SGLang file",
        "by_file_intro": "Read this table from the right if you arrive from SGLang with a file open.",
        "sglang": "SGLang at 64bca53",
        "compare": "What to compare",
        "chapter": "Chapter",
    },
    "zh": {
        "by_chapter": "按章节",
        "by_file": "按 SGLang 文件",
        "by_file_intro": "如果你是从 SGLang 那边拿着一个打开的文件过来的，从右往左读这张表。",
        "sglang": "SGLang（64bca53）",
        "compare": "对照要点",
        "chapter": "章节",
    },
}


def _nav_translations(config, locale: str) -> dict[str, str]:
    plugin = config["plugins"].get("i18n")
    for language in plugin.config.languages if plugin else []:
        if language.locale == locale:
            return language.nav_translations or {}
    return {}


def _anchor(english_heading: str, locale: str) -> str:
    """A translated heading keeps the English heading's anchor, so links work in both editions."""
    return "" if locale == "en" else f" {{#{slugify(english_heading, '-')}}}"


def _render(config, locale: str = "en") -> str:
    docs = Path(config["docs_dir"])
    words = _LABELS[locale]
    titles = _nav_translations(config, locale) if locale != "en" else {}
    by_chapter: list[str] = []
    by_file: list[tuple[str, int, str, str, str]] = []
    for english_title, rel in _chapters(config):
        source = docs / rel
        localized = source.with_suffix(f".{locale}.md")
        if locale != "en" and localized.is_file():
            source = localized
        title = titles.get(english_title, english_title)
        rows = concordance_rows(source.read_text(encoding="utf-8"))
        if not rows:
            continue
        by_chapter.append(f"### [{title}]({rel}){_anchor(english_title, locale)}\n")
        by_chapter.append(f"| minisgl | {words['sglang']} | {words['compare']} |")
        by_chapter.append("|---|---|---|")
        for row in rows:
            minisgl, sglang, note = (row + ["", "", ""])[:3]
            by_chapter.append(f"| {minisgl} | {sglang} | {note} |")
            m = _SGLANG_REF.search(sglang)
            if m:
                short = re.split(r" —+ ", title)[0]
                by_file.append((m.group(1), int(m.group(2)), sglang, minisgl, f"[{short}]({rel})"))
        by_chapter.append("")
    lines = [
        f"## {words['by_chapter']}{_anchor(_LABELS['en']['by_chapter'], locale)}\n",
        *by_chapter,
        f"## {words['by_file']}{_anchor(_LABELS['en']['by_file'], locale)}\n",
    ]
    lines.append(f"{words['by_file_intro']}\n")
    lines.append(f"| {words['sglang']} | minisgl | {words['chapter']} |")
    lines.append("|---|---|---|")
    for _, _, sglang, minisgl, chapter in sorted(by_file):
        lines.append(f"| {sglang} | {minisgl} | {chapter} |")
    return "\n".join(lines) + "\n"


# In the Chinese edition's pages a line break inside Chinese text is removed: Markdown turns it
# into a space, which Chinese does not have (Chromium keeps it), so the translations may wrap
# their source lines like the English pages. Han characters, and the CJK and full-width
# punctuation that carries its own spacing:
_HAN = "\u3400-\u4dbf\u4e00-\u9fff"
_CJK_PUNCT = "\u3000-\u303f\uff00-\uffef"
_ENDS_HAN = re.compile(rf"[{_HAN}]$")
_ENDS_PUNCT = re.compile(rf"[{_CJK_PUNCT}]$")
_STARTS_HAN = re.compile(rf"^[ \t]*[\[*_]*[{_HAN}{_CJK_PUNCT}]")
# Lines that open a block of their own (a list item, a table row, a heading, ...): never joined.
_BLOCK_START = re.compile(r"^[ \t]*(?:[-*+] |\d+\. |\||#|>|:[ \t]|!!!|```|~~~|<|$)")
_ANY_FENCE = re.compile(r"^[ \t]*(```|~~~)")


def join_cjk_lines(markdown: str) -> str:
    """Join a paragraph's wrapped lines where the break falls inside Chinese text.

    A break is removed after full-width punctuation, and between two Han characters (a link or
    emphasis may open the next line). Code blocks, headings and block starts are left alone.
    """
    out: list[str] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        m = _ANY_FENCE.match(line)
        if m and fence is None:
            fence = m.group(1)
        elif m and m.group(1) == fence:
            fence = None
        elif (
            fence is None
            and out
            and not _BLOCK_START.match(line)
            and not out[-1].lstrip().startswith(("#", "|"))
            and (_ENDS_PUNCT.search(out[-1]) or (_ENDS_HAN.search(out[-1]) and _STARTS_HAN.match(line)))
        ):
            out[-1] += line.lstrip()
            continue
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.endswith(".zh.md"):
        markdown = join_cjk_lines(markdown)
    if page.file.src_uri in ("concordance.md", "concordance.zh.md") and MARKER in markdown:
        locale = "zh" if page.file.src_uri.endswith(".zh.md") else "en"
        return markdown.replace(MARKER, _render(config, locale))
    return markdown
