"""Structured trace events: the evidence the book's claims are checked against.

An event is a dict ``{"event": "ModelRunner.load_model", "phase": "begin"|"end"|"point", **attrs}``.
Golden traces keep no times, ids or addresses, so a trace is a deterministic
function of the code path taken. When no recorder is active, ``span``/``point``
cost one attribute read. While the torch profiler runs (managers/scheduler_profiler.py),
every span is also a ``torch.profiler.record_function`` range, so a profiler trace shows
minisgl's own structure.

    with tracing.record() as events:
        engine.generate(...)
    # events is a list of dicts, in the order the code ran
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

_local = threading.local()
_profiling = False  # process-wide: the profiler records every thread


def set_profiling(on: bool) -> None:
    global _profiling
    _profiling = on


def _active() -> list[dict] | None:
    return getattr(_local, "events", None)


def is_enabled() -> bool:
    return _active() is not None


def point(event: str, **attrs: Any) -> None:
    events = _active()
    if events is not None:
        events.append({"event": event, "phase": "point", **attrs})


def extend(events: list[dict]) -> None:
    """Append events recorded on another thread (the overlap loop's forward thread) in one piece,
    where this thread's order puts them, so a trace stays deterministic."""
    active = _active()
    if active is not None:
        active.extend(events)


@contextlib.contextmanager
def span(event: str, **attrs: Any) -> Iterator[None]:
    events = _active()
    if events is None and not _profiling:
        yield
        return
    with _profiler_range(event):
        if events is not None:
            events.append({"event": event, "phase": "begin", **attrs})
        yield
        if events is not None:
            events.append({"event": event, "phase": "end"})


def _profiler_range(event: str):
    if not _profiling:
        return contextlib.nullcontext()
    import torch  # only a profiled process gets here, and it has torch loaded

    return torch.profiler.record_function(event)


def traced(fn: Optional[Callable] = None, *, name: Optional[str] = None, attrs: Optional[Callable[..., dict]] = None):
    """Decorate a function so that every call is a span named after it (``Class.method``).

    The span belongs to the function, not to a label typed where it is called: move the
    call and its span moves with it, so a golden trace sees the real order of calls.
    ``attrs(*args, **kwargs)`` adds attributes from the call's arguments."""

    def decorate(func: Callable) -> Callable:
        event = name or func.__qualname__

        if inspect.isasyncgenfunction(func):
            return _traced_async_gen(func, event, attrs)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if _active() is None and not _profiling:
                return func(*args, **kwargs)
            with span(event, **(attrs(*args, **kwargs) if attrs else {})):
                return func(*args, **kwargs)

        return wrapper

    return decorate(fn) if fn is not None else decorate


def _traced_async_gen(func: Callable, event: str, attrs: Optional[Callable[..., dict]]) -> Callable:
    """An async generator's span runs from its first step to its end (the front door's
    generate_request); closing the wrapper closes the generator, so its cleanup runs at once."""

    @functools.wraps(func)
    async def wrapper(*args, **kwargs):
        gen, events = func(*args, **kwargs), _active()
        if events is not None:
            events.append({"event": event, "phase": "begin", **(attrs(*args, **kwargs) if attrs else {})})
        try:
            async for item in gen:
                yield item
        finally:
            await gen.aclose()
            if events is not None:
                events.append({"event": event, "phase": "end"})

    return wrapper


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
