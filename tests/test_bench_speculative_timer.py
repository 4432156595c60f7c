"""bench_speculative.py's draft and verify times: the draft extend that verify runs is counted once."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_speculative  # noqa: E402

from minisgl.speculative.eagle_worker import EAGLEWorker  # noqa: E402


class FakeClock:
    """time.perf_counter for the timer, advanced by the fake worker methods below."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_draft_extend_inside_verify_is_the_drafts_time_not_verifys(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_speculative.time, "perf_counter", clock)

    def draft(self):
        clock.now += 2.0

    def forward_draft_extend_after_decode(self):
        clock.now += 1.0

    def verify(self):
        clock.now += 5.0  # the target's forward and the accept walk
        self.forward_draft_extend_after_decode()

    # The timer wraps whatever the class holds when it starts: these stand in for the real methods.
    monkeypatch.setattr(EAGLEWorker, "draft", draft)
    monkeypatch.setattr(EAGLEWorker, "forward_draft_extend_after_decode", forward_draft_extend_after_decode)
    monkeypatch.setattr(EAGLEWorker, "verify", verify)
    worker = object.__new__(EAGLEWorker)
    with bench_speculative.phase_timer({}) as timings:
        for _ in range(2):  # two rounds
            worker.draft()
            worker.verify()
    assert timings["draft"] == 2 * (2.0 + 1.0)
    assert timings["verify"] == 2 * 5.0
    assert timings["verify_calls"] == 2
    assert EAGLEWorker.verify is verify  # the timer put the methods back
