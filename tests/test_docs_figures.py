"""The book's figures are what the code draws now.

`python -m minisgl.tools.make_figures` runs the engine on tiny checkpoints, saves the data
as docs/assets/figures/data.json, draws the SVGs beside it, and writes the request-life
sequence diagram into both editions of the serving chapter. This test does the same into a
temporary folder and compares: the data, each SVG byte for byte (the SVGs are deterministic),
and the diagram in each chapter. Every figure must also be shown in each edition.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is a dev dependency (scripts/setup.sh --dev)")

from minisgl.tools import make_figures  # noqa: E402

REFRESH = "python -m minisgl.tools.make_figures, then review the diff"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("figures")
    data = make_figures.collect(str(tmp_path_factory.mktemp("tiny")))
    make_figures.build(out, data)
    return out, data


def test_figure_data_is_fresh(fresh):
    out, _ = fresh
    committed = json.loads((make_figures.FIGURES / "data.json").read_text(encoding="utf-8"))
    assert json.loads((out / "data.json").read_text(encoding="utf-8")) == committed, f"figure data changed: {REFRESH}"


def _svg_signature(svg: bytes) -> tuple:
    """What a figure says, independent of how a matplotlib version writes paths: its size and texts."""
    text = svg.decode("utf-8")
    size = re.search(r'<svg[^>]* width="([^"]+)" height="([^"]+)"', text).groups()
    return size, re.findall(r"<text[^>]*>([^<]*)</text>", text)


def test_svgs_are_fresh(fresh):
    out, _ = fresh
    made = sorted(p.name for p in out.glob("*.svg"))
    assert made == sorted(p.name for p in make_figures.FIGURES.glob("*.svg"))
    same_matplotlib = (out / "drawn_with.txt").read_text() == (make_figures.FIGURES / "drawn_with.txt").read_text()
    if same_matplotlib:  # the drawing is deterministic: byte for byte
        stale = [n for n in made if (out / n).read_bytes() != (make_figures.FIGURES / n).read_bytes()]
    else:  # another matplotlib writes other bytes; the size and every label must still agree
        stale = [
            n
            for n in made
            if _svg_signature((out / n).read_bytes()) != _svg_signature((make_figures.FIGURES / n).read_bytes())
        ]
    assert not stale, f"{stale} differ from a fresh drawing: {REFRESH}"


@pytest.mark.parametrize("page", make_figures.SERVING_PAGES, ids=lambda p: p.name)
def test_request_life_diagram_is_fresh(fresh, page):
    """Both editions of the serving chapter show the diagram drawn from today's trace."""
    _, data = fresh
    chapter = page.read_text(encoding="utf-8")
    diagram = make_figures.request_life_mermaid(data["request_life"])
    assert make_figures.with_request_life(chapter, diagram) == chapter, f"{page.name}: the diagram changed: {REFRESH}"
    for who in ("TokenizerManager", "Scheduler", "TpModelWorker", "ModelRunner", "model", "Sampler"):
        assert f"participant {who} " in diagram


@pytest.mark.parametrize("suffix", [".md", ".zh.md"], ids=["en", "zh"])
def test_every_figure_is_on_a_page(suffix):
    """Each figure is shown in each edition (tests/test_docs_parity.py checks they show the same ones)."""
    paths = [p for p in (make_figures.REPO / "docs").rglob("*.md") if p.name.endswith(".zh.md") == (suffix == ".zh.md")]
    pages = "".join(p.read_text(encoding="utf-8") for p in paths)
    unused = [p.name for p in make_figures.FIGURES.glob("*.svg") if f"assets/figures/{p.name}" not in pages]
    assert not unused, f"figures no {suffix} page shows: {unused}"
