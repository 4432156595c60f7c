"""The README's first command: ``python -m minisgl.generate PROMPT`` answers with the default model.

It once failed on a fresh clone with "unknown engine argument ... model_path_as_given" (the CLI
rebuilt ServerArgs from ``vars()`` of one, which holds more than its fields) while every other
test passed, since none ran it. The command is taken from the README, so the two cannot drift."""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from minisgl.entrypoints.engine import Engine
from tests._models import smollm2_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_main_command() -> list[str]:
    """The README's first command after its install step, with this interpreter for .venv's."""
    match = re.search(
        r"scripts/setup\.sh && \.venv/bin/python (-m minisgl\.generate .*)", (ROOT / "README.md").read_text()
    )
    assert match, "the README's first screen no longer runs python -m minisgl.generate"
    return [sys.executable, *shlex.split(match.group(1))]


def test_readme_main_command_answers_with_the_default_model():
    smollm2_dir()  # converted once per machine, so the command's load is not the conversion
    command = readme_main_command()
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    prompt = command[command.index("minisgl.generate") + 1]
    assert f"> {prompt}\n" in out.stdout
    assert re.search(r"load [\d.]+s, \d+ tokens in [\d.]+s, finish", out.stdout), out.stdout
    assert "Paris" in out.stdout  # SmolLM2-135M-Instruct's greedy answer names it


def test_engine_takes_one_server_args_or_its_fields():
    with pytest.raises(ValueError, match="server_args or its fields, not both"):
        Engine(server_args=object(), model_path="SmolLM2-135M-Instruct")
    with pytest.raises(ValueError, match="server_args must be a ServerArgs, got dict"):
        Engine(server_args={"model_path": "SmolLM2-135M-Instruct"})
