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


def test_model_time_is_the_outermost_forward_inside_a_round(monkeypatch):
    from minisgl.model_executor.cpu_graph_runner import CPUGraphRunner
    from minisgl.model_executor.model_runner import ModelRunner

    clock = FakeClock()
    monkeypatch.setattr(bench_speculative.time, "perf_counter", clock)
    runner, graph = object.__new__(ModelRunner), object.__new__(CPUGraphRunner)

    def replay(self):
        clock.now += 3.0

    def forward(self):
        clock.now += 0.5  # the dispatch around the graph
        CPUGraphRunner.replay(graph)  # looked up at call time: the timer's wrapper, which must not count twice

    def draft(self):
        clock.now += 1.0  # the tree, in Python
        CPUGraphRunner.replay(graph)  # EAGLE's draft extend replays its graph itself

    def verify(self):
        ModelRunner.forward(runner)
        clock.now += 0.25  # the accept walk

    monkeypatch.setattr(CPUGraphRunner, "replay", replay)
    monkeypatch.setattr(ModelRunner, "forward", forward)
    monkeypatch.setattr(EAGLEWorker, "draft", draft)
    monkeypatch.setattr(EAGLEWorker, "verify", verify)
    worker = object.__new__(EAGLEWorker)
    with bench_speculative.phase_timer({}) as timings:
        ModelRunner.forward(runner)  # a prefill: outside any round, not counted
        worker.draft()
        worker.verify()
    assert timings["draft"] == 4.0
    assert timings["verify"] == 3.75
    assert timings["model"] == 3.0 + 3.5  # the draft's replay, then the verify's forward with its replay inside
    assert ModelRunner.forward is forward and CPUGraphRunner.replay is replay
