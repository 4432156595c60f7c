"""Record a profile of minisgl and photograph it in Chromium's own trace viewer (the book's figure).

    pip install playwright            # the Python driver only; no browser download
    apt-get install chromium          # the browser it drives (Debian's package)
    python -m minisgl.tools.profile_screenshot --out docs/assets/figures/profiler_trace.png

Three steps, each what a reader would do by hand:

1. ``Engine.start_profile`` / ``generate`` / ``stop_profile`` on the default model (or
   ``--model-path``) writes the Chrome trace that ``/stop_profile`` writes
   (managers/scheduler_profiler.py); ``--trace FILE`` skips this and shows a trace you have.
2. Headless Chromium opens its bundled DevTools front end as a page of its own (its
   remote-debugging server serves ``/devtools/trace_app.html``, the Performance panel
   without a page to inspect) with ``?loadTimelineFromURL=`` pointing at the trace, served
   from a loopback HTTP server.
3. The view is zoomed to the start of the last scheduler step, the thread's track opened, the
   ``ModelRunner.forward`` span selected with a click (its Summary must name it: the check
   that the viewer read minisgl's spans), and the window saved as a PNG.

Why DevTools and not ``chrome://tracing``: Chromium 156 (Debian bookworm's) no longer has
the legacy trace viewer; ``chrome://tracing`` is listed among its debug pages but answers
``ERR_FAILED``. The Performance panel is the trace viewer Chromium ships now and reads the
same Trace Event Format. Perfetto's UI is not packaged on PyPI, apt or npm, so it is not
used here. The clicks are placed from the panel's geometry in Chromium 156; another
version may lay the tracks out differently, and the Summary check then fails by name.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import http.server
import json
import pathlib
import shutil
import socket
import tempfile
import threading
from typing import Iterator

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "assets" / "figures" / "profiler_trace.png"
SELECTED_SPAN = "ModelRunner.forward"
# Chromium 156's DevTools: where the thread's first span row sits below the flame chart's top, and row height.
FIRST_ROW_PX, ROW_PX = 59, 17


def record_profile(model_path: str, output_dir: str) -> str:
    """Profile two short greedy generations after a warm-up; the trace file's path."""
    from minisgl.entrypoints.engine import Engine

    with Engine(model_path=model_path) as engine:
        engine.generate("warm up", {"max_new_tokens": 2})  # keep first-call costs out of the trace
        engine.start_profile(output_dir=output_dir)
        engine.generate(["The river", "A short poem about"], {"max_new_tokens": 4, "temperature": 0})
        return engine.stop_profile()


@dataclasses.dataclass
class View:
    """Where to look, in ms from the trace's first event: the zoom window, the time to click
    (inside the last step's ModelRunner.forward), and the whole trace's length (the overview)."""

    start: float
    end: float
    click: float
    total: float


def last_step_view(trace: dict) -> View:
    """The start of the last ``Scheduler.step``: its batch set up, then the first layers' kernels
    under ``ModelRunner.forward`` (a tenth of the step, or 1 ms if longer: wide enough to read
    their names, and to zoom to)."""
    timed = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    t0 = min(float(e["ts"]) for e in timed)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed)
    steps = [e for e in timed if e["name"] == "Scheduler.step"]
    if not steps:
        raise ValueError("the trace has no Scheduler.step span: was it written while minisgl's spans were on?")
    step = max(steps, key=lambda e: float(e["ts"]))
    begin, dur = float(step["ts"]), float(step["dur"])
    forward = next(e for e in timed if e["name"] == SELECTED_SPAN and float(e["ts"]) >= begin)
    # At least 1 ms: with a tiny model on a fast CPU a tenth of the 0.85 ms step left a 0.29 ms
    # window, which Chromium 156's DevTools did not zoom to, so the click missed the forward.
    start, end = begin - 0.005 * dur, max(float(forward["ts"]) + 0.1 * dur, begin + 1000.0)
    # The middle of the forward's part in view: a short forward ends before the window does.
    click = (float(forward["ts"]) + min(end, float(forward["ts"]) + float(forward["dur"]))) / 2
    ms = lambda us: (us - t0) / 1e3  # noqa: E731
    return View(ms(start), ms(end), ms(click), ms(t1))


@contextlib.contextmanager
def serve_file(path: pathlib.Path) -> Iterator[str]:
    """The file at a loopback URL that a page of another origin (DevTools' own) may fetch."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def end_headers(self):
            self.send_header("Access-Control-Allow-Origin", "*")
            super().end_headers()

        def log_message(self, *args):
            pass

    handler = functools.partial(Handler, directory=str(path.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{path.name}"
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def screenshot(trace_path: pathlib.Path, out: pathlib.Path, chromium: str) -> None:
    from playwright.sync_api import sync_playwright

    out.parent.mkdir(parents=True, exist_ok=True)
    view = last_step_view(json.loads(trace_path.read_text()))
    port = _free_port()
    with serve_file(trace_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox", f"--remote-debugging-port={port}"]
        )
        # DevTools' content security policy lets it fetch only its own origin; the trace is
        # on another loopback port, so the policy is bypassed for this one page.
        page = browser.new_context(bypass_csp=True, viewport={"width": 1600, "height": 900}).new_page()
        page.goto(f"http://127.0.0.1:{port}/devtools/trace_app.html?loadTimelineFromURL={url}")
        page.get_by_label("Flame chart").first.wait_for(timeout=120_000)
        page.wait_for_timeout(1000)
        page.keyboard.press("Escape")  # the first-run shortcuts card; a second Escape ...
        page.get_by_label("Hide sidebar").first.click()
        page.wait_for_timeout(500)
        page.keyboard.press("Escape")  # ... closes the console drawer the first one opened
        # Zoom: drag across the window in the overview strip, which spans the whole trace.
        overview = page.get_by_label("Overview grid window").first.bounding_box()
        y = overview["y"] + overview["height"] * 0.7
        page.mouse.move(overview["x"] + overview["width"] * view.start / view.total, y)
        page.mouse.down()
        page.mouse.move(overview["x"] + overview["width"] * view.end / view.total, y, steps=10)
        page.mouse.up()
        page.wait_for_timeout(800)
        # Open the process's track, then its thread's (their headers' rows in the flame chart).
        chart = page.get_by_label("Flame chart").first.bounding_box()
        page.mouse.click(chart["x"] + 9, chart["y"] + 25)
        page.wait_for_timeout(500)
        page.mouse.click(chart["x"] + 20, chart["y"] + 42)
        page.wait_for_timeout(500)
        # Select ModelRunner.forward, the fifth row of the thread's flame chart (under
        # Engine.generate, Scheduler.step, Scheduler.run_batch, TpModelWorker.forward_batch_generation):
        # its Summary below must name it.
        click_x = chart["x"] + chart["width"] * (view.click - view.start) / (view.end - view.start)
        page.mouse.click(click_x, chart["y"] + FIRST_ROW_PX + 4 * ROW_PX)
        page.mouse.move(chart["x"] + chart["width"] / 2, chart["y"] + chart["height"] - 5)
        page.wait_for_timeout(1000)
        summary = page.locator(".timeline-details-chip-title-reveal-entry").all_inner_texts()
        page.screenshot(path=str(out))
        if SELECTED_SPAN not in summary:
            raise RuntimeError(f"DevTools' Summary shows {summary}, not {SELECTED_SPAN}: see {out}")
        browser.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    ap.add_argument("--trace", type=pathlib.Path, help="show this Chrome trace instead of recording one")
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="minisgl-profile-") as tmp:
        trace = args.trace or pathlib.Path(record_profile(args.model_path, tmp))
        screenshot(trace, args.out, args.chromium)
    print(f"{trace.name} -> {args.out}")


if __name__ == "__main__":
    main()
