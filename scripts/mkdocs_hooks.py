"""mkdocs hooks for the minisgl book (listed under `hooks:` in mkdocs.yml).

Two jobs.

1. Fill the concordance page. Each chapter ends with a concordance table
   (header `| minisgl | SGLang at 64bca53 | ... |`); `docs/concordance.md` holds the
   marker `<!-- concordance:generated -->`, which this hook replaces with every
   chapter's rows, grouped by chapter and then sorted by SGLang file. The page can
   therefore never disagree with the chapters, and tests/test_docs.py checks the
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
