"""CPUGraphRunner (model_executor/cpu_graph_runner.py) and the GraphRunner buffers it shares with
the CUDA runner: the bucket and padding logic (fast), and compiled decode against eager (slow:
inductor takes 20 s to minutes per bucket on a loaded machine, less once its on-disk cache is warm)."""

import json
import os
import shutil
import subprocess
import sys
import types

import pytest
import torch
from torch._inductor.utils import run_and_get_cpp_code

from minisgl.entrypoints.engine import Engine
from minisgl.kernels.cpu import can_build, is_available
from minisgl.layers.logits_processor import LogitsProcessor
from minisgl.model_executor import cpu_graph_runner
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from minisgl.model_executor.graph_runner import GraphRunner, get_batch_sizes_to_capture
from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH
from tests._models import tiny_model_dir
from tests.test_overlap_schedule import MIXED, PROMPTS, _assert_pool_whole, _assert_same


class _Runner(GraphRunner):
    def capture(self) -> None: ...

    def replay(self, forward_batch): ...


def test_buckets_and_padding():
    assert get_batch_sizes_to_capture(32) == [1, 2, 4, 8, 16, 24, 32]
    assert get_batch_sizes_to_capture(5) == [1, 2, 4, 5]
    model_runner = types.SimpleNamespace(device="cpu", req_to_token_pool=types.SimpleNamespace(size=12))
    runner = _Runner(model_runner, max_bs=32)
    assert runner.capture_bs == [1, 2, 4, 8, 12]  # never more than the request slots
    assert [runner.padded_batch_size(n) for n in (1, 3, 4, 5, 9, 12)] == [1, 4, 4, 8, 12, 12]
    batch = types.SimpleNamespace(
        batch_size=3,
        input_ids=torch.tensor([7, 8, 9]),
        req_pool_indices=torch.tensor([3, 1, 2]),
        seq_lens=torch.tensor([10, 5, 7]),
        out_cache_loc=torch.tensor([40, 41, 42]),
        positions=torch.tensor([9, 4, 6]),  # ForwardBatch.init_new's seq_lens - 1
    )
    runner.seq_lens.fill_(99)  # left over from an earlier, larger batch
    assert runner.load_inputs(batch) == 4
    # Padding row 3: length 1 at position 0, reading and writing only the dummy slot 0.
    assert runner.seq_lens[:4].tolist() == [10, 5, 7, 1]
    assert runner.positions[:4].tolist() == [9, 4, 6, 0]
    assert runner.out_cache_loc[:4].tolist() == [40, 41, 42, 0]
    assert runner.req_pool_indices[:4].tolist() == [3, 1, 2, 0]
    assert runner.input_ids[:3].tolist() == [7, 8, 9]
    assert runner.can_run(
        types.SimpleNamespace(
            forward_mode=ForwardMode.DECODE, batch_size=12, capture_hidden_mode=CaptureHiddenMode.NULL
        )
    )
    assert not runner.can_run(
        types.SimpleNamespace(
            forward_mode=ForwardMode.DECODE, batch_size=13, capture_hidden_mode=CaptureHiddenMode.NULL
        )
    )


def test_verify_buffers_and_padding():
    """An EAGLE target's verify: n tokens a request, the tree's mask copied to the front of a buffer
    sized for the longest rows; a padding request is n tokens without a prefix in the dummy slot 0,
    seeing each other causally, its mask right after the real ones."""
    pool = types.SimpleNamespace(size=8, req_to_token=torch.zeros(8, 16, dtype=torch.int32))
    model_runner = types.SimpleNamespace(device="cpu", req_to_token_pool=pool, token_to_kv_pool=None, attn_backend=None)
    runner = _Runner(model_runner, 4, num_tokens_per_bs=2, tree_mask=True)
    assert runner.capture_forward_mode == ForwardMode.TARGET_VERIFY and runner.custom_mask.numel() == 4 * 2 * 16
    # Three requests with a prefix of one and two sibling nodes: each [2, 3] block sees the prefix and itself.
    mask = torch.tensor([1, 1, 0, 1, 0, 1] * 3, dtype=torch.bool)
    batch = types.SimpleNamespace(
        batch_size=3,
        input_ids=torch.arange(6),
        req_pool_indices=torch.tensor([3, 1, 2]),
        seq_lens=torch.tensor([3, 3, 3]),
        out_cache_loc=torch.arange(20, 26),
        positions=torch.tensor([1, 2] * 3),
        spec_info=types.SimpleNamespace(custom_mask=mask),
        forward_mode=ForwardMode.TARGET_VERIFY,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        return_logprob=False,
        extend_num_tokens=6,
    )
    runner.custom_mask.fill_(True)
    runner.out_cache_loc.fill_(99)  # left over from an earlier, larger batch
    assert runner.load_inputs(batch) == 4
    assert runner.seq_lens.tolist() == [3, 3, 3, 2]
    assert runner.out_cache_loc.tolist() == [20, 21, 22, 23, 24, 25, 0, 0]
    assert runner.positions.tolist() == [1, 2, 1, 2, 1, 2, 0, 0]
    assert runner.req_pool_indices.tolist() == [3, 1, 2, 0]
    assert runner.custom_mask[:18].tolist() == mask.tolist()
    assert runner.custom_mask[18:22].tolist() == [True, False, True, True]
    assert runner.can_run(batch)
    assert not runner.can_run(types.SimpleNamespace(**{**vars(batch), "return_logprob": True}))
    assert not runner.can_run(types.SimpleNamespace(**{**vars(batch), "extend_num_tokens": 5}))
    assert not runner.can_run(types.SimpleNamespace(**{**vars(batch), "forward_mode": ForwardMode.DECODE}))
    static = runner.static_batch(4)
    assert static.forward_mode == ForwardMode.TARGET_VERIFY and static.spec_info.custom_mask is runner.custom_mask
    assert static.extend_start_loc.tolist() == [0, 2, 4, 6] and static.input_ids.numel() == 8
    assert static.capture_hidden_mode == CaptureHiddenMode.FULL


def test_draft_step_buffers_and_padding():
    """An EAGLE head's draft step: topk one-token lanes a request, each a row of the graph's batch
    with its feature row and its [1, seq_len] mask; a padding lane is one token in slot 0 that
    sees itself. A draft extend of one token a request fits the chain's graph, not the tree's."""
    pool = types.SimpleNamespace(size=2, req_to_token=torch.zeros(2, 8, dtype=torch.int32))
    model_runner = types.SimpleNamespace(
        device="cpu",
        req_to_token_pool=pool,
        token_to_kv_pool=None,
        attn_backend=None,
        model_config=types.SimpleNamespace(hidden_size=3),
        dtype=torch.float32,
    )
    runner = _Runner(model_runner, 4, tree_mask=True, draft_lanes=2)
    assert runner.capture_bs == [1, 2, 4]  # lanes: two requests (the pool's slots) of two lanes
    assert runner.capture_forward_mode == ForwardMode.DRAFT_EXTEND and runner.custom_mask.numel() == 4 * 8
    # One request, prefix 2, step 1: the lanes at positions 3 see the prefix, their parent, themselves.
    mask = torch.tensor([1, 1, 1, 0, 1, 1, 1, 0, 1, 1], dtype=torch.bool)
    hidden = torch.arange(6.0).view(2, 3)
    batch = types.SimpleNamespace(
        batch_size=2,
        input_ids=torch.tensor([5, 6]),
        req_pool_indices=torch.tensor([1, 1]),
        seq_lens=torch.tensor([5, 5]),
        out_cache_loc=torch.tensor([30, 31]),
        positions=torch.tensor([3, 3]),
        spec_info=types.SimpleNamespace(custom_mask=mask, hidden_states=hidden),
        forward_mode=ForwardMode.DRAFT_EXTEND,
        capture_hidden_mode=CaptureHiddenMode.LAST,
        return_logprob=False,
        extend_num_tokens=2,
    )
    assert runner.load_inputs(batch) == 2 and runner.hidden_states[:2].tolist() == hidden.tolist()
    assert runner.custom_mask[:10].tolist() == mask.tolist()
    assert runner.can_run(batch)
    batch.batch_size = batch.extend_num_tokens = 3  # three lanes: one padding lane
    batch.input_ids, batch.req_pool_indices = torch.tensor([5, 6, 7]), torch.tensor([1, 1, 0])
    batch.seq_lens, batch.out_cache_loc, batch.positions = torch.tensor([5, 5, 4]), torch.arange(3), torch.arange(3)
    batch.spec_info.hidden_states = torch.ones(3, 3)
    batch.spec_info.custom_mask = torch.cat([mask, torch.ones(4, dtype=torch.bool)])
    assert runner.load_inputs(batch) == 4
    assert runner.seq_lens.tolist() == [5, 5, 4, 1] and runner.out_cache_loc.tolist() == [0, 1, 2, 0]
    assert runner.custom_mask[14].item() and runner.positions.tolist() == [0, 1, 2, 0]
    # In a tree's graph, a draft extend (no mask) and EAGLE3's first (three layers' features) run eagerly.
    assert not runner.can_run(
        types.SimpleNamespace(
            **{**vars(batch), "spec_info": types.SimpleNamespace(custom_mask=None, hidden_states=hidden)}
        )
    )
    assert not runner.can_run(
        types.SimpleNamespace(
            **{**vars(batch), "spec_info": types.SimpleNamespace(custom_mask=mask, hidden_states=torch.zeros(2, 9))}
        )
    )
    assert not runner.can_run(types.SimpleNamespace(**{**vars(batch), "extend_num_tokens": 4}))
    static = runner.static_batch(4)
    assert static.capture_hidden_mode == CaptureHiddenMode.LAST and static.extend_seq_lens.tolist() == [1] * 4
    assert static.spec_info.hidden_states.data_ptr() == runner.hidden_states.data_ptr()


def test_draft_extend_buffers_and_padding():
    """An EAGLE head's draft extend after verify: each request's 1 to k + 1 accepted tokens at the
    start of its k + 1 rows, the real counts in extend_seq_lens; every other row is token 0 at
    position 0 in slot 0, even where the last round put a real token; a padding request is k + 1
    tokens with no prefix. LogitsProcessor's last row of each request is then start + count - 1."""
    pool = types.SimpleNamespace(size=4, req_to_token=torch.zeros(4, 16, dtype=torch.int32))
    model_runner = types.SimpleNamespace(
        device="cpu", req_to_token_pool=pool, token_to_kv_pool=None, attn_backend=None, dtype=torch.float32
    )
    runner = _Runner(model_runner, 4, num_tokens_per_bs=3, extend_features=2)
    assert runner.capture_forward_mode == ForwardMode.DRAFT_EXTEND and runner.custom_mask is None
    assert tuple(runner.hidden_states.shape) == (4 * 3, 2)

    def batch(lens, first_token):
        tokens = sum(lens)
        return types.SimpleNamespace(
            batch_size=len(lens),
            input_ids=torch.arange(first_token, first_token + tokens),
            req_pool_indices=torch.arange(1, len(lens) + 1),
            seq_lens=torch.tensor([10 + n for n in lens]),
            out_cache_loc=torch.arange(100, 100 + tokens),
            positions=torch.arange(50, 50 + tokens),
            extend_seq_lens=torch.tensor(lens),
            extend_seq_lens_cpu=lens,
            spec_info=types.SimpleNamespace(custom_mask=None, hidden_states=torch.arange(2.0 * tokens).view(tokens, 2)),
            forward_mode=ForwardMode.DRAFT_EXTEND,
            capture_hidden_mode=CaptureHiddenMode.LAST,
            return_logprob=False,
        )

    full = batch([3, 3, 3, 3], 1)  # every row real: the next batch must not keep these
    assert runner.can_run(full) and runner.load_inputs(full) == 4
    short = batch([1, 3, 2], 20)
    assert runner.can_run(short) and runner.load_inputs(short) == 4
    assert runner.input_ids.tolist() == [20, 0, 0, 21, 22, 23, 24, 25, 0, 0, 0, 0]
    assert runner.out_cache_loc.tolist() == [100, 0, 0, 101, 102, 103, 104, 105, 0, 0, 0, 0]
    assert runner.positions.tolist() == [50, 0, 0, 51, 52, 53, 54, 55, 0, 0, 0, 0]
    assert runner.hidden_states[[0, 3, 4, 5, 6, 7], 0].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert runner.extend_seq_lens.tolist() == [1, 3, 2, 3] and runner.seq_lens.tolist() == [11, 13, 12, 3]
    assert runner.req_pool_indices.tolist() == [1, 2, 3, 0]
    static = runner.static_batch(4)
    assert static.capture_hidden_mode == CaptureHiddenMode.LAST and static.input_ids.numel() == 12
    # LogitsProcessor keeps each request's last token: rows 0, 5, 7 and 11 (the padding's last).
    features = torch.arange(12.0)[:, None].repeat(1, 2)
    identity = types.SimpleNamespace(quant_method=None, gemm_weight=torch.eye(2))
    out = LogitsProcessor(2)(None, features, identity, static)
    assert out.hidden_states[:, 0].tolist() == out.next_token_logits[:, 0].tolist() == [0.0, 5.0, 7.0, 11.0]
    # Longer than k + 1 (a prompt's draft extend), a tree's mask or another feature width: eager.
    assert not runner.can_run(batch([4, 1], 0))
    with_mask = batch([1, 2], 0)
    with_mask.spec_info.custom_mask = torch.ones(3, dtype=torch.bool)
    assert not runner.can_run(with_mask)
    wide = batch([1, 2], 0)
    wide.spec_info.hidden_states = torch.zeros(3, 6)
    assert not runner.can_run(wide)


@pytest.mark.slow
@pytest.mark.skipif(not can_build(), reason="CPUGraphRunner needs minisgl's C++ CPU kernels (intel_amx backend)")
def test_compiled_decode_equals_eager(tiny_llama):
    prompts = [[5, 6, 7, 8, 9 + i] for i in range(3)]
    params = [
        {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
        {"temperature": 0.9, "seed": 3, "max_new_tokens": 8, "ignore_eos": True},
        {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True},
    ]
    eager = Engine(model_path=tiny_llama, max_total_tokens=2048)
    want = eager.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    compiled = Engine(model_path=tiny_llama, max_total_tokens=2048, enable_torch_compile=True, torch_compile_max_bs=4)
    got, code = run_and_get_cpp_code(compiled.generate, input_ids=prompts, sampling_params=params, return_logprob=True)
    # The graph calls minisgl's kernels as C functions (kernels/cpu/aoti_shims.cpp), not through the dispatcher.
    assert "aoti_torch_cpu_weight_packed_linear(" in code and "aoti_torch_cpu_decode_attention_cpu(" in code
    assert "aoti_torch_call_dispatcher" not in code
    runner = compiled.scheduler.tp_worker.model_runner.graph_runner
    assert type(runner).__name__ == "CPUGraphRunner" and eager.scheduler.tp_worker.model_runner.graph_runner is None
    assert set(runner.compile_seconds) <= {2, 4} and 4 in runner.compile_seconds  # 3 and 2 running, padded
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    for g, w in zip(got, want):
        lp_g = [lp for lp, _, _ in g["meta_info"]["output_token_logprobs"]]
        lp_w = [lp for lp, _, _ in w["meta_info"]["output_token_logprobs"]]
        assert lp_g == pytest.approx(lp_w, abs=1e-4)


COMPILE = dict(enable_torch_compile=True, torch_compile_max_bs=8)
GREEDY_12 = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
needs_kernels = pytest.mark.skipif(not can_build(), reason="CPUGraphRunner needs minisgl's C++ CPU kernels")


@pytest.mark.slow
@needs_kernels
@pytest.mark.parametrize(
    "engine_kwargs",
    [
        dict(max_total_tokens=2048),
        dict(max_total_tokens=2048, disable_radix_cache=True, chunked_prefill_size=16),
        dict(max_total_tokens=2048, disable_overlap_schedule=False),
        dict(max_total_tokens=2048, kv_cache_dtype="bfloat16"),  # the kernels' float32 x bfloat16 path
        dict(max_total_tokens=2048, kv_cache_dtype="fp8_e5m2"),  # and float32 x float8 e5m2
    ],
    ids=["radix", "chunked-no-radix", "overlap", "bf16-kv", "fp8-kv"],
)
def test_graph_runner_equals_eager(tiny_llama, engine_kwargs):
    """Greedy, seeded and penalised requests, logprobs and the radix cache, eager and compiled."""

    def run(**extra):
        engine = Engine(model_path=tiny_llama, **engine_kwargs, **extra)
        outs = engine.generate(input_ids=PROMPTS, sampling_params=MIXED, return_logprob=True, top_logprobs_num=2)
        return outs, engine

    want, _ = run()
    got, engine = run(**COMPILE)
    assert engine.scheduler.tp_worker.model_runner.graph_runner.compile_seconds  # decode ran compiled
    _assert_same(got, want)
    _assert_pool_whole(engine)


@pytest.mark.slow
@needs_kernels
def test_graph_runner_retracts_and_follows_a_grammar_like_eager(tiny_llama):
    prompts = [[(11 * i + j) % 400 + 3 for j in range(20)] for i in range(8)]
    params = [{"temperature": 0.7, "seed": i, "max_new_tokens": 40, "ignore_eos": True} for i in range(7)]
    params.append({"temperature": 0, "max_new_tokens": 12, "regex": "[a-z]+ [0-9]{2}"})
    runs = []
    for extra in ({}, COMPILE):
        engine = Engine(model_path=tiny_llama, max_total_tokens=200, **extra)
        runs.append([o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)])
        assert engine.scheduler.num_retracted_reqs > 0
        _assert_pool_whole(engine)
    assert runs[1] == runs[0]


@pytest.mark.slow
@needs_kernels
def test_graph_runner_under_tp2_equals_eager():
    path = tiny_model_dir("qwen3")
    prompts, params = PROMPTS[:4], MIXED[:4]
    want = Engine(model_path=path, max_total_tokens=2048).generate(
        input_ids=prompts, sampling_params=params, return_logprob=True
    )
    with Engine(model_path=path, max_total_tokens=2048, tp_size=2, **COMPILE) as engine:
        got = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        assert engine.flush_cache()
    _assert_same(got, want)


@pytest.mark.slow
@needs_kernels
@pytest.mark.parametrize("quantization", ["w8a8_int8", "gguf"])
def test_graph_runner_runs_quantized_linears(tiny_llama, quantization):
    """The quantized GEMMs trace too (their fake ops): w8a8 on the tiny model, the default model's Q4_1 kept."""
    path = tiny_llama if quantization == "w8a8_int8" else DEFAULT_MODEL_PATH
    runs = []
    for extra in ({}, dict(COMPILE, torch_compile_max_bs=1)):  # one bucket: the default model compiles slowly
        with Engine(model_path=path, quantization=quantization, **extra) as engine:
            runs.append(engine.generate(input_ids=list(range(100, 120)), sampling_params=GREEDY_12)["output_ids"])
    assert runs[1] == runs[0]


@pytest.mark.slow
@needs_kernels
def test_two_models_of_one_class_in_one_process_keep_their_own_graphs(tiny_llama, tmp_path):
    """Dynamo keeps compiled graphs on the code object; each runner compiles a code object of its own and
    replays its own graphs, so a second Llama of the same shapes never replays the first one's graph,
    with the first one's RMSNorm epsilon inside it (it did when the runner dropped dynamo's guards on
    the model's modules and shared the code object)."""
    other = tmp_path / "llama-eps"
    shutil.copytree(tiny_llama, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.5}))
    prompt, compile_1 = [5, 6, 7], dict(COMPILE, torch_compile_max_bs=1)
    eager = [
        Engine(model_path=str(path), max_total_tokens=512).generate(input_ids=prompt, sampling_params=GREEDY_12)
        for path in (tiny_llama, other)
    ]
    assert eager[0]["output_ids"] != eager[1]["output_ids"]  # the epsilon shows in the tokens
    for path, want in zip((tiny_llama, other), eager):
        engine = Engine(model_path=str(path), max_total_tokens=512, **compile_1)
        assert engine.generate(input_ids=prompt, sampling_params=GREEDY_12)["output_ids"] == want["output_ids"]


@pytest.mark.slow
@needs_kernels
def test_replay_runs_the_compiled_graph_without_dynamo(tiny_llama):
    """After a bucket's first step, replay calls its compiled graph on the tensors it was traced on:
    with the dynamo-wrapped forward made to fail, the next requests still decode, as eager does."""
    prompts = [[5, 6, 7], [8, 9]]
    want = Engine(model_path=tiny_llama, max_total_tokens=512).generate(input_ids=prompts, sampling_params=GREEDY_12)
    engine = Engine(model_path=tiny_llama, max_total_tokens=512, **dict(COMPILE, torch_compile_max_bs=2))
    runner = engine.scheduler.tp_worker.model_runner.graph_runner
    short = [{**GREEDY_12, "max_new_tokens": n} for n in (3, 5)]
    engine.generate(input_ids=prompts, sampling_params=short)
    assert set(runner.graphs) == {1, 2}  # two requests, then the longer one alone

    def dynamo(*args):
        raise AssertionError("replay entered dynamo")

    runner.compiled_forward = dynamo
    got = engine.generate(input_ids=prompts, sampling_params=GREEDY_12)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]


@needs_kernels
def test_a_graph_input_that_does_not_outlive_the_step_is_refused(tiny_llama):
    """A replay passes the traced tensors again, so each must be a parameter, a static buffer or a pool."""
    engine = Engine(model_path=tiny_llama, max_total_tokens=512, **dict(COMPILE, torch_compile_max_bs=1))
    runner = engine.scheduler.tp_worker.model_runner.graph_runner
    params = list(engine.scheduler.tp_worker.model_runner.model.parameters())
    gm = torch.fx.symbolic_trace(lambda weight, scratch: weight * scratch)
    with pytest.raises(RuntimeError, match="graph input scratch is not a tensor that outlives the step"):
        runner._compile_bucket(gm, [params[0], torch.ones_like(params[0])])
    engine.shutdown()


def test_torch_compile_is_refused_where_no_graph_runner_serves_it(tiny_llama):
    with pytest.raises(ValueError, match="enable_torch_compile"):
        Engine(model_path=tiny_llama, enable_torch_compile=True, attention_backend="torch_native")


@pytest.mark.slow
@needs_kernels
@pytest.mark.parametrize(
    "arch, dtype, quantization",
    [
        ("mixtral", "float32", None),
        ("mixtral", "bfloat16", None),
        ("qwen3_moe", "float32", None),
        ("qwen3_moe", "bfloat16", None),
        ("qwen3_moe", "float32", "w8a8_int8"),  # fused_experts_int8_cpu, in this CPU's int8 layout
    ],
)
def test_graph_runner_traces_the_fused_moe_like_eager(arch, dtype, quantization):
    """The fused experts kernel through its fake op, the narrow router through oneDNN's linear."""
    kwargs = dict(model_path=tiny_model_dir(arch), dtype=dtype, quantization=quantization, max_total_tokens=2048)
    prompts, params = PROMPTS[:4], MIXED[:4]
    want = Engine(**kwargs).generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    engine = Engine(**kwargs, **COMPILE)
    got = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    assert engine.scheduler.tp_worker.model_runner.graph_runner.compile_seconds  # decode ran compiled
    _assert_same(got, want)
    _assert_pool_whole(engine)


def test_torch_compile_is_refused_where_experts_run_in_a_loop(monkeypatch):
    """At start-up, by name: a failed trace at the first decode would abort that batch's requests."""
    import minisgl.layers.quantization.unquant as unquant

    monkeypatch.setattr(unquant, "has_packed_gemm", lambda: False)  # no fused layout: experts packed for the loop
    with pytest.raises(ValueError, match="UnquantizedFusedMoEMethod runs these experts in a loop"):
        Engine(model_path=tiny_model_dir("mixtral"), max_total_tokens=512, enable_torch_compile=True)


def test_torch_compile_is_refused_beside_the_moe_observers():
    """Their hooks run Python on every forward; compiled, they would be skipped (it used to be, silently)."""
    for observer in (dict(enable_return_routed_experts=True), dict(expert_distribution_recorder_mode="stat")):
        with pytest.raises(ValueError, match="enable_torch_compile with enable_return_routed_experts"):
            Engine(model_path=tiny_model_dir("mixtral"), max_total_tokens=512, enable_torch_compile=True, **observer)


def test_torch_compile_is_refused_for_mla_attention():
    with pytest.raises(ValueError, match="does not trace MLA attention"):
        Engine(model_path=tiny_model_dir("deepseek_v2"), max_total_tokens=512, enable_torch_compile=True)


class _FakeCheck(torch.utils._python_dispatch.TorchDispatchMode):
    """Calls each of minisgl's faked ops again on fake tensors and records where the two disagree
    on an output's shape, stride or dtype: the compiled graph trusts the fakes without checking
    (size_asserts off). Recorded, not raised: the scheduler would catch it and abort the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()
        self.mismatches: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils import _pytree as pytree

        out = func(*args, **(kwargs or {}))
        name = func._schema.name.partition("::")[2]
        if func.namespace == "minisgl_kernel" and name in cpu_graph_runner._FAKE_OPS:
            with FakeTensorMode() as mode:
                fake_args, fake_kwargs = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs or {}))
                fake_out = func(*fake_args, **fake_kwargs)
            real, fake = (
                [(t.shape, t.stride(), t.dtype) for t in pytree.tree_leaves(x) if t is not None]
                for x in (out, fake_out)
            )
            if fake != real:
                self.mismatches.append(f"{name}: fake {fake}, kernel {real}")
            self.seen.add(name)
        return out


@pytest.fixture
def faked_ops() -> list[str]:
    """The ops a compiled graph may call, their fakes registered (the kernels loaded first)."""
    assert is_available()
    cpu_graph_runner.register_fake_ops()
    return cpu_graph_runner._FAKE_OPS


@needs_kernels
def test_every_fake_op_returns_what_its_kernel_returns(tiny_llama, faked_ops):
    """Eager prefills and decodes of the dense and MoE tiny models, in float and W8A8, and of the
    default model's Q4_1 blocks call every op a graph may call; each fake agrees with its kernel."""
    check = _FakeCheck()
    runs = [
        dict(model_path=tiny_llama),
        dict(model_path=tiny_llama, quantization="w8a8_int8"),
        dict(model_path=tiny_model_dir("qwen3_moe")),
        dict(model_path=tiny_model_dir("qwen3_moe"), quantization="w8a8_int8"),
        dict(model_path=DEFAULT_MODEL_PATH, quantization="gguf", context_length=256),
    ]
    for kwargs in runs:
        with Engine(**kwargs, max_total_tokens=512, disable_overlap_schedule=True) as engine, check:
            # 2 x 9 prompt tokens: a prefill of more than gguf's MMVQ_MAX_ROWS, decodes of fewer.
            engine.generate(input_ids=[list(range(5, 14))] * 2, sampling_params={**GREEDY_12, "max_new_tokens": 3})
    assert check.mismatches == []
    assert check.seen == set(faked_ops)


@needs_kernels
def test_the_c_shims_config_pickles_into_inductors_cache_key(faked_ops):
    """Inductor pickles its config into each graph's cache key; an op overload does not pickle, and
    a config holding them made every compile bypass the on-disk cache."""
    import pickle

    shims = cpu_graph_runner.c_shim_declarations()
    assert len(shims) == len(faked_ops)
    assert pickle.loads(pickle.dumps(shims)) == {str(op): declarations for op, declarations in shims.items()}


_RESTART = """
import sys
from torch._dynamo.utils import counters
from minisgl.entrypoints.engine import Engine
engine = Engine(model_path=sys.argv[1], max_total_tokens=int(sys.argv[2]), enable_torch_compile=True,
                torch_compile_max_bs=1)
out = engine.generate(input_ids=[5, 6, 7], sampling_params={"temperature": 0, "max_new_tokens": 8})
assert engine.scheduler.tp_worker.model_runner.graph_runner.compile_seconds  # the step ran compiled
print(counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_bypass"], out["output_ids"])
"""


@pytest.mark.slow
@needs_kernels
def test_a_restart_with_another_pool_size_finds_its_graphs_in_inductors_cache(tiny_llama, tmp_path):
    """The pool's slot count enters a graph as a symbol (CPUGraphRunner.capture), so a second process
    whose pool differs, as one sized from free memory does after a restart, reuses the first's graph."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}  # an empty cache, then the first's
    runs = [
        subprocess.run([sys.executable, "-c", _RESTART, tiny_llama, str(pool)], env=env, capture_output=True, text=True)
        for pool in (1_000, 1_100)
    ]
    assert [run.returncode for run in runs] == [0, 0], runs[-1].stderr[-2000:]
    (compiled_first, out_first), (compiled_second, out_second) = (run.stdout.split(" ", 1) for run in runs)
    assert (compiled_first, compiled_second) == ("1", "0") and out_first == out_second
