"""The rendered book: `mkdocs build --strict` passes, and every page renders in a browser.

The site has two editions (mkdocs-static-i18n): English at /, Chinese at /zh/, where a page
with no `page.zh.md` yet is shown in English. The build runs offline into a temporary
folder. The browser test serves that folder on a free 127.0.0.1 port, drives Debian's
headless `chromium` over the Chrome DevTools protocol (a small client on
`websocket-client`, in tests/docs_browser.py), and for every page in the nav, in both editions,
checks that:

- the page was served (HTTP 200) in its edition's language (`<html lang>`), and a page of the
  Chinese edition shows Chinese: its nav always, its text where the page is translated;
- each Mermaid diagram became an <svg> (and not Mermaid's "Syntax error" picture);
- the console logged no error and no script threw;
- nothing was fetched from anywhere but the local server (no CDN, no web fonts).

On the Chinese glossary it checks that the Chinese really renders as glyphs: the font
Chromium used for the heading is a Noto CJK face, and distinct characters drawn with the
page's font give distinct pictures, none of them the missing-glyph box. It saves a
screenshot of that page in the test's temporary folder (the path is printed) and one of the
ModelRunner chapter in artifacts/docs/model_runner.png. Search finds a page in each edition.
The browser tests skip, saying so, when chromium is not installed; `scripts/setup.sh --dev`
installs it and the CJK font (fonts-noto-cjk).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.docs_browser import (
    QuietHandler,
    devtools_session,
    document_status,
    find_chromium,
    page_problems,
    screenshot,
)

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "artifacts" / "docs" / "model_runner.png"

# The public classes the API reference must document.
API_CLASSES = [
    "minisgl.entrypoints.engine.Engine",
    "minisgl.server_args.ServerArgs",
    "minisgl.configs.model_config.ModelConfig",
    "minisgl.managers.scheduler.Scheduler",
    "minisgl.managers.tp_worker.TpModelWorker",
    "minisgl.model_executor.model_runner.ModelRunner",
    "minisgl.model_executor.forward_batch_info.ForwardBatch",
    "minisgl.mem_cache.memory_pool.ReqToTokenPool",
    "minisgl.mem_cache.memory_pool.MHATokenToKVPool",
    "minisgl.mem_cache.allocator.TokenToKVPoolAllocator",
    "minisgl.layers.radix_attention.RadixAttention",
    "minisgl.layers.logits_processor.LogitsProcessor",
    "minisgl.layers.sampler.Sampler",
    "minisgl.eplb.expert_distribution.ExpertDistributionRecorder",
]

pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def nav_pages() -> list[str]:
    """Every page of the nav, as the .md path mkdocs.yml gives it, in nav order."""
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, flags=re.M)


# The editions: locale -> URL prefix (mkdocs.yml's i18n plugin).
EDITIONS = {"en": "", "zh": "zh/"}
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_HEADING_ID = re.compile(r'<h[1-6] id="([^"]+)"')
_ANY_ID = re.compile(r'\bid="([^"]+)"')
_CJK_CHAR = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef"
_CJK_BREAK = re.compile(rf"[{_CJK_CHAR}][ \t]*\n[ \t]*[{_CJK_CHAR}]")


def page_url(base: str, md: str, locale: str = "en") -> str:
    # use_directory_urls: chapters/model-runner.md -> chapters/model-runner/ (zh/chapters/model-runner/)
    stem = md[: -len(".md")]
    prefix = EDITIONS[locale]
    return f"{base}/{prefix}" if stem == "index" else f"{base}/{prefix}{stem}/"


def page_source(md: str, locale: str = "en") -> Path:
    """The Markdown a page of an edition is rendered from: its translation, else the English page."""
    translated = REPO / "docs" / md.replace(".md", f".{locale}.md")
    return translated if locale != "en" and translated.is_file() else REPO / "docs" / md


def test_site_builds_strict_and_offline(site):
    pages = nav_pages()
    assert pages, "mkdocs.yml has no nav"
    for locale, prefix in EDITIONS.items():
        for md in pages:
            stem = md[: -len(".md")]
            html = site / prefix / ("index.html" if stem == "index" else f"{stem}/index.html")
            assert html.is_file(), f"{md} was not rendered for the {locale} edition"
            text = html.read_text(encoding="utf-8")
            assert f'<html lang="{locale}"' in text, f"{prefix}{stem}: not marked as {locale}"
            # The language switcher links every page to both editions.
            assert all(f'hreflang="{other}"' in text for other in EDITIONS), f"{prefix}{stem}: no language switcher"
    # A translated page keeps the English page's heading anchors ({#id} in the .zh.md), so a link to
    # page.md#anchor lands in either edition, whichever of them the linking page is in.
    for md in pages:
        if page_source(md, "zh").name.endswith(".zh.md"):
            stem = md[: -len(".md")]
            html = "index.html" if stem == "index" else f"{stem}/index.html"
            english = set(_HEADING_ID.findall((site / html).read_text(encoding="utf-8")))
            missing = english - set(_ANY_ID.findall((site / "zh" / html).read_text(encoding="utf-8")))
            assert not missing, f"zh/{md} lacks the English page's heading anchors {sorted(missing)}"
    # Search has one index for both editions, the Chinese pages split into words (jieba).
    search = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    assert set(search["config"]["lang"]) >= set(EDITIONS)
    zh_entries = [d for d in search["docs"] if d["location"].startswith("zh/") and _CJK.search(d["text"])]
    assert zh_entries, "the search index holds no page of the Chinese edition"
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis.com" not in index, "theme.font must stay false: no web fonts"
    assert "assets/javascripts/mermaid.min.js" in index, "the vendored Mermaid is not loaded"
    # The hook filled the concordance page from the chapters' tables.
    concordance = (site / "concordance" / "index.html").read_text(encoding="utf-8")
    assert "concordance:generated" not in concordance
    assert concordance.count("python/sglang/srt/") >= 100
    check_links(site)
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in API_CLASSES if f'id="{name}"' not in api]
    assert not missing, f"the API reference lacks {missing}"


def check_links(site: Path) -> None:
    """Every SGLang reference links to its line at the pinned commit; every repository path to its page."""
    commit = json.loads((REPO / "docs" / "reference" / "sglang-index-64bca53.json").read_text())["commit"]
    problems, linked = [], 0
    for page in site.rglob("index.html"):
        if page.relative_to(site).parts[0] in ("source", "assets", "search"):
            continue
        prose = re.sub(r"<pre[\s>].*?</pre>", "", page.read_text(encoding="utf-8"), flags=re.S)
        for m in re.finditer(r'(?:<a href="([^"]*)">)?<code>(python/sglang/srt/[\w/]+\.py(?::(\d+))?)</code>', prose):
            href, text, line = m.groups()
            want = f"https://github.com/sgl-project/sglang/blob/{commit}/{text.split(':')[0]}"
            if not href or not href.startswith(want) or (line and not href.endswith(f"#L{line}")):
                problems.append(f"{page.relative_to(site)}: `{text}` links to {href}")
            linked += 1
        repo_ref = r'(?:<a href="([^"]*)">)?<code>((?:minisgl|tests)/[\w/.]+\.py)(?:(?:::|:)[\w.]+)?</code>'
        for m in re.finditer(repo_ref, prose):
            href, rel = m.groups()
            if (REPO / rel).is_file() and not (href and (page.parent / href.split("#")[0]).is_file()):
                problems.append(f"{page.relative_to(site)}: `{rel}` has no link to its source page ({href})")
    assert linked >= 100, f"only {linked} SGLang references found on the site"
    assert not problems, "\n".join(problems[:20])


# ---------------------------------------------------------------------------------------
# The browser (tests/docs_browser.py)
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(site):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    exe = find_chromium()
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the browser checks need it")
    pytest.importorskip("websocket", reason="websocket-client is not installed (pip install websocket-client)")
    with devtools_session(exe) as tools:
        yield tools


_DIAGRAMS = """
(async () => {
  const deadline = Date.now() + 20000;
  const state = () => Array.from(document.querySelectorAll('div.mermaid')).map(d => ({
    svg: d.querySelector('svg') !== null,
    error: /Syntax error|Parse error/i.test(d.textContent),
  }));
  while (Date.now() < deadline && state().some(s => !s.svg)) {
    await new Promise(r => setTimeout(r, 100));
  }
  return state();
})()
"""


@pytest.mark.slow  # ~50 s on two cores: every page of both editions; the other browser tests stay by default
def test_every_page_renders_with_diagrams_and_no_errors(server, browser):
    pages = nav_pages()
    problems = []
    for locale, prefix in EDITIONS.items():
        for md in pages:
            where = f"{prefix}{md}"
            browser.events.clear()
            browser.call("Page.navigate", url=page_url(server, md, locale))
            browser.wait_for("Page.loadEventFired")
            status = document_status(browser)
            if status != 200:
                problems.append(f"{where}: HTTP {status}")
                continue
            lang = browser.evaluate("document.documentElement.lang")
            if lang != locale:
                problems.append(f"{where}: <html lang={lang!r}>, expected {locale!r}")
            source = page_source(md, locale)
            if locale == "zh":
                nav = browser.evaluate("document.querySelector('nav.md-nav--primary').innerText")
                if not _CJK.search(nav or ""):
                    problems.append(f"{where}: the navigation is not in Chinese")
                if source.name.endswith(".zh.md"):
                    article = browser.evaluate("document.querySelector('article').innerText") or ""
                    if len(_CJK.findall(article)) < 50:
                        problems.append(f"{where}: translated, but the page shows little Chinese")
                    # Chinese puts no space between characters, and a browser shows a line break in the
                    # HTML as one: a wrapped source line must not leave a break inside Chinese text.
                    prose = browser.evaluate(
                        "Array.from(document.querySelectorAll('article p')).map(p => p.textContent).join('\\n\\n')"
                    )
                    broken = _CJK_BREAK.findall(prose or "")
                    if broken:
                        problems.append(f"{where}: a line break (shown as a space) inside Chinese text: {broken[:3]}")
            states = browser.evaluate(_DIAGRAMS) or []
            expected = len(re.findall(r"^\s*```mermaid\s*$", source.read_text(encoding="utf-8"), flags=re.M))
            if len(states) != expected:
                problems.append(f"{where}: {expected} mermaid blocks in the source, {len(states)} diagrams on the page")
            for i, s in enumerate(states):
                if not s["svg"] or s["error"]:
                    problems.append(f"{where}: diagram {i + 1} did not render ({s})")
            problems += [f"{where}: {p}" for p in page_problems(browser, server)]
            if locale == "en" and md == "chapters/model-runner.md":
                assert states, "the ModelRunner chapter should show its reading-order diagram"
                # From the top of the page to the bottom of the reading-order diagram.
                screenshot(
                    browser,
                    SCREENSHOT,
                    "Math.ceil(document.querySelector('div.mermaid').getBoundingClientRect().bottom"
                    " + window.scrollY + 24)",
                )
    assert not problems, "\n".join(problems)
    assert SCREENSHOT.is_file() and SCREENSHOT.stat().st_size > 10_000


# Draw each character alone with the font the page's text uses, and read back the alpha
# channel. Without a CJK font Chromium draws the same missing-glyph box (tofu) for every
# character, or nothing; with one, distinct characters give distinct pictures. U+10FFFD is a
# private-use code point that no font maps, so it always draws the missing glyph.
_GLYPHS = """
(() => {
  const font = getComputedStyle(document.querySelector('article')).fontFamily;
  const canvas = document.createElement('canvas');
  canvas.width = 64; canvas.height = 64;
  const ctx = canvas.getContext('2d');
  const draw = (ch) => {
    ctx.clearRect(0, 0, 64, 64);
    ctx.font = `48px ${font}`;
    ctx.textBaseline = 'top';
    ctx.fillText(ch, 4, 4);
    const alpha = ctx.getImageData(0, 0, 64, 64).data.filter((_, i) => i % 4 === 3);
    return Array.from(alpha).join(',');
  };
  const tofu = draw('\\u{10FFFD}');
  const glyphs = Array.from(CHARS).map(draw);
  return {
    font,
    distinct: new Set(glyphs).size,
    tofu: glyphs.filter((g) => g === tofu).length,
    blank: glyphs.filter((g) => !/[1-9]/.test(g)).length,
  };
})()
"""
_SAMPLE = "术语汇合点执行壳调度"


def test_chinese_renders_as_glyphs(server, browser, tmp_path_factory):
    browser.events.clear()
    browser.call("Page.navigate", url=page_url(server, "glossary.md", "zh"))
    browser.wait_for("Page.loadEventFired")
    browser.evaluate("document.fonts.ready.then(() => true)")
    heading = browser.evaluate("document.querySelector('article h1').textContent")
    assert _CJK.search(heading or ""), f"the Chinese glossary's heading is {heading!r}"

    # The font Chromium really used for the heading's characters.
    root = browser.call("DOM.getDocument", depth=0)["root"]["nodeId"]
    node = browser.call("DOM.querySelector", nodeId=root, selector="article h1")["nodeId"]
    fonts = browser.call("CSS.getPlatformFontsForNode", nodeId=node)["fonts"]
    used = max(fonts, key=lambda f: f["glyphCount"])["familyName"] if fonts else None
    assert used and "CJK" in used, f"the heading is drawn with {fonts}, not Noto CJK (apt install fonts-noto-cjk)"

    glyphs = browser.evaluate(_GLYPHS.replace("CHARS", json.dumps(_SAMPLE)))
    assert "Noto Sans CJK SC" in glyphs["font"], f"the page's fonts do not name Noto Sans CJK SC: {glyphs['font']}"
    assert glyphs["blank"] == 0 and glyphs["tofu"] == 0, f"some characters draw nothing or a box: {glyphs}"
    assert glyphs["distinct"] == len(_SAMPLE), f"characters share one picture (missing glyphs): {glyphs}"

    shot = tmp_path_factory.mktemp("zh") / "glossary_zh.png"
    screenshot(browser, shot, "Math.ceil(document.querySelector('article table').getBoundingClientRect().bottom + 24)")
    print(f"screenshot of the Chinese glossary: {shot}")
    assert shot.stat().st_size > 10_000


_SEARCH = """
(async (query) => {
  const input = document.querySelector('input.md-search__input');
  input.focus();
  input.value = query;
  input.dispatchEvent(new Event('input', {bubbles: true}));
  input.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true}));
  const deadline = Date.now() + 15000;
  const hits = () => Array.from(document.querySelectorAll('.md-search-result__item a')).map(a => a.href);
  while (Date.now() < deadline && hits().length === 0) {
    await new Promise(r => setTimeout(r, 100));
  }
  return hits();
})
"""


@pytest.mark.parametrize("locale,query,page", [("en", "convergence", "glossary/"), ("zh", "汇合点", "zh/glossary/")])
def test_search_finds_pages_in_each_edition(server, browser, locale, query, page):
    browser.events.clear()
    browser.call("Page.navigate", url=page_url(server, "index.md", locale))
    browser.wait_for("Page.loadEventFired")
    hits = browser.evaluate(f"{_SEARCH.strip()}({json.dumps(query)})") or []
    assert any(h.startswith(f"{server}/{page}") for h in hits), f"searching {query!r} found {hits[:10]}"


# Each <text> of a figure, measured as Chromium draws it (its own font, not matplotlib's metrics),
# in the SVG's user units, against the view box.
_SVG_TEXT_OUTSIDE = """
(() => {
  const svg = document.querySelector('svg');
  const vb = svg.viewBox.baseVal;
  const box = svg.getBoundingClientRect();
  const sx = vb.width / box.width, sy = vb.height / box.height;
  return Array.from(svg.querySelectorAll('text')).map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent, x0: vb.x + (r.left - box.left) * sx, y0: vb.y + (r.top - box.top) * sy,
            x1: vb.x + (r.right - box.left) * sx, y1: vb.y + (r.bottom - box.top) * sy,
            w: vb.width, h: vb.height, vx: vb.x, vy: vb.y};
  }).filter(b => b.text.trim() && (b.x0 < b.vx - 0.5 || b.y0 < b.vy - 0.5
                                   || b.x1 > b.vx + b.w + 0.5 || b.y1 > b.vy + b.h + 0.5));
})()
"""


def test_every_figure_keeps_its_text_inside_its_view_box(server, browser):
    """A label drawn past the view box is clipped on the page (a title cut off at the top, say)."""
    figures = sorted((REPO / "docs" / "assets" / "figures").glob("*.svg"))
    assert figures
    problems = []
    for svg in figures:
        browser.events.clear()
        browser.call("Page.navigate", url=f"{server}/assets/figures/{svg.name}")
        browser.wait_for("Page.loadEventFired")
        for b in browser.evaluate(_SVG_TEXT_OUTSIDE) or []:
            problems.append(
                f"{svg.name}: {b['text']!r} spans x {b['x0']:.1f}..{b['x1']:.1f}, y {b['y0']:.1f}..{b['y1']:.1f}"
                f" outside the view box {b['vx']:g} {b['vy']:g} {b['w']:g} {b['h']:g}"
            )
    assert not problems, (
        "figure text outside its view box (redraw with python -m minisgl.tools.make_figures):\n" + "\n".join(problems)
    )
