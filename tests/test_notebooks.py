"""The chapter notebooks: one per chapter, committed without outputs, and each one runs.

``notebooks/NN_<slug>.ipynb`` follows the chapter order of mkdocs.yml's nav, the map first
(``01_map``), where slug is the page's file name with ``-`` as ``_``. Every chapter page names
its notebook. Notebooks are committed with outputs stripped (no outputs, no execution counts),
so a diff shows only what a person changed.

Each notebook is executed here, headless, in a fresh kernel with nbclient (as many at once as
this process has cores), on the tiny checkpoints and the CPU, so the one ``pytest`` command
covers them; ``pytest --nbmake notebooks/`` runs the same notebooks through nbmake.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 120


def chapter_pages() -> list[str]:
    """The book's chapter pages in nav order: the map (index.md), then chapters/*.md."""
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    return re.findall(r"^\s*- [^:\n]+: (index\.md|chapters/[\w-]+\.md)\s*$", nav, re.MULTILINE)


def notebook_name(number: int, page: str) -> str:
    slug = "map" if page == "index.md" else Path(page).stem.replace("-", "_")
    return f"{number:02d}_{slug}.ipynb"


EXPECTED = {notebook_name(i, page): page for i, page in enumerate(chapter_pages(), 1)}
PRESENT = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def _load(name: str) -> dict:
    return json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))


def _code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_every_chapter_has_its_notebook():
    assert len(EXPECTED) > 1, "found no chapters in mkdocs.yml's nav"
    missing = sorted(set(EXPECTED) - set(PRESENT))
    extra = sorted(set(PRESENT) - set(EXPECTED))
    assert not missing, f"chapters without a notebook: {missing}"
    assert not extra, f"notebooks that match no chapter (number and name follow mkdocs.yml's nav): {extra}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_chapter_page_names_its_notebook(name):
    page = EXPECTED[name]
    assert f"`notebooks/{name}`" in (REPO / "docs" / page).read_text(encoding="utf-8"), (
        f"docs/{page} should name its notebook as `notebooks/{name}`"
    )


@pytest.mark.parametrize("name", PRESENT)
def test_notebook_is_committed_without_outputs(name):
    nb = _load(name)
    nbformat.validate(nbformat.from_dict(nb))
    dirty = [i for i, c in enumerate(_code_cells(nb)) if c["outputs"] or c["execution_count"] is not None]
    assert not dirty, (
        f"{name}: code cells {dirty} keep outputs or execution counts; clear all outputs and save "
        "(in Jupyter: Kernel > Restart Kernel and Clear Outputs of All Cells)"
    )


@pytest.mark.parametrize("name", PRESENT)
def test_notebook_has_the_parameter_cell(name):
    first = _code_cells(_load(name))[0]
    source = "".join(first["source"])
    assert "parameters" in first["metadata"].get("tags", []), f"{name}: tag the first code cell 'parameters'"
    assert 'MODEL = None  # set to "SmolLM2-135M-Instruct" or a path; on a GPU also DEVICE="cuda"' in source
    assert 'DEVICE = "cpu"' in source


async def _execute(name: str, slots: asyncio.Semaphore) -> BaseException | None:
    """Run one notebook in its own fresh kernel; the error it raised, or None."""
    async with slots:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        client = NotebookClient(
            nb,
            timeout=CELL_TIMEOUT_S,
            kernel_name="python3",
            resources={"metadata": {"path": str(NOTEBOOKS)}},
            shutdown_kernel="immediate",  # a graceful shutdown waits ~3 s for the kernel to exit
        )
        # One OpenMP thread: the tiny models gain nothing from more, and spinning OpenMP workers
        # slow everything down when the machine's cores are shared.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        try:
            await client.async_execute(env=env)
        except Exception as e:  # re-raised by that notebook's own test
            return e
        return None


@pytest.fixture(scope="module")
def executed(request) -> dict[str, BaseException | None]:
    """Every notebook this session selected, executed in fresh kernels, one per core at a time:
    each kernel runs one thread, and most of a notebook's time is its kernel importing torch and
    transformers, so running them side by side halves this file's share of the suite."""
    names = [i.callspec.params["name"] for i in request.session.items if i.originalname == "test_notebook_runs"]
    slots = asyncio.Semaphore(len(os.sched_getaffinity(0)))  # the cores this process may use

    async def run_all():
        return await asyncio.gather(*(_execute(n, slots) for n in names))

    return dict(zip(names, asyncio.run(run_all())))


@pytest.mark.parametrize("name", PRESENT)
def test_notebook_runs(name, executed):
    # How long a notebook takes is for benchmarks to say, not for a test on a busy machine.
    if executed[name] is not None:
        raise executed[name]
