"""Docs that cannot rot: every reference in docs/ resolves against the current tree.

Fast and browser-free. It reads the Markdown under docs/ (tests/docs_markdown.py) and checks,
against the source (parsed with ``ast``, never imported: tests/docs_source.py) and the tests/ folder:

- code references in inline code spans: ``minisgl/x.py``, ``minisgl/x.py::Class.member``,
  ``minisgl/x.py:12``, ``minisgl/dir/``, ``minisgl.module``, ``python -m minisgl.module``,
  ``tests/...py``, ``scripts/...``, and short ``Class.member`` where Class is a minisgl class;
- ``*(being built)*`` markers, both ways (missing code must be marked, marked code must be missing);
- claim tables: a cited claim has a tests/test_c<N>_*.py file, or says "planned" and has none;
- imports in Python code blocks, ``python -m`` in shell code blocks, relative links,
  the API page's mkdocstrings targets, and quoted golden-trace excerpts.

SGLang references and the concordance tables are test_docs_sglang.py's. The conventions are
documented for writers in docs/contributing.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs_markdown import (
    BEING_BUILT,
    CHAPTERS,
    DOCS,
    PAGES,
    REPO,
    SPAN,
    TRANSLATED,
    Page,
    Span,
    english_page,
    load,
    span_texts,
)
from tests.docs_source import all_classes, class_has, module_file, module_info, resolve_symbol

CLAIMS = range(1, 13)
# The claims table's first and last header cells, in each edition.
CLAIM_HEADERS = {("Claim", "Test"), ("论断", "测试")}


# ---------------------------------------------------------------------------------------
# Reference rules for one inline code span
# ---------------------------------------------------------------------------------------

_R_FILE = re.compile(r"^(minisgl/[\w/]+\.py)(?:::([\w.]+)(?:\(\))?|:(\d+)(?:-(\d+))?)?$")
_R_DIR = re.compile(r"^(minisgl(?:/\w+)*)/$")
_R_MODULE = re.compile(r"^(?:python -m )?(minisgl(?:\.\w+)+)$")
_R_SHORT = re.compile(r"^([A-Z]\w*)\.(\w+)(?:\(.*\))?$")
_R_REPO_FILE = re.compile(r"(?:^|\s)((?:tests|scripts)/[\w/.-]+\.(?:py|sh|txt|jsonl))(?:::(\w+))?(?=\s|$)")
_R_PY_M = re.compile(r"python -m (minisgl[\w.]*)")
_R_CLAIM_TEST = re.compile(r"^tests/test_(?:c\d+_)+\w*\.py$")


def check_span(text: str) -> tuple[bool, str] | None:
    """(resolves, description) for a span that is a checkable reference; None if it is not."""
    m = _R_FILE.match(text)
    if m:
        rel, symbol, first, last = m.groups()
        if not (REPO / rel).is_file():
            return False, f"no file {rel}"
        if symbol:
            why = resolve_symbol(rel, symbol)
            return why is None, why or f"{rel}::{symbol}"
        if first:
            n = len((REPO / rel).read_text(encoding="utf-8").splitlines())
            hi = int(last or first)
            ok = 1 <= int(first) <= hi <= n
            return ok, f"{rel} has {n} lines; {text} is outside it" if not ok else text
        return True, rel
    m = _R_DIR.match(text)
    if m:
        return (REPO / m.group(1)).is_dir(), f"directory {text}"
    m = _R_MODULE.match(text)
    if m:
        dotted = m.group(1)
        if module_file(dotted):
            return True, dotted
        mod, _, name = dotted.rpartition(".")
        rel = module_file(mod)
        if rel and name in module_info(rel).defined:
            return True, dotted
        return False, f"no module or symbol {dotted}"
    m = _R_SHORT.match(text)
    if m and m.group(1) in all_classes():
        cls, member = m.groups()
        return class_has(cls, member), f"minisgl class {cls} has no member {member!r}"
    return None


def _marked(span: Span) -> bool:
    return span.after.lstrip(" *_").startswith(BEING_BUILT)


def _sglang_cells(page: Page) -> dict[int, set[str]]:
    """Line -> spans in the SGLang cell of a concordance row (SGLang names, checked elsewhere)."""
    out: dict[int, set[str]] = {}
    for _, rows in page.tables():
        header = rows[0][1]
        if len(header) >= 2 and header[0] == "minisgl" and header[1].startswith("SGLang"):
            for line, cells in rows[1:]:
                out[line] = set(span_texts(cells[1]))
    return out


def _claim_test_lines(page: Page) -> set[int]:
    lines = set()
    for _, rows in page.tables():
        if (rows[0][1][0], rows[0][1][-1]) in CLAIM_HEADERS:
            lines.update(n for n, _ in rows[1:])
    return lines


@pytest.mark.parametrize("path", PAGES)
def test_code_references_resolve(path):
    page = load(path)
    claim_lines = _claim_test_lines(page)
    sglang_cells = _sglang_cells(page)
    problems = []
    for span in page.spans:
        where = f"{path}:{span.line}: `{span.text}`"
        if span.text in sglang_cells.get(span.line, ()):
            continue  # an SGLang name, checked against the index by test_chapter_concordance_rows
        results = []
        checked = check_span(span.text)
        if checked is not None:
            results.append(checked)
        for m in _R_REPO_FILE.finditer(span.text):
            if _R_CLAIM_TEST.match(m.group(1)) and span.line in claim_lines:
                continue  # claim tests are checked by test_claims_cite_existing_tests
            f = REPO / m.group(1)
            ok = f.is_file() and (not m.group(2) or m.group(2) in module_info(m.group(1)).defined)
            results.append((ok, f"no {m.group(0).strip()}"))
        for m in _R_PY_M.finditer(span.text):
            if checked is None:
                results.append((bool(module_file(m.group(1))), f"no module {m.group(1)}"))
        if not results:
            continue
        resolves = all(ok for ok, _ in results)
        marked = _marked(span) or (BEING_BUILT in span.full and _R_PY_M.search(span.text) is not None)
        if marked and resolves:
            problems.append(f"{where} is marked *(being built)* but exists now: remove the marker")
        elif not marked and not resolves:
            problems.append(f"{where}: " + "; ".join(why for ok, why in results if not ok))
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Code blocks: imports, python -m, quoted traces
# ---------------------------------------------------------------------------------------

_R_FROM_IMPORT = re.compile(r"^\s*from (minisgl[\w.]*) import ([\w, ()]+)")
_R_IMPORT = re.compile(r"^\s*import (minisgl[\w.]*)")
_SHELL = {"bash", "sh", "shell", "console"}


@pytest.mark.parametrize("path", PAGES)
def test_code_blocks_resolve(path):
    problems = []
    for block in load(path).blocks:
        for offset, line in enumerate(block.body, 1):
            where = f"{path}:{block.line + offset}"
            # python -c "..." one-liners carry imports too, so scan every line.
            for stmt in re.split(r";\s*|\"", line):
                m = _R_FROM_IMPORT.match(stmt)
                if m:
                    rel = module_file(m.group(1))
                    if rel is None:
                        problems.append(f"{where}: no module {m.group(1)}")
                        continue
                    info = module_info(rel)
                    for name in re.findall(r"\w+", m.group(2)):
                        if name not in info.defined | info.imported and not module_file(f"{m.group(1)}.{name}"):
                            problems.append(f"{where}: {m.group(1)} has no {name!r}")
                m = _R_IMPORT.match(stmt)
                if m and module_file(m.group(1)) is None:
                    problems.append(f"{where}: no module {m.group(1)}")
            if block.lang in _SHELL:
                for m in _R_PY_M.finditer(line):
                    exists = module_file(m.group(1)) is not None
                    marked = "# being built" in line
                    if marked and exists:
                        problems.append(f"{where}: {m.group(1)} exists now: remove '# being built'")
                    elif not marked and not exists:
                        problems.append(f"{where}: no module {m.group(1)} (mark the line '# being built')")
                for m in _R_REPO_FILE.finditer(line):
                    if not (REPO / m.group(1)).is_file() and "# being built" not in line:
                        problems.append(f"{where}: no file {m.group(1)}")
    assert not problems, "\n".join(problems)


_R_TITLE = re.compile(r'title="([^"]+)"')


def test_quoted_traces_match_golden_files():
    """A code block titled traces/<name>.jsonl quotes events that occur, in order, in that file."""
    problems = []
    for path in PAGES:
        for block in load(path).blocks:
            m = _R_TITLE.search(block.info)
            if not m or not m.group(1).startswith("traces/"):
                continue
            golden = REPO / m.group(1)
            where = f"{path}:{block.line}"
            if not golden.is_file():
                problems.append(f"{where}: quotes {m.group(1)}, which does not exist")
                continue
            events = [json.loads(x) for x in golden.read_text().splitlines() if x.strip()]
            quoted = [json.loads(x) for x in block.body if x.strip() and x.strip() != "..."]
            it = iter(events)
            missing = [q for q in quoted if not any(q == e for e in it)]
            if missing:
                problems.append(f"{where}: not in {m.group(1)} in this order: {missing[0]}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Links and the API page
# ---------------------------------------------------------------------------------------

_R_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", PAGES)
def test_relative_links_point_at_pages(path):
    page = load(path)
    problems = []
    for i, line in enumerate(page.prose, 1):
        for m in _R_LINK.finditer(SPAN.sub("", line)):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"^[a-z]+:", target):
                continue
            if not ((DOCS / path).parent / target).resolve().is_file():
                problems.append(f"{path}:{i}: link to missing {target}")
    assert not problems, "\n".join(problems)


def test_api_reference_targets_exist():
    lines = (DOCS / "reference" / "api.md").read_text(encoding="utf-8").splitlines()
    problems, seen = [], 0
    for i, line in enumerate(lines):
        m = re.match(r"^::: ([\w.]+)\s*$", line)
        if not m:
            continue
        seen += 1
        rel = module_file(m.group(1))
        if rel is None:
            problems.append(f"api.md:{i + 1}: no module {m.group(1)}")
            continue
        for follow in lines[i + 1 : i + 6]:
            mm = re.match(r"^\s+members:\s*\[(.*)\]", follow)
            if mm:
                for name in re.findall(r"\w+", mm.group(1)):
                    if name not in module_info(rel).defined:
                        problems.append(f"api.md:{i + 1}: {m.group(1)} defines no {name}")
    assert seen, "the API page documents nothing"
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Claims
# ---------------------------------------------------------------------------------------

_R_CLAIM_ID = re.compile(r"\bC(\d{1,2})\b")
_R_CLAIM_RANGE = re.compile(r"\bC\d{1,2}\s*[–-]\s*C\d{1,2}\b")


def names_claim(filename: str, n: int) -> bool:
    """test_c5_init_order.py and test_c4_c5_model_runner_init.py both name claim 5."""
    return filename.startswith("test_") and re.search(rf"(?:^test_|_)c{n}_", filename) is not None


def claim_test_files(n: int) -> list[str]:
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py") if names_claim(p.name, n))


@dataclass
class ClaimRow:
    page: str
    line: int
    claim: int
    tests: list[str]
    planned: bool


def claim_rows(path: str) -> list[ClaimRow]:
    out = []
    for _, rows in load(path).tables():
        header = rows[0][1]
        if (header[0], header[-1]) not in CLAIM_HEADERS:
            continue
        for line, cells in rows[1:]:
            m = re.fullmatch(r"\**C(\d{1,2})\**", cells[0])
            assert m, f"{path}:{line}: the first cell of a claims row must be a claim id, got {cells[0]!r}"
            test_cell = cells[-1]
            out.append(
                ClaimRow(path, line, int(m.group(1)), span_texts(test_cell), test_cell.lower().startswith("planned"))
            )
    return out


@pytest.mark.parametrize("path", PAGES)
def test_claims_cite_existing_tests(path):
    page = load(path)
    rows = claim_rows(path)
    problems = []
    # A chapter (or the map) that mentions a claim states it in a claims table on the same page;
    # other pages (the task pages, the glossary) may name claims without restating them.
    tabled = {r.claim for r in rows}
    cites = path in CHAPTERS or english_page(path) == "index.md"
    for i, line in enumerate(page.prose if cites else [], 1):
        text = _R_CLAIM_RANGE.sub("", SPAN.sub("", line))
        for m in _R_CLAIM_ID.finditer(text):
            n = int(m.group(1))
            if n not in CLAIMS:
                problems.append(f"{path}:{i}: there is no claim C{n} (claims are C1-C12)")
            elif n not in tabled:
                problems.append(f"{path}:{i}: C{n} is cited but not in this page's claims table")
    for r in rows:
        where = f"{path}:{r.line}: C{r.claim}"
        present = claim_test_files(r.claim)
        if r.planned:
            if present:
                problems.append(
                    f"{where} is marked planned, but {', '.join(present)} exists: cite it "
                    "(python scripts/sync_claims.py rewrites the claims tables)"
                )
            for t in r.tests:
                if not (t.startswith("tests/") and names_claim(Path(t).name, r.claim)):
                    want = f"tests/test_c{r.claim}_<topic>.py"
                    problems.append(f"{where}: expected test name {t!r} must look like {want}")
            continue
        if not r.tests:
            problems.append(f"{where}: the Test cell names no test file and does not say 'planned'")
        for t in r.tests:
            if not (REPO / t).is_file():
                problems.append(f"{where}: {t} does not exist (write 'planned — `{t}`' until it does)")
            elif not names_claim(Path(t).name, r.claim):
                problems.append(f"{where}: {t} is not named after the claim (test_c{r.claim}_*.py)")
    assert not problems, "\n".join(problems)


def test_every_claim_is_on_the_map_and_in_a_chapter():
    on_map = {r.claim for r in claim_rows("index.md")}
    in_chapters = {r.claim for p in CHAPTERS for r in claim_rows(p)}
    assert on_map == set(CLAIMS), f"index.md lacks claims {sorted(set(CLAIMS) - on_map)}"
    assert in_chapters == set(CLAIMS), f"no chapter states claims {sorted(set(CLAIMS) - in_chapters)}"


def test_every_translation_has_its_english_page():
    """mkdocs-static-i18n serves page.zh.md at /zh/page/ only as the translation of page.md."""
    orphans = [p for p in PAGES if TRANSLATED.search(p) and english_page(p) not in PAGES]
    assert not orphans, f"translations without an English page: {orphans}"


def test_translations_keep_the_claims():
    """A translated page states the same claims as its English page, with the same test files."""
    problems = []
    for path in [p for p in PAGES if TRANSLATED.search(p) and english_page(p) in PAGES]:
        ours = {(r.claim, tuple(r.tests), r.planned) for r in claim_rows(path)}
        theirs = {(r.claim, tuple(r.tests), r.planned) for r in claim_rows(english_page(path))}
        if ours != theirs:
            problems.append(f"{path}: claims {sorted(ours ^ theirs)} differ from {english_page(path)}")
    assert not problems, "\n".join(problems)


def test_every_chapter_is_in_the_nav():
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [p for p in PAGES if not TRANSLATED.search(p) and f" {p}" not in nav]
    assert not missing, f"pages missing from mkdocs.yml nav: {missing}"


def test_every_golden_trace_is_quoted():
    """Each file in traces/ is quoted, checked event by event, on some page."""
    quoted = {
        m.group(1)
        for path in PAGES
        for block in load(path).blocks
        if (m := _R_TITLE.search(block.info)) and m.group(1).startswith("traces/")
    }
    golden = {p.relative_to(REPO).as_posix() for p in (REPO / "traces").glob("*.jsonl")}
    assert golden <= quoted, f"golden traces no page quotes: {sorted(golden - quoted)}"


@pytest.mark.parametrize("path", [p for p in CHAPTERS if p.count(".") == 1])  # the English pages
def test_chapter_ends_with_exercises(path):
    """A "Try it" section of two or three exercises, each with the pytest command that checks it."""
    text = "\n".join(load(path).prose)
    assert "\n## Try it\n" in text, f"{path} has no '## Try it' section"
    section = text.split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d\. )", "\n" + section.strip())[1:]
    assert 2 <= len(items) <= 3, f"{path}: {len(items)} exercises, want two or three"
    for i, item in enumerate(items, 1):
        assert re.search(r"`python -m pytest [^`]*tests/[^`]+`", item), f"{path}: exercise {i} names no pytest command"
