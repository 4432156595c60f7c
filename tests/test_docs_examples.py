"""The Python examples a reader copies from the README and the book run as written.

test_docs.py checks that their imports resolve; this runs them, each in a fresh interpreter,
so an API that drifts under an example (an argument renamed, a result reshaped) fails here
instead of in a reader's terminal. The streaming examples once printed every chunk whole,
though a chunk holds the text so far: what an example prints with ``end=""`` while it streams
must be exactly the stream's last chunk.
Examples that need a server (docs/tasks/serve.md) or continue another block are not run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests._models import smollm2_dir
from tests.docs_markdown import DOCS, REPO

# Run before an example: record what it prints with end="" and the last chunk of each stream.
WATCH_STREAMS = """
import atexit, builtins, json
from minisgl.entrypoints.engine import Engine

printed, last_chunks, _print, _generate = [], [], builtins.print, Engine.generate


def watched_print(*args, end="\\n", **kwargs):
    if end == "":
        printed.append("".join(map(str, args)))
    _print(*args, end=end, **kwargs)


def watched_generate(self, *args, stream=False, **kwargs):
    out = _generate(self, *args, stream=stream, **kwargs)
    if not stream:
        return out

    def chunks():
        for chunk in out:
            last_chunks.append(chunk["text"])
            yield chunk

    return chunks()


builtins.print, Engine.generate = watched_print, watched_generate
atexit.register(lambda: _print("\\nSTREAMED " + json.dumps(["".join(printed), last_chunks[-1:]])))
"""

# (page, which ```python block, a line the output must contain or None)
EXAMPLES = [
    ("README.md", 0, " Paris."),  # greedy: "The capital of France is Paris."
    ("docs/chapters/serving.md", 0, None),
    ("docs/tasks/notebooks.md", 1, "Scheduler.step"),  # render_tree's output
]


def python_blocks(page: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (REPO / page).read_text(encoding="utf-8"), flags=re.S | re.M)


@pytest.mark.parametrize(("page", "index", "expected"), EXAMPLES)
def test_example_runs(page, index, expected):
    assert (DOCS.parent / page).is_file()
    code = python_blocks(page)[index]
    if "SmolLM2-135M-Instruct" in code:
        smollm2_dir()  # converted once per machine, before the example's own load
    env = {**os.environ, "MPLBACKEND": "Agg"}  # plot_timeline draws without a display
    out = subprocess.run(
        [sys.executable, "-c", WATCH_STREAMS + code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    if expected is not None:
        assert any(expected in line for line in out.stdout.splitlines()), out.stdout
    printed, last_chunk = json.loads(out.stdout.rsplit("STREAMED ", 1)[1])
    if "stream=True" in code:
        assert last_chunk and printed == last_chunk[0], (printed, last_chunk)
