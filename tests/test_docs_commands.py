"""Every flag the book and the README give a minisgl command is one that command takes.

A reader copies ``python benchmarks/bench_speculative.py --eagle-topk 4 ...`` or ``python -m
minisgl.tools.train_eagle --train-steps 1300`` from a page; a flag renamed or dropped since would
fail at argparse. test_docs.py checks that the modules and files exist; this checks the flags,
against each command's own ``--help`` (argparse lists every option there), printed in one
subprocess that runs every command the pages pass flags to. The README's first command itself
runs in test_generate_cli.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.docs_markdown import DOCS, PAGES, REPO, SPAN

# python -m minisgl.X or python benchmarks/Y.py, then its arguments up to a shell operator or comment
COMMAND = re.compile(r"python3? (?:-m (minisgl[\w.]*)|(benchmarks/\w+\.py))((?:\s+[^\s|;&#<>`]+)*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
# Commands that hand the flags they do not know to another one (its help lists them).
PASSES_ON = {"minisgl.tools.launch_replicas": "minisgl.launch_server"}

HELP_ALL = """
import contextlib, io, json, runpy, sys
out = {}
for target in sys.argv[1:]:
    sys.argv, text = [target, "--help"], io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        try:
            if target.endswith(".py"):
                runpy.run_path(target, run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
    out[target] = text.getvalue()
print(json.dumps(out))
"""


def command_lines(text: str) -> list[str]:
    """Code blocks' lines (continuations joined) and inline code spans (also those that wrap)."""
    lines = []
    for block in re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", text, flags=re.S | re.M):
        lines += re.sub(r"\s*\\\n\s*", " ", block).splitlines()
    prose = re.sub(r"^\s*```[^\n]*\n.*?^\s*```", "", text, flags=re.S | re.M).replace("\n", " ")
    return lines + [m.group(2) for m in SPAN.finditer(prose)]


def documented_flags() -> dict[str, set[tuple[str, str]]]:
    """command -> {(flag, page)} for every flag written after a minisgl command."""
    sources = [(p, (DOCS / p).read_text(encoding="utf-8")) for p in PAGES]
    sources.append(("README.md", (REPO / "README.md").read_text(encoding="utf-8")))
    found: dict[str, set[tuple[str, str]]] = {}
    for page, text in sources:
        for line in command_lines(text):
            for m in COMMAND.finditer(line):
                target = m.group(1) or m.group(2)
                for flag in FLAG.findall(m.group(3)):
                    found.setdefault(target, set()).add((flag, page))
    return found


def test_command_lines_read_blocks_and_spans():
    text = (
        "Run `python -m minisgl.tools.train_eagle\n--train-steps 1300` first.\n\n"
        "```bash\npython benchmarks/x.py \\\n  --a 1 | tee\n```\n"
    )
    assert set(command_lines(text)) == {
        "python -m minisgl.tools.train_eagle --train-steps 1300",
        "python benchmarks/x.py --a 1 | tee",
    }


def test_documented_flags_exist():
    found = documented_flags()
    assert len(found) >= 10, f"too few commands found in the docs: {sorted(found)}"
    targets = sorted(set(found) | {PASSES_ON[t] for t in found if t in PASSES_ON})
    # the scripts by their paths from the repository root, the subprocess's working directory
    out = subprocess.run(
        [sys.executable, "-c", HELP_ALL, *targets], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    helps = json.loads(out.stdout)
    problems = []
    for target, flags in sorted(found.items()):
        text = helps[target] + helps.get(PASSES_ON.get(target, ""), "")
        if "usage:" not in text:
            problems.append(f"{target}: --help printed no usage, so its flags cannot be checked")
            continue
        for flag, page in sorted(flags):
            if not re.search(re.escape(flag) + r"(?![\w-])", text):
                problems.append(f"{page}: {target} has no {flag}")
    assert not problems, "\n".join(problems)
