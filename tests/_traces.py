"""Helpers for tests that assert against golden traces."""

from __future__ import annotations

from minisgl import tracing
from minisgl.tools.refresh_traces import TRACES_DIR, run_scenario

_cache: dict[str, list[dict]] = {}


def fresh_and_golden(name: str) -> tuple[list[dict], list[dict]]:
    """Run a trace scenario now (once per session) and load its golden file."""
    if name not in _cache:
        _cache[name] = run_scenario(name)
    return _cache[name], tracing.load_jsonl(TRACES_DIR / f"{name}.jsonl")


def begins(events: list[dict]) -> list[str]:
    return [e["event"] for e in events if e["phase"] == "begin"]


def children(events: list[dict], parent: str) -> list[list[dict]]:
    """The events nested directly or deeper inside each `parent` span, one list per occurrence."""
    out, depth, current = [], 0, None
    for e in events:
        if current is None:
            if e["event"] == parent and e["phase"] == "begin":
                current, depth = [], 1
            continue
        if e["event"] == parent and e["phase"] == "end" and depth == 1:
            out.append(current)
            current = None
            continue
        depth += {"begin": 1, "end": -1}.get(e["phase"], 0) if e["event"] == parent else 0
        current.append(e)
    return out


def top_level_spans(events: list[dict]) -> list[str]:
    """Names of spans opened directly inside the given events (not nested deeper)."""
    names, depth = [], 0
    for e in events:
        if e["phase"] == "begin":
            if depth == 0:
                names.append(e["event"])
            depth += 1
        elif e["phase"] == "end":
            depth -= 1
    return names
