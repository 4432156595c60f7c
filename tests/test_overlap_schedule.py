"""The overlap loop (scheduler_overlap_mixin.py) against the normal loop on the same requests.

Outputs must be identical (token ids; logprobs to float tolerance, as batches may differ in
composition), with greedy and seeded sampling, the radix cache, chunked prefill, retraction,
grammars, logprobs and aborts, and the KV pool whole afterwards; and which loop each device
gets by default.
"""

import gc
import json
import os
import threading

import pytest
import torch

from minisgl import tracing
from minisgl.entrypoints.engine import Engine
from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.managers.overlap_utils import FutureMap, StreamExecutor
from minisgl.openmp_pool import _libgomp, release_openmp_workers
from minisgl.sampling.sampling_params import SamplingParams
from tests._traces import fresh_and_golden

PREFIX = [(7 * i) % 500 + 3 for i in range(40)]
PROMPTS = [PREFIX + [10 + i, 20 + i] for i in range(4)] + [[5, 6, 7], list(range(30, 90))]
MIXED = [
    {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True},
    {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_new_tokens": 10, "ignore_eos": True},
    {"temperature": 0, "max_new_tokens": 1},
    {"temperature": 1.0, "top_k": 20, "seed": 11, "max_new_tokens": 9, "ignore_eos": True},
    {"temperature": 0, "max_new_tokens": 6},  # may stop at EOS: a step decoded for nothing
    {"temperature": 0, "max_new_tokens": 8, "frequency_penalty": 0.5, "ignore_eos": True},
]


def _run(path: str, overlap: bool, **engine_kwargs) -> tuple[list[dict], Engine]:
    engine = Engine(model_path=path, disable_overlap_schedule=not overlap, **engine_kwargs)
    outs = engine.generate(input_ids=PROMPTS, sampling_params=MIXED, return_logprob=True, top_logprobs_num=2)
    return outs, engine


def _assert_pool_whole(engine: Engine) -> None:
    sched = engine.scheduler
    assert sched.is_idle() and not sched.deferred_releases and not sched.future_token_ids
    assert engine.flush_cache()
    assert sched.token_to_kv_pool_allocator.available_size() == sched.worker_info.max_total_num_tokens
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    for g, w in zip(got, want):
        assert g["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"]
        lp_g = [lp for lp, _, _ in g["meta_info"]["output_token_logprobs"]]
        lp_w = [lp for lp, _, _ in w["meta_info"]["output_token_logprobs"]]
        assert lp_g == pytest.approx(lp_w, abs=1e-4)


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        dict(max_total_tokens=2048),
        dict(max_total_tokens=2048, disable_radix_cache=True, chunked_prefill_size=16),
        dict(max_total_tokens=2048, page_size=4),
    ],
    ids=["radix", "chunked-no-radix", "page4"],
)
def test_overlap_outputs_equal_the_normal_loop(tiny_llama, engine_kwargs):
    want, normal = _run(tiny_llama, overlap=False, **engine_kwargs)
    got, overlap = _run(tiny_llama, overlap=True, **engine_kwargs)
    assert overlap.scheduler.enable_overlap and not normal.scheduler.enable_overlap
    _assert_same(got, want)
    _assert_pool_whole(overlap)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU's launch path)")
def test_overlap_on_a_gpu_launches_on_its_own_stream(tiny_llama):
    """On a GPU the forward is launched from the scheduler thread on a stream of its own
    (StreamExecutor), with CUDA graphs replayed there; the outputs are the normal loop's."""
    kwargs = dict(max_total_tokens=2048, device="cuda", disable_cuda_graph=False)
    want, _ = _run(tiny_llama, overlap=False, **kwargs)
    got, overlap = _run(tiny_llama, overlap=True, **kwargs)
    assert isinstance(overlap.scheduler.forward_executor, StreamExecutor)
    assert overlap.scheduler.tp_worker.model_runner.graph_runner is not None
    _assert_same(got, want)
    _assert_pool_whole(overlap)


def test_overlap_retracts_like_the_normal_loop(tiny_llama):
    prompts = [[(11 * i + j) % 400 + 3 for j in range(20)] for i in range(8)]
    params = [{"temperature": 0.7, "seed": i, "max_new_tokens": 40, "ignore_eos": True} for i in range(8)]
    runs = []
    for overlap in (False, True):
        engine = Engine(model_path=tiny_llama, max_total_tokens=200, disable_overlap_schedule=not overlap)
        runs.append([o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)])
        assert engine.scheduler.num_retracted_reqs > 0
        _assert_pool_whole(engine)
    assert runs[1] == runs[0]


def test_overlap_with_a_grammar(tiny_llama):
    params = [{"temperature": 0, "max_new_tokens": 12, "regex": "[a-z]+ [0-9]{2}"}, MIXED[0], MIXED[1]]
    runs = []
    for overlap in (False, True):
        engine = Engine(model_path=tiny_llama, max_total_tokens=2048, disable_overlap_schedule=not overlap)
        runs.append(engine.generate(input_ids=PROMPTS[:3], sampling_params=params))
        _assert_pool_whole(engine)
    assert [o["output_ids"] for o in runs[1]] == [o["output_ids"] for o in runs[0]]


SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
LATE = [  # each one's sampling reads its previous token on the host
    {"temperature": 0, "max_new_tokens": 10, "regex": "[a-z]+ [0-9]{2}"},
    {"temperature": 0.9, "seed": 5, "max_new_tokens": 12, "json_schema": SCHEMA},
    {"temperature": 0, "max_new_tokens": 10, "presence_penalty": 0.8, "repetition_penalty": 1.3, "ignore_eos": True},
    {"temperature": 0.7, "seed": 3, "max_new_tokens": 10, "min_new_tokens": 8},
    {"temperature": 0.8, "seed": 9, "max_new_tokens": 9, "frequency_penalty": 1.0, "ignore_eos": True},
]


@pytest.mark.parametrize(
    "engine_kwargs",
    [dict(max_total_tokens=2048), dict(max_total_tokens=2048, disable_radix_cache=True, chunked_prefill_size=16)],
    ids=["radix", "chunked-no-radix"],
)
def test_delayed_sampling_overlaps_grammars_and_penalties(tiny_llama, engine_kwargs):
    """Grammars, penalties and min_new_tokens read each request's previous token. Their batches are
    launched before the previous result is processed and sampled after it (delay_sample), and
    give the normal loop's tokens and logprobs."""
    prompts = PROMPTS[:5]
    engine = Engine(model_path=tiny_llama, **engine_kwargs)
    want = engine.generate(input_ids=prompts, sampling_params=LATE, return_logprob=True, top_logprobs_num=2)
    overlap = Engine(model_path=tiny_llama, disable_overlap_schedule=False, **engine_kwargs)
    with tracing.record() as events:
        got = overlap.generate(input_ids=prompts, sampling_params=LATE, return_logprob=True, top_logprobs_num=2)
    _assert_same(got, want)
    _assert_pool_whole(overlap)
    names = ("Scheduler.launch_batch", "Scheduler.launch_batch_sample", "Scheduler.process_batch_result")
    order = [(e["event"].removeprefix("Scheduler."), e["forward_mode"]) for e in events if e["event"] in names]
    names = [name for name, _ in order]
    decodes = [i for i, step in enumerate(order) if step == ("launch_batch", "DECODE")]
    assert len(decodes) >= 9 and names.count("launch_batch_sample") == names.count("launch_batch")
    # Every decode is launched before the previous result is processed (no sync) and sampled
    # right after that result. (A prefill right after a prefill waits, as without grammars.)
    for i in decodes:
        assert names[i + 1 : i + 3] == ["process_batch_result", "launch_batch_sample"]


def test_penalties_count_the_token_in_flight(tiny_llama):
    """Penalties alone (no grammar to delay the batch): sampled at launch, their counts would miss the
    token still in flight, as SGLang's do, and the logprobs would move; delayed, they are the normal loop's."""
    params = [
        {"temperature": 0, "max_new_tokens": 12, "frequency_penalty": 2.0, "ignore_eos": True},
        {"temperature": 0, "max_new_tokens": 12, "presence_penalty": 2.0, "ignore_eos": True},
        {"temperature": 0.8, "seed": 3, "max_new_tokens": 12, "repetition_penalty": 2.0, "ignore_eos": True},
    ]
    runs = []
    for overlap in (False, True):
        engine = Engine(model_path=tiny_llama, max_total_tokens=2048, disable_overlap_schedule=not overlap)
        runs.append(engine.generate(input_ids=PROMPTS[:3], sampling_params=params, return_logprob=True))
    _assert_same(runs[1], runs[0])


def test_delayed_sampling_under_tp2(tiny_llama):
    """Each rank delays the same batches: TP 2 in the overlap loop gives TP 1's tokens."""
    kw = dict(model_path=tiny_llama, max_total_tokens=2048, device="cpu", attention_backend="torch_native")
    want = Engine(**kw).generate(input_ids=PROMPTS[:5], sampling_params=LATE)
    with Engine(tp_size=2, disable_overlap_schedule=False, **kw) as engine:
        assert engine.get_server_info()["disable_overlap_schedule"] is False
        got = engine.generate(input_ids=PROMPTS[:5], sampling_params=LATE)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]


@pytest.mark.parametrize("penalty", [0.0, 0.5], ids=["sampled-at-once", "sampled-late"])
def test_aborts_in_flight_free_everything(tiny_llama, penalty):
    engine = Engine(model_path=tiny_llama, max_total_tokens=2048, disable_overlap_schedule=False)
    sched = engine.scheduler
    assert sched.enable_overlap
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True, frequency_penalty=penalty)
    for i, prompt in enumerate(PROMPTS):
        sched.handle_generate_request(TokenizedGenerateReqInput(f"r{i}", None, prompt, params))
    finished = {}
    for step in range(200):
        if step == 3:
            sched.abort_request("r0")  # decoding, with a batch in flight
        if step == 6:
            for i in range(1, len(PROMPTS)):
                sched.abort_request(f"r{i}")
        for out in sched.step():
            if out.finished:
                finished[out.rid] = out.meta_info["finish_reason"]["type"]
        if sched.is_idle():
            break
    assert finished == {f"r{i}": "abort" for i in range(len(PROMPTS))}
    _assert_pool_whole(engine)


def test_future_map_resolves_placeholders_in_place():
    fmap = FutureMap(max_running_requests=4, device="cpu")
    first = fmap.alloc_future_indices(3)
    fmap.store_to_map(first, torch.tensor([101, 102, 103]))
    input_ids = torch.tensor([5, first.placeholders()[2], first.placeholders()[0], 9])
    fmap.resolve_future(input_ids)
    assert input_ids.tolist() == [5, 103, 101, 9]
    # The buffer is circular: after three batches of the maximum size its slots are reused.
    slots = [[-p for p in fmap.alloc_future_indices(4).placeholders()] for _ in range(4)]
    assert min(min(s) for s in slots) >= 1 and max(max(s) for s in slots) < fmap.token_ids_buf.numel()


def test_overlap_golden_trace_matches():
    """Batch N+1 is launched before N's result is processed (traces/overlap_schedule.jsonl)."""
    fresh, golden = fresh_and_golden("overlap_schedule")
    assert fresh == golden, (
        "overlap trace changed: review, then python -m minisgl.tools.refresh_traces overlap_schedule"
    )
    order = [(e["event"], e.get("forward_mode")) for e in fresh if e["event"].startswith("Scheduler.")]
    # The first decode is launched before the prefill's result is processed.
    assert order[:3] == [
        ("Scheduler.launch_batch", "EXTEND"),
        ("Scheduler.launch_batch", "DECODE"),
        ("Scheduler.process_batch_result", "EXTEND"),
    ]


def test_delayed_sample_golden_trace_matches():
    """A grammar's batch: N+1 launched, N processed, then N+1 sampled (traces/overlap_delayed_sample.jsonl)."""
    fresh, golden = fresh_and_golden("overlap_delayed_sample")
    assert fresh == golden, (
        "delayed-sample trace changed: review, then python -m minisgl.tools.refresh_traces overlap_delayed_sample"
    )
    order = [(e["event"], e.get("forward_mode")) for e in fresh if e["event"].startswith("Scheduler.")]
    assert order[2:5] == [
        ("Scheduler.launch_batch", "DECODE"),
        ("Scheduler.process_batch_result", "EXTEND"),
        ("Scheduler.launch_batch_sample", "DECODE"),
    ]
    # Each mask is filled inside the sampling, on the forward thread, after the forward.
    events = [e["event"] for e in fresh if not e["event"].startswith("Scheduler.")]
    assert events.count("SamplingBatchInfo.update_regex_vocab_mask") == 3
    for i, event in enumerate(events):
        if event == "SamplingBatchInfo.update_regex_vocab_mask":
            assert events[i - 1] == "ModelRunner.sample" and events[i - 3] == "ModelRunner.forward"


def test_the_default_loop_is_per_device(tiny_llama):
    """Overlap on a GPU (SGLang's default); the normal loop on a CPU, where it measured faster."""
    from minisgl.server_args import ServerArgs

    assert ServerArgs(model_path=tiny_llama, device="cpu").disable_overlap_schedule is True
    assert ServerArgs(model_path=tiny_llama, device="cuda").disable_overlap_schedule is False
    forced = ServerArgs(model_path=tiny_llama, device="cpu", disable_overlap_schedule=False)
    assert forced.disable_overlap_schedule is False


def test_the_forward_thread_is_the_only_openmp_master(tiny_llama):
    """Two threads with OpenMP pools make libgomp sleep between ops (minisgl/openmp_pool.py): in the
    overlap loop the scheduler thread (here the caller's: the Engine's InlineDriver) runs its steps'
    ops on one thread and the forward thread on all of them, and holds no pool of its own; between
    steps, and after shutdown, which ends the forward thread, the caller keeps its own thread count."""
    threads = torch.get_num_threads()
    if threads < 2:
        pytest.skip("torch runs one thread here: there is no OpenMP pool to keep apart")
    engine = Engine(model_path=tiny_llama, disable_overlap_schedule=False, max_total_tokens=2048)
    scheduler, seen = engine.scheduler, []
    process = scheduler.process_batch_result

    def process_and_count(*args):  # runs on the scheduler thread, inside step_overlap
        seen.append(torch.get_num_threads())
        return process(*args)

    scheduler.process_batch_result = process_and_count
    try:
        engine.generate(input_ids=PROMPTS[:2], sampling_params={"temperature": 0, "max_new_tokens": 3})
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == threads
        gc.collect()  # an earlier test's executor collected now would end its thread inside the count below
        tasks = len(os.listdir("/proc/self/task"))  # this thread's pool, from loading the model, ended at start
        assert not release_openmp_workers() or len(os.listdir("/proc/self/task")) == tasks
        assert scheduler.forward_executor.submit(torch.get_num_threads).result() == threads
    finally:
        engine.shutdown()
    assert not any(t.is_alive() for t in scheduler.forward_executor._threads)


def test_release_ends_the_calling_threads_openmp_workers():
    """release_openmp_workers ends the OpenMP worker threads of the thread that calls it (their task
    ids in /proc: the ones its first parallel region started, so that a thread of an earlier test
    ending meanwhile is not counted); the thread keeps its thread count."""
    if torch.get_num_threads() < 2 or _libgomp() is None:
        pytest.skip("needs libgomp with omp_pause_resource_all and two torch threads")
    result = {}

    def tasks() -> set[str]:
        return set(os.listdir("/proc/self/task"))

    def run() -> None:
        torch.set_num_threads(2)
        before = tasks()
        torch.ones(1 << 22).sum()  # a parallel reduction: this thread gets a pool with one worker
        workers = tasks() - before
        result["workers"] = len(workers)
        result["released"] = release_openmp_workers()
        result["still_running"] = workers & tasks()
        result["threads"] = torch.get_num_threads()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert result == {"workers": 1, "released": True, "still_running": set(), "threads": 2}


def test_a_scheduler_thread_still_in_a_step_at_shutdown_ends_the_forward_thread_itself(tiny_llama):
    """The server's ThreadedDriver.shutdown waits `timeout` for the scheduler thread. If a step is
    still running then, the thread finishes it and ends the forward thread as it exits: it is the
    only thread that submits forwards, so the caller must not end the forward thread under it (that
    step's submit failed, and the request in it was aborted with an internal error)."""
    from minisgl.managers.scheduler_driver import ReqState, ThreadedDriver
    from minisgl.server_args import ServerArgs

    driver = ThreadedDriver(ServerArgs(model_path=tiny_llama, disable_overlap_schedule=False, max_total_tokens=2048))
    scheduler, entered, gate = driver.scheduler, threading.Event(), threading.Event()
    step = scheduler.step

    def held_step():
        entered.set()
        gate.wait(60)
        return step()

    scheduler.step = held_step
    params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    state = ReqState(None)  # no event loop: outputs collect in state.items
    driver.send([TokenizedGenerateReqInput("held", None, [5, 6, 7], params)], state)
    assert entered.wait(60)
    driver.shutdown(timeout=0.1)  # the scheduler thread is inside its step: the join times out
    gate.set()
    driver.thread.join(60)
    assert not driver.thread.is_alive() and driver.error is None
    assert not any(t.is_alive() for t in scheduler.forward_executor._threads)
    # The held request's step ran; then the stop reached it (SchedulerStoppedError), not an abort.
    aborted = [o for o in state.items if getattr(o, "finished", False) and "abort" in str(o.meta_info["finish_reason"])]
    assert not aborted, aborted
