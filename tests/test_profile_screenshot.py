"""minisgl.tools.profile_screenshot: a real profile opens in Chromium's trace viewer.

The tool records a profile (here of the tiny Llama), loads it into Chromium's DevTools
Performance panel and fails unless the panel's Summary names the ``ModelRunner.forward``
span it clicked: the viewer read minisgl's spans. Needs Debian's Chromium and playwright.
"""

import importlib.util
import pathlib
import shutil

import pytest

from minisgl.tools import profile_screenshot

CHROMIUM = shutil.which("chromium")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
@pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="needs playwright (pip install playwright)")
def test_a_profile_opens_in_chromiums_trace_viewer(tiny_llama, tmp_path):
    trace = profile_screenshot.record_profile(tiny_llama, str(tmp_path))
    png = tmp_path / "trace.png"
    profile_screenshot.screenshot(pathlib.Path(trace), png, CHROMIUM)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_view_is_the_last_steps_forward():
    us = 1000.0  # the trace's times are microseconds; the view's are milliseconds
    trace = {
        "traceEvents": [
            {"ph": "X", "name": "Scheduler.step", "ts": 0 * us, "dur": 10 * us},
            {"ph": "X", "name": "ModelRunner.forward", "ts": 1 * us, "dur": 8 * us},
            {"ph": "X", "name": "Scheduler.step", "ts": 20 * us, "dur": 10 * us},
            {"ph": "X", "name": "ModelRunner.forward", "ts": 22 * us, "dur": 7 * us},
            {"ph": "M", "name": "process_name"},
        ]
    }
    view = profile_screenshot.last_step_view(trace)
    assert view.total == 30 and view.start == pytest.approx(19.95) and view.end == pytest.approx(23)
    assert 22 < view.click < view.end
    # A tiny model on a fast CPU: a 0.85 ms step, a 0.4 ms forward. The window is still 1 ms wide,
    # and the click lands inside the forward, not after it.
    fast = {"traceEvents": [{"ph": "X", "name": "Scheduler.step", "ts": 0, "dur": 850}]}
    fast["traceEvents"].append({"ph": "X", "name": "ModelRunner.forward", "ts": 200, "dur": 400})
    view = profile_screenshot.last_step_view(fast)
    assert view.end - view.start >= 1 and 0.2 < view.click < 0.6
    with pytest.raises(ValueError, match="Scheduler.step"):
        profile_screenshot.last_step_view({"traceEvents": [{"ph": "X", "name": "x", "ts": 0}]})
