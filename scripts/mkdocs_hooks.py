"""mkdocs hooks for the minisgl book (listed under `hooks:` in mkdocs.yml).

Two jobs.

1. Fill the concordance page. Each chapter ends with a concordance table
   (header `| minisgl | SGLang at 64bca53 | ... |`); `docs/concordance.md` holds the
   marker `<!-- concordance:generated -->`, which this hook replaces with every
   chapter's rows, grouped by chapter and then sorted by SGLang file. The page can
   therefore never disagree with the chapters, and tests/test_docs_sglang.py checks the
   chapters' rows against the SGLang index.
2. Make references clickable. An inline code span that is a whole SGLang reference
   (`python/sglang/srt/<file>.py:<line>`, a file, or a folder) links to that place on
   GitHub at the pinned commit, read from docs/reference/sglang-index-64bca53.json. A span
   that names a file or folder of this repository (`minisgl/...`, `tests/...`, `scripts/...`,
   `traces/...`, `benchmarks/...`, with `:line` or `::Symbol` after it or not) links to a
   plain page of that file with numbered lines, written into the site under `source/`, so
   the book needs no repository host and works offline.
"""

from __future__ import annotations

import ast
import functools
import html
import json
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


# ---------------------------------------------------------------------------------------
# Links
# ---------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
SGLANG_INDEX = REPO / "docs" / "reference" / "sglang-index-64bca53.json"
SGLANG_BLOB = "https://github.com/sgl-project/sglang/blob/{commit}/python/sglang/srt/{path}"
SGLANG_TREE = "https://github.com/sgl-project/sglang/tree/{commit}/python/sglang/srt/{path}"
SOURCE_DIR = "source"  # in the built site
_LINKABLE_ROOTS = ("minisgl", "tests", "scripts", "traces", "benchmarks", "notebooks")
_CODE = re.compile(r"(?<!\">)<code>([^<]+)</code>")
_R_SGLANG_REF = re.compile(r"^python/sglang/srt/(?:([\w/]+\.py)(?::(\d+)(?:-(\d+))?)?|((?:\w+/)*))$")
_R_REPO_REF = re.compile(
    r"^((?:%s)(?:/[\w.-]+)*)(/?)(?:::([\w.]+)(?:\(\))?|:(\d+)(?:-(\d+))?)?$" % "|".join(_LINKABLE_ROOTS)
)
_TEXT_SUFFIXES = {".py", ".md", ".txt", ".sh", ".jsonl", ".json", ".toml", ".cpp", ".h", ".yml", ".ipynb"}
_linked: set[str] = set()


@functools.lru_cache(maxsize=1)
def sglang_commit() -> str:
    return json.loads(SGLANG_INDEX.read_text(encoding="utf-8"))["commit"]


@functools.lru_cache(maxsize=None)
def _symbol_line(rel: str, symbol: str) -> int | None:
    """Line of `f`, `Class` or `Class.member` defined in a repository Python file."""
    tree = ast.parse((REPO / rel).read_text(encoding="utf-8"))
    head, _, member = symbol.partition(".")
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == head:
            if not member:
                return node.lineno
            for item in getattr(node, "body", []):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == member:
                    return item.lineno
            return node.lineno
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and not member:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == head for t in targets):
                return node.lineno
    return None


def sglang_url(text: str) -> str | None:
    m = _R_SGLANG_REF.match(text)
    if not m:
        return None
    path, first, last, folder = m.groups()
    if folder is not None:
        return SGLANG_TREE.format(commit=sglang_commit(), path=folder)
    url = SGLANG_BLOB.format(commit=sglang_commit(), path=path)
    if first:
        url += f"#L{first}" + (f"-L{last}" if last else "")
    return url


def repo_target(text: str) -> str | None:
    """`source/<path>.html#L<n>` for a span naming a file or folder of this repository."""
    m = _R_REPO_REF.match(text)
    if not m:
        return None
    path, slash, symbol, first, last = m.groups()
    target = REPO / path
    if target.is_dir():
        _linked.add(path + "/")
        return f"{SOURCE_DIR}/{path}/index.html"
    if slash or not target.is_file():
        return None
    _linked.add(path)
    anchor = ""
    if symbol and path.endswith(".py"):
        line = _symbol_line(path, symbol)
        anchor = f"#L{line}" if line else ""
    elif first:
        anchor = f"#L{first}"
    return f"{SOURCE_DIR}/{path}.html{anchor}"


def link_code_spans(content: str, page_url: str) -> str:
    up = "../" * page_url.count("/")

    def link(m: re.Match) -> str:
        text = html.unescape(m.group(1)).strip()
        url = sglang_url(text)
        if url is None:
            local = repo_target(text)
            url = up + local if local else None
        return f'<a href="{html.escape(url)}">{m.group(0)}</a>' if url else m.group(0)

    # Only prose: code inside <pre> blocks is left alone.
    parts = re.split(r"(<pre[\s>].*?</pre>)", content, flags=re.S)
    return "".join(p if p.startswith("<pre") else _CODE.sub(link, p) for p in parts)


def on_page_content(html_text, page, config, files):
    return link_code_spans(html_text, page.url)


_SOURCE_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px/1.45 monospace; margin: 0; }}
header {{ font-family: sans-serif; padding: .6em 1em; background: #3f51b5; color: #fff; }}
header a {{ color: #fff; }}
pre {{ margin: 0; padding: .5em 0; }}
pre a.n {{ display: inline-block; width: 5ch; text-align: right; margin-right: 1.5ch; color: #999;
  text-decoration: none; user-select: none; }}
pre span:target {{ background: #fff3b0; }}
ul {{ font-family: sans-serif; }}
</style></head><body>
<header><a href="{home}">minisgl book</a> · <b>{title}</b></header>
{body}
</body></html>
"""


def _source_page(rel: str, depth: int) -> str:
    home = "../" * depth + "index.html"
    if rel.endswith("/"):
        folder = REPO / rel
        items = sorted(
            p
            for p in folder.iterdir()
            if not p.name.startswith((".", "__")) and (p.is_dir() or p.suffix in _TEXT_SUFFIXES)
        )
        rows = []
        for p in items:
            name = p.name + ("/" if p.is_dir() else "")
            href = f"{p.name}/index.html" if p.is_dir() else f"{p.name}.html"
            rows.append(f'<li><a href="{href}">{html.escape(name)}</a></li>')
            _linked.add(f"{rel}{name}")
        return _SOURCE_PAGE.format(title=html.escape(rel), home=home, body="<ul>" + "".join(rows) + "</ul>")
    lines = (REPO / rel).read_text(encoding="utf-8", errors="replace").splitlines()
    body = "\n".join(
        f'<span id="L{n}"><a class="n" href="#L{n}">{n}</a>{html.escape(line)}</span>'
        for n, line in enumerate(lines, 1)
    )
    return _SOURCE_PAGE.format(title=html.escape(rel), home=home, body=f"<pre>{body}</pre>")


def on_post_build(config):
    site = Path(config["site_dir"]) / SOURCE_DIR
    done: set[str] = set()
    while _linked - done:  # a folder page links its entries, which then get pages too
        rel = sorted(_linked - done)[0]
        done.add(rel)
        out = site / (rel + "index.html" if rel.endswith("/") else rel + ".html")
        if not rel.endswith("/") and not (REPO / rel).is_file():
            continue
        if not rel.endswith("/") and (REPO / rel).stat().st_size > 2_000_000:
            continue  # large data files are not worth a page
        out.parent.mkdir(parents=True, exist_ok=True)
        depth = (SOURCE_DIR + "/" + rel.rstrip("/")).count("/") + (1 if rel.endswith("/") else 0)
        out.write_text(_source_page(rel, depth), encoding="utf-8")
    _linked.clear()


def on_pre_build(config):
    _linked.clear()  # `mkdocs serve` rebuilds in the same process
