"""Helpers the chapter notebooks share: tiny checkpoints, trace renderings, tables.

A trace (``minisgl.tracing``) is a flat list of ``begin`` / ``end`` / ``point``
events with no times, so its only axes are nesting and order. The notebooks in
``notebooks/`` show it two ways: ``render_tree`` as indented text (nesting),
``plot_timeline`` as a Gantt-like chart over the event index (nesting and order).
Consecutive points of the same name at the same depth, such as one
``RadixAttention.forward`` per layer, are merged into one line or one row.

    with tracing.record() as events:
        engine.generate(...)
    print(render_tree(events))
    plot_timeline(events, max_depth=2)
"""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from minisgl.tools.make_tiny_model import make_tiny_model

_tiny_root: Optional[Path] = None


def tiny_checkpoint(arch: str) -> str:
    """Folder of the tiny random `arch` checkpoint (seed 0), built on first use in a temporary folder."""
    global _tiny_root
    if _tiny_root is None:
        _tiny_root = Path(tempfile.mkdtemp(prefix="minisgl-notebook-"))
        atexit.register(shutil.rmtree, _tiny_root, ignore_errors=True)
    out = _tiny_root / arch
    if not (out / "config.json").is_file():
        make_tiny_model(arch, out, seed=0)
    return str(out)


@dataclasses.dataclass
class TraceNode:
    """A span (begin..end) or a run of consecutive same-name points, with its place in the trace."""

    event: str
    depth: int
    start: int  # index of the begin event, or of the first point
    end: int  # index of the end event, or of the last point
    is_span: bool
    attrs: list[dict]  # one dict per merged point; a span has one

    @property
    def name(self) -> str:
        return self.event + (f" ×{len(self.attrs)}" if len(self.attrs) > 1 else "")

    def label(self) -> str:
        """The name and the attributes; an attribute that varies over merged points shows its range."""
        keys = dict.fromkeys(k for a in self.attrs for k in a)
        parts = [f"{k}={_merged_value([a.get(k) for a in self.attrs])}" for k in keys]
        return self.name + (f"  {' '.join(parts)}" if parts else "")


def _merged_value(values: list[Any]) -> str:
    if all(v == values[0] for v in values):
        return str(values[0])
    if all(type(v) is int for v in values):
        return f"{values[0]}…{values[-1]}"
    return ",".join(str(v) for v in values)


def trace_nodes(events: list[dict]) -> list[TraceNode]:
    """The trace as nodes in begin order, each with its depth (0 = outermost).

    Consecutive points of one name at one depth become a single node.
    """
    nodes: list[TraceNode] = []
    stack: list[TraceNode] = []
    for i, e in enumerate(events):
        attrs = {k: v for k, v in e.items() if k not in ("event", "phase")}
        if e["phase"] == "begin":
            node = TraceNode(e["event"], len(stack), i, i, True, [attrs])
            nodes.append(node)
            stack.append(node)
        elif e["phase"] == "end":
            if not stack or stack[-1].event != e["event"]:
                raise ValueError(f"event {i}: end of {e['event']!r} does not close the innermost open span")
            stack.pop().end = i
        else:
            last = nodes[-1] if nodes else None
            if last and not last.is_span and last.event == e["event"] and last.end == i - 1:
                last.end = i
                last.attrs.append(attrs)
            else:
                nodes.append(TraceNode(e["event"], len(stack), i, i, False, [attrs]))
    if stack:
        raise ValueError(f"span {stack[-1].event!r} is never closed")
    return nodes


def render_tree(events: list[dict], max_depth: Optional[int] = None) -> str:
    """Indented text, one line per node: a span's name, or a run of points prefixed ``·``."""
    return "\n".join(
        "  " * node.depth + ("" if node.is_span else "· ") + node.label()
        for node in trace_nodes(events)
        if max_depth is None or node.depth <= max_depth
    )


def plot_timeline(events: list[dict], max_depth: Optional[int] = None, title: Optional[str] = None):
    """A Gantt-like chart: one row per node, a bar from its begin to its end event, colour by depth.

    The x axis is the event index: traces keep no times, so this shows what
    contains what and what comes before what, not how long anything took.
    Points are diamonds. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt  # only the notebooks need matplotlib

    nodes = [n for n in trace_nodes(events) if max_depth is None or n.depth <= max_depth]
    _, ax = plt.subplots(figsize=(11, 0.28 * len(nodes) + 1.2))
    colors = plt.get_cmap("tab10")
    middle = len(events) / 2
    for row, node in enumerate(nodes):
        color = colors(node.depth % 10)
        if node.is_span:
            ax.barh(row, node.end - node.start + 1, left=node.start - 0.5, height=0.7, color=color, alpha=0.35)
        else:
            ax.plot(range(node.start, node.end + 1), [row] * len(node.attrs), "D", color=color, markersize=4)
        # Each node has its own row, so its label can run past its bar without hiding another.
        left = node.start < middle
        if node.is_span:
            x = node.start - 0.3 if left else node.end + 0.3
        else:
            x = node.end + 0.5 if left else node.start - 0.5
        ax.text(x, row, node.name, ha="left" if left else "right", va="center", fontsize=8)
    ax.set_yticks([])
    ax.set_ylim(len(nodes) - 0.5, -0.5)
    ax.set_xlim(-1, len(events))
    ax.set_xlabel("event index (trace order; traces keep no times)")
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title)
    ax.figure.tight_layout()
    return ax


def kv_usage(engine) -> dict[str, int]:
    """The KV accounting of an Engine now: token slots and request-to-token rows.

    kv_free: in the allocator. kv_owned: held by running requests, outside the radix
    cache. kv_cached: held by the radix cache (a finished request's KV stays there,
    evictable), of which kv_locked are read by running requests and cannot be evicted;
    kv_free + kv_owned + kv_cached is the pool size.
    rows_free / rows_used: rows of the request-to-token table.
    """
    sched = engine.scheduler
    total = sched.worker_info.max_total_num_tokens
    free = sched.token_to_kv_pool_allocator.available_size()
    cached = sched.tree_cache.total_size()
    rows = sched.req_to_token_pool
    return {
        "kv_free": free,
        "kv_owned": total - free - cached,
        "kv_cached": cached,
        "kv_locked": sched.tree_cache.protected_size(),
        "rows_free": rows.available_size(),
        "rows_used": rows.size - rows.available_size(),
    }


def table(rows: list[dict], columns: Optional[list[str]] = None) -> str:
    """Rows of dicts as an aligned plain-text table (columns default to the first row's keys)."""
    columns = columns or (list(rows[0]) if rows else [])
    cells = [[str(c) for c in columns]] + [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
