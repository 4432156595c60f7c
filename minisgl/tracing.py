"""Structured trace events: the evidence the book's claims are checked against.

An event is a dict ``{"event": "ModelRunner.load_model", "phase": "begin"|"end"|"point", **attrs}``.
Golden traces keep no times, ids or addresses, so a trace is a deterministic
function of the code path taken. When no recorder is active, ``span``/``point``
cost one attribute read.

    with tracing.record() as events:
        engine.generate(...)
    # events is a list of dicts, in the order the code ran
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any, Iterator

_local = threading.local()


def _active() -> list[dict] | None:
    return getattr(_local, "events", None)


def is_enabled() -> bool:
    return _active() is not None


def point(event: str, **attrs: Any) -> None:
    events = _active()
    if events is not None:
        events.append({"event": event, "phase": "point", **attrs})


@contextlib.contextmanager
def span(event: str, **attrs: Any) -> Iterator[None]:
    events = _active()
    if events is None:
        yield
        return
    events.append({"event": event, "phase": "begin", **attrs})
    yield
    events.append({"event": event, "phase": "end"})


@contextlib.contextmanager
def record() -> Iterator[list[dict]]:
    """Collect events emitted on this thread while the block runs."""
    previous = _active()
    events: list[dict] = []
    _local.events = events
    try:
        yield events
    finally:
        _local.events = previous


def dump_jsonl(events: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e, sort_keys=True) + "\n")


def load_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
