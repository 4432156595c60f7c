"""The scheduler's torch profiler: /start_profile and /stop_profile, Engine.start_profile/stop_profile.

Mirrors python/sglang/srt/managers/scheduler_profiler_mixin.py (start_profile, stop_profile):
a torch.profiler run in the scheduler's own thread (or each tensor-parallel rank's process),
written on stop as a Chrome trace (``<output_dir>/<time>-TP-<rank>.trace.json``, ``-PP-<stage>-TP-<rank>``
under pipeline parallelism, which
Perfetto and chrome://tracing open). While it runs, minisgl.tracing turns every span of
minisgl's code (ModelRunner.forward, ...) into a ``record_function``
range, so the trace shows the engine's own structure above the torch ops. Omitted:
SGLang's num_steps, stage-by-stage profiles, memory snapshots, with_stack and
record_shapes (all refused by name at the route).
"""

from __future__ import annotations

import os
import time
from typing import Optional

import torch

from minisgl import tracing
from minisgl.managers.io_struct import ProfileReq

_ACTIVITIES = {"CPU": torch.profiler.ProfilerActivity.CPU, "GPU": torch.profiler.ProfilerActivity.CUDA}

# This process's running profile, with where it goes: one scheduler (or TP rank) per process.
_running: Optional[tuple[torch.profiler.profile, str]] = None


def _all_threads_config() -> Optional[torch.profiler._ExperimentalConfig]:
    """Record every thread, not only the one that starts the profiler: the overlap loop runs its
    forwards on a thread of their own. Older torch (before profile_all_threads) records this one."""
    try:
        return torch.profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return None


def handle_profile_req(req: ProfileReq, tp_rank: int, pp_rank: Optional[int] = None) -> Optional[str]:
    """Start (returns None) or stop (returns the trace file's path) this process's profile."""
    global _running
    if req.action == "start":
        if _running is not None:
            raise RuntimeError("the profiler is already running; stop it first")
        activities = req.activities or ["CPU"] + (["GPU"] if torch.cuda.is_available() else [])
        unknown = [a for a in activities if a not in _ACTIVITIES]
        if unknown:
            raise ValueError(f"activities must be among {sorted(_ACTIVITIES)}, got {unknown}")
        output_dir = req.output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        os.makedirs(output_dir, exist_ok=True)
        rank = f"TP-{tp_rank}" if pp_rank is None else f"PP-{pp_rank}-TP-{tp_rank}"
        path = os.path.join(output_dir, f"{time.time():.0f}-{rank}.trace.json")
        profile = torch.profiler.profile(
            activities=[_ACTIVITIES[a] for a in activities], experimental_config=_all_threads_config()
        )
        profile.start()
        tracing.set_profiling(True)
        _running = (profile, path)
        return None
    if req.action == "stop":
        if _running is None:
            raise RuntimeError("the profiler is not running; start it first")
        (profile, path), _running = _running, None
        tracing.set_profiling(False)
        profile.stop()
        profile.export_chrome_trace(path)
        return path
    raise ValueError(f"unknown profile action {req.action!r}")
