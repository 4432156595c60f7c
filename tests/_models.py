"""Checkpoints the test suite shares: tiny random models and the converted SmolLM2.

Each tiny model is built once per test session (a few ms each, but many tests use
them) into one temporary folder keyed by arch. SmolLM2 is converted once per machine
into minisgl's GGUF cache (see minisgl/model_loader/gguf.py) and reused afterwards.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH, resolve_model_path
from minisgl.tools.make_tiny_model import make_tiny_model

_session_dir: Path | None = None
_tiny_dirs: dict[str, str] = {}


def tiny_model_dir(arch: str) -> str:
    """Folder of the tiny random `arch` checkpoint (seed 0), built on first use."""
    global _session_dir
    if arch not in _tiny_dirs:
        if _session_dir is None:
            _session_dir = Path(tempfile.mkdtemp(prefix="minisgl-tiny-"))
            atexit.register(shutil.rmtree, _session_dir, ignore_errors=True)
        _tiny_dirs[arch] = str(make_tiny_model(arch, _session_dir / arch, seed=0))
    return _tiny_dirs[arch]


def smollm2_dir() -> str:
    """Folder of SmolLM2-135M-Instruct in float32 (converts the bundled GGUF the first time, ~17 s)."""
    return resolve_model_path(DEFAULT_MODEL_PATH)
