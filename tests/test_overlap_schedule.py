"""The overlap loop (scheduler_overlap_mixin.py) against the normal loop on the same requests.

Outputs must be identical (token ids; logprobs to float tolerance, as batches may differ in
composition), with greedy and seeded sampling, the radix cache, chunked prefill, retraction,
grammars, logprobs and aborts, and the KV pool whole afterwards; and which loop each device
gets by default.
"""

import pytest
import torch

from minisgl.entrypoints.engine import Engine
from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.managers.overlap_utils import FutureMap, StreamExecutor
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


def test_aborts_in_flight_free_everything(tiny_llama):
    engine = Engine(model_path=tiny_llama, max_total_tokens=2048, disable_overlap_schedule=False)
    sched = engine.scheduler
    assert sched.enable_overlap
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
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


def test_the_default_loop_is_per_device(tiny_llama):
    """Overlap on a GPU (SGLang's default); the normal loop on a CPU, where it measured faster."""
    from minisgl.server_args import ServerArgs

    assert ServerArgs(model_path=tiny_llama, device="cpu").disable_overlap_schedule is True
    assert ServerArgs(model_path=tiny_llama, device="cuda").disable_overlap_schedule is False
    forced = ServerArgs(model_path=tiny_llama, device="cpu", disable_overlap_schedule=False)
    assert forced.disable_overlap_schedule is False
