"""Grammar compilation cannot be made unbounded work by one request (issue 33): a spec over
a size, depth or node limit is refused by name before compiling (no RecursionError); a
compilation past --grammar-compile-timeout ends its requests and its key fails fast after;
an aborted request's compilation that has not started is cancelled; the compiled-grammar
cache is an LRU; and large specs compile in a lane of their own, so two slow ones cannot
hold a small one behind them. Slow compilations are simulated by a compile that waits on an
event, so nothing here depends on how fast the machine is."""

import json
import threading
from concurrent.futures import Future

import pytest

from minisgl.constrained import base_grammar_backend
from minisgl.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject
from minisgl.entrypoints.engine import Engine
from tests.test_c7_constrained import assert_pool_whole

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama):
    return Engine(model_path=tiny_llama, max_total_tokens=512)


def _schema_of(n_properties: int) -> str:
    return json.dumps({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n_properties)}})


def _nested(depth: int) -> str:
    """A schema of ``depth`` objects one inside the next, written as text (json.dumps would recurse)."""
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"json_schema": _schema_of(2000)},
            "json_schema has 2002 objects and arrays; the limit is MAX_JSON_SCHEMA_NODES",
        ),
        ({"json_schema": _nested(500)}, "json_schema nests 1001 levels deep; the limit is MAX_JSON_SCHEMA_DEPTH = 32"),
        ({"json_schema": "[" * 5000}, "json_schema nests 5000 levels deep"),
        ({"regex": "a" * 70_000}, "regex is 70000 bytes; the limit is MAX_GRAMMAR_BYTES = 65536"),
    ],
)
def test_specs_over_the_limits_are_refused_by_name(tiny_engine, params, message):
    with pytest.raises(ValueError, match=message):
        tiny_engine.generate(prompt="hi", sampling_params={"max_new_tokens": 2, **params})
    assert_pool_whole(tiny_engine)  # refused before anything was queued


class _Template(BaseGrammarObject):
    def copy(self):
        return self


class _GatedBackend(BaseGrammarBackend):
    """Compiles a spec once its gate (spec -> Event) is set; ungated specs at once."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.gates: dict[str, threading.Event] = {}

    def dispatch_json(self, spec: str) -> BaseGrammarObject:
        gate = self.gates.get(spec)
        if gate is not None:
            gate.wait()
        return _Template()


def test_two_large_compilations_leave_a_small_one_a_thread():
    backend = _GatedBackend()
    large = [" " * base_grammar_backend.LARGE_GRAMMAR_BYTES + str(i) for i in range(2)]
    gate = threading.Event()
    backend.gates.update({spec: gate for spec in large})
    pending = [backend.get_cached_or_future_value(("json", spec)) for spec in large]
    small = backend.get_cached_or_future_value(("json", "{}"))
    try:
        assert isinstance(small.result(timeout=60), _Template)  # with one shared pool of 2 it would wait on `gate`
        assert not any(f.done() for f in pending)
    finally:
        gate.set()


def test_the_compiled_grammar_cache_is_an_lru():
    backend = _GatedBackend(max_cached=2)
    for spec in ("a", "b"):
        backend.get_cached_or_future_value(("json", spec)).result(timeout=60)
    backend.get_cached_or_future_value(("json", "a"))  # a hit: "a" is now the most recent
    backend.get_cached_or_future_value(("json", "c")).result(timeout=60)
    assert list(backend.cache) == [("json", "a"), ("json", "c")]


def _queue_regex(scheduler, rid: str, regex: str) -> None:
    from minisgl.managers.io_struct import TokenizedGenerateReqInput
    from minisgl.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=4, regex=regex)
    scheduler.handle_generate_request(TokenizedGenerateReqInput(rid, None, [5, 6], params))


def _gate_regexes(backend, monkeypatch, gated: dict[str, threading.Event]) -> None:
    compile_regex = backend.dispatch_regex

    def gated_compile(spec):
        if spec in gated:
            gated[spec].wait()
        return compile_regex(spec)

    monkeypatch.setattr(backend, "dispatch_regex", gated_compile)


def test_a_compilation_past_the_timeout_ends_its_request_and_fails_fast_after(tiny_engine, monkeypatch):
    scheduler = tiny_engine.scheduler
    manager = scheduler.grammar_manager
    backend = manager._get_backend()
    gate = threading.Event()
    _gate_regexes(backend, monkeypatch, {"[q-s]+": gate})
    monkeypatch.setattr(manager, "compile_timeout", 0.2)
    try:
        _queue_regex(scheduler, "late", "[q-s]+")
        outs = []
        for _ in range(1000):
            outs += scheduler.step()
            if outs:
                break
        (out,) = outs
        reason = out.meta_info["finish_reason"]
        assert reason["type"] == "abort" and "--grammar-compile-timeout 0.2 s" in reason["message"]
        # The same spec again: refused at once from the cache, not compiled (its gate is still shut).
        _queue_regex(scheduler, "again", "[q-s]+")
        (out,) = scheduler.step()
        assert out.rid == "again" and "--grammar-compile-timeout" in out.meta_info["finish_reason"]["message"]
    finally:
        gate.set()
        backend.cache.pop(("regex", "[q-s]+"), None)
    assert_pool_whole(tiny_engine)


def test_an_aborted_request_cancels_its_compilation_that_has_not_started(tiny_engine, monkeypatch):
    scheduler = tiny_engine.scheduler
    backend = scheduler.grammar_manager._get_backend()
    gate = threading.Event()
    _gate_regexes(backend, monkeypatch, {"[g-i]+": gate})
    try:
        _queue_regex(scheduler, "busy", "[g-i]+")  # holds the small lane's one thread
        _queue_regex(scheduler, "queued", "[j-l]+")  # waits behind it, not started
        assert scheduler.step() == []
        future = backend.cache[("regex", "[j-l]+")]
        scheduler.abort_request("queued")
        (out,) = scheduler.step()
        assert out.rid == "queued" and out.meta_info["finish_reason"]["type"] == "abort"
        assert future.cancelled() and ("regex", "[j-l]+") not in backend.cache
    finally:
        gate.set()
    outs = []
    for _ in range(1000):
        outs += scheduler.step()
        if scheduler.is_idle() and not scheduler.grammar_manager.has_waiting_grammars():
            break
    assert [o.rid for o in outs if o.finished] == ["busy"]
    assert_pool_whole(tiny_engine)


def test_set_failed_is_what_the_next_request_gets():
    backend = _GatedBackend()
    backend.set_failed(("json", "x"), ValueError("too slow"))
    future: Future = backend.get_cached_or_future_value(("json", "x"))
    with pytest.raises(ValueError, match="too slow"):
        future.result(timeout=0)
