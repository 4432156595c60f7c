"""Every number the book gives about SGLang's source is counted here from the SGLang index.

docs/reference/sglang-index-64bca53.json (scripts/make_sglang_index.py) holds facts about
SGLang at the pinned commit; each test below recounts one claim from it and checks that both
editions state the count the index gives, so a number cannot drift from the source or between
the languages. The numeric claims the book makes about SGLang, and where:

- C1: how many mixins the `Scheduler` class is assembled from, how many times it (with the
  mixins) reads a worker's `model_runner`, how many times it calls a runner's `forward`
  directly, and the table of those places (index.md, tp-worker, scheduler);
- C10: how many `layers/` files import `model_executor`, how many of them are under
  `layers/attention/`, and of the `models/` files how many import `model_executor`,
  `managers` and `eplb` (models-and-layers, attention).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
INDEX = json.loads((DOCS / "reference" / "sglang-index-64bca53.json").read_text(encoding="utf-8"))["files"]


def _index_script():
    spec = importlib.util.spec_from_file_location("make_sglang_index", REPO / "scripts" / "make_sglang_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCHEDULER_CLASSES = _index_script().SCHEDULER_CLASSES


def _text(page: str) -> str:
    # A claim may wrap: compare with runs of whitespace as one space (none between CJK text and digits).
    return re.sub(r"\s+", " ", (DOCS / page).read_text(encoding="utf-8"))


def _missing(page: str, phrases: list[str]) -> list[str]:
    text = _text(page)
    return [f"{page}: {p!r}" for p in phrases if p not in text]


def _runner_uses() -> tuple[int, set[str], set[str]]:
    """(mixins, read places, forward-call places), each place as `python/sglang/srt/<file>:<line>`."""
    for rel, cls in SCHEDULER_CLASSES.items():
        assert [line for line, name in INDEX[rel]["defs"] if name == cls], f"the index has no {cls} in {rel}"
    reads = {f"python/sglang/srt/{rel}:{line}" for rel in SCHEDULER_CLASSES for line, _ in INDEX[rel].get("reads", [])}
    calls = {
        f"python/sglang/srt/{rel}:{line}"
        for rel in SCHEDULER_CLASSES
        for line, _ in INDEX[rel].get("forward_calls", [])
    }
    return len(SCHEDULER_CLASSES) - 1, reads, calls


def test_the_index_counts_every_runner_read_of_the_scheduler():
    """The index lists reads line by line; two reads on one line would be undercounted as one place."""
    for rel in SCHEDULER_CLASSES:
        lines = [line for line, _ in INDEX[rel].get("reads", [])]
        assert len(lines) == len(set(lines)), f"{rel}: two runner reads on one line; count them as places by hand"


@pytest.mark.parametrize("locale", ["en", "zh"])
def test_c1_runner_reads_match_the_index(locale):
    mixins, reads, calls = _runner_uses()
    r, m, f = len(reads), mixins, len(calls)
    if locale == "en":
        phrases = {
            "index.md": [
                f"`Scheduler` class with its {m} mixins",
                f"`model_runner` in {r} places",
                f"directly in {f} place",
            ],
            "chapters/scheduler.md": [
                f"with its {m} mixins",
                f"`model_runner` in {r} places",
                f"directly in {f} place",
            ],
            "chapters/tp-worker.md": [
                f"`scheduler.py` and {m} mixins",
                f"`model_runner` in {r} places",
                f"`forward` directly in {f} place",
                f"with its {m} mixins",
            ],
        }
    else:
        phrases = {
            "index.zh.md": [f"它的 {m} 个 mixin", f"有 {r} 处读", f"还有 {f} 处直接调用"],
            "chapters/scheduler.zh.md": [f"它的 {m} 个 mixin", f"有 {r} 处读", f"还有 {f} 处直接调用"],
            "chapters/tp-worker.zh.md": [f"和 {m} 个 mixin 拼成", f"有 {r} 处读", f"还有 {f} 处直接调用"],
        }
    problems = [p for page, said in phrases.items() for p in _missing(page, said)]
    # Chapter 2's table names exactly the places the index lists, no more and no fewer.
    page = "chapters/tp-worker.md" if locale == "en" else "chapters/tp-worker.zh.md"
    text = (DOCS / page).read_text(encoding="utf-8")
    table = text[text.index("| Where | What it reads |" if locale == "en" else "| 位置 | 读的是什么 |") :].split(
        "\n\n"
    )[0]
    cited = set(re.findall(r"python/sglang/srt/[\w/]+\.py:\d+", table))
    if cited != reads | calls:
        problems.append(
            f"{page}: the table cites {sorted(cited - reads - calls)} beyond the index and misses "
            f"{sorted((reads | calls) - cited)}"
        )
    assert not problems, "the book's C1 counts differ from the index (scripts/make_sglang_index.py):\n" + "\n".join(
        problems
    )


def _imports(folder: str, package: str) -> int:
    return sum(1 for rel, e in INDEX.items() if rel.startswith(folder) and package in e["imports"])


@pytest.mark.parametrize("locale", ["en", "zh"])
def test_c10_import_counts_match_the_index(locale):
    layers, attention = _imports("layers/", "model_executor"), _imports("layers/attention/", "model_executor")
    models = sum(1 for rel in INDEX if rel.startswith("models/"))
    executor, managers, eplb = (_imports("models/", p) for p in ("model_executor", "managers", "eplb"))
    if locale == "en":
        phrases = {
            "chapters/models-and-layers.md": [
                f"{layers} files under `layers/` import `model_executor`",
                f"of the {models} files in `models/`, {executor} import `model_executor`, {managers} `managers` "
                f"and {eplb} `eplb`",
            ],
            "chapters/attention.md": [f"{attention} of the {layers} `layers/` files"],
        }
    else:
        phrases = {
            "chapters/models-and-layers.zh.md": [
                f"`layers/` 下有 {layers} 个文件",
                f"`models/` 的 {models} 个文件里，{executor} 个 import `model_executor`，{managers} 个 import "
                f"`managers`，{eplb} 个 import `eplb`",
            ],
            "chapters/attention.zh.md": [f"这样做的 {layers} 个文件中，有 {attention} 个在 `layers/attention/` 下"],
        }
    problems = [p for page, said in phrases.items() for p in _missing(page, said)]
    assert not problems, "the book's C10 import counts differ from the index:\n" + "\n".join(problems)


def test_the_index_script_counts_reads_and_forward_calls_in_a_scheduler_class():
    """What the counts above rest on: every `.model_runner` read and runner `forward` call inside the class."""
    script = _index_script()
    source = (
        "class SchedulerMultiplexMixin:\n"
        "    def a(self):\n"
        "        self.tp_worker.model_runner.update_decode_attn_backend(0)\n"
        "        runner = self.draft_worker.model_runner\n"
        "        runner.forward(batch)\n"
        "        self.tp_worker.forward_batch_generation(batch)\n"
        "def outside(self):\n"
        "    return self.tp_worker.model_runner\n"
    )
    entry = script.index_file("multiplex/multiplexing_mixin.py", source)
    assert entry["reads"] == [[3, "self.tp_worker.model_runner"], [4, "self.draft_worker.model_runner"]]
    assert entry["forward_calls"] == [[5, "runner.forward"]]


def test_the_index_script_refuses_a_copy_that_is_not_the_pinned_file(tmp_path):
    script = _index_script()
    rel = "managers/scheduler_pp_mixin.py"
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text("class SchedulerPPMixin:\n    pass\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="is not the file at 64bca53"):
        script.update(tmp_path, [rel])
