"""--kv-cache-dtype (SGLang's flag): a float32 model whose KV pool holds bfloat16 or float8 (e5m2, e4m3).

The kernels themselves are checked against SDPA on the same rounded K/V in
tests/kernels/test_cpu_kernels.py; here the whole engine against Hugging Face's float32 model with
its cached K/V rounded the same way (llama: the rotated keys and the values; DeepSeek's MLA: the
normalized latent and the rotated rope key), on the sequences the engine generated, through chunked
prefill over a cached prefix, decode and the radix cache, with every slot back in the pool afterwards.
"""

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.deepseek_v2 import modeling_deepseek_v2
from transformers.models.llama import modeling_llama

from minisgl.entrypoints.engine import Engine
from minisgl.kernels.cpu import is_available
from minisgl.server_args import KV_CACHE_DTYPES, ServerArgs
from tests._models import tiny_model_dir

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [10, 11], [5, 6, 7, 8, 9, 14, 15], [19]]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
BACKENDS = ["torch_native", pytest.param("intel_amx", marks=pytest.mark.skipif(not is_available(), reason="no C++"))]
# Against the rounded reference the logprobs agreed to 2.2e-4 or better (float32's summation order).
# Against the unrounded one they moved by up to 0.03 (bfloat16) and 1.2 (e5m2, two mantissa bits)
# on these random tiny models, and an engine that attended over new tokens it had not rounded by 0.34.
TOL = 1e-3


@contextlib.contextmanager
def hf_with_rounded_kv(arch: str, pool_dtype: torch.dtype):
    """HF's float32 model, its cached tensors rounded to the pool's dtype where minisgl stores them."""
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), dtype=torch.float32).eval()
    rounded = lambda t: t.to(pool_dtype).to(t.dtype)  # noqa: E731
    module, name = {
        "llama": (modeling_llama, "apply_rotary_pos_emb"),
        "deepseek_v2": (modeling_deepseek_v2, "apply_rotary_emb"),
    }[arch]
    rope = getattr(module, name)
    hooks = []
    for layer in hf.model.layers:
        attn = layer.self_attn
        cached = attn.v_proj if arch == "llama" else attn.kv_a_layernorm  # the values, or the latent
        hooks.append(cached.register_forward_hook(lambda mod, inputs, out: rounded(out)))

    def rope_then_round(q, k, *args, **kwargs):
        q, k = rope(q, k, *args, **kwargs)
        return q, rounded(k)

    setattr(module, name, rope_then_round)
    try:
        yield hf
    finally:
        setattr(module, name, rope)
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("kv_cache_dtype", sorted(KV_CACHE_DTYPES))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "deepseek_v2"])
def test_narrow_kv_pool_serves_a_float32_model(arch, backend, kv_cache_dtype):
    pool_dtype = KV_CACHE_DTYPES[kv_cache_dtype]
    kwargs = dict(model_path=tiny_model_dir(arch), max_total_tokens=256, chunked_prefill_size=4)
    engine = Engine(**kwargs, attention_backend=backend, kv_cache_dtype=kv_cache_dtype)
    runner = engine.scheduler.tp_worker.model_runner
    full = Engine(**kwargs, attention_backend=backend).scheduler.tp_worker.model_runner
    assert runner.dtype == torch.float32 and runner.kv_cache_dtype == pool_dtype
    assert (
        4 // pool_dtype.itemsize * runner.token_to_kv_pool.get_kv_size_bytes()
        == full.token_to_kv_pool.get_kv_size_bytes()
    )
    with hf_with_rounded_kv(arch, pool_dtype) as hf:
        for _ in range(2):  # the second round reads its prompts' KV from the radix cache
            outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, return_logprob=True)
            for ids, out in zip(PROMPTS, outs):
                with torch.no_grad():  # HF's logprobs at the positions that chose each output token
                    logits = hf(torch.tensor([ids + out["output_ids"]])).logits[0, len(ids) - 1 : -1]
                expected = torch.log_softmax(logits, dim=-1)
                chosen = expected[torch.arange(len(out["output_ids"])), out["output_ids"]]
                ours = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
                torch.testing.assert_close(ours, chosen, atol=TOL, rtol=0)
                assert (expected.max(dim=-1).values - chosen <= TOL).all()  # greedy: HF's argmax, or a tie
    assert engine.flush_cache() and engine.scheduler.token_to_kv_pool_allocator.available_size() == 256


def test_profile_fits_twice_the_tokens_in_a_bf16_pool():
    """The memory budget is in bytes: profiling a bfloat16 pool finds room for twice the tokens."""
    runners = {
        kv: Engine(
            model_path=tiny_model_dir("llama"), max_total_tokens=64, kv_cache_dtype=kv
        ).scheduler.tp_worker.model_runner
        for kv in ("auto", "bfloat16")
    }
    fits = {kv: runner.profile_max_num_token() for kv, runner in runners.items()}  # back to back: the same free RAM
    assert abs(fits["bfloat16"] / fits["auto"] - 2) < 0.01


@pytest.mark.parametrize("name", ["fp4_e2m1", "float16"])
def test_kv_cache_dtypes_minisgl_lacks_are_refused_by_name(name):
    with pytest.raises(ValueError, match=f"kv_cache_dtype '{name}' is not supported"):
        ServerArgs(model_path=tiny_model_dir("llama"), kv_cache_dtype=name)


@pytest.mark.parametrize("name", ["fp8_e5m2", "fp8_e4m3"])
def test_fp8_pool_is_refused_on_triton_by_name(name):
    with pytest.raises(ValueError, match=f"'{name}' needs attention_backend 'intel_amx' or 'torch_native'"):
        ServerArgs(model_path=tiny_model_dir("llama"), kv_cache_dtype=name, attention_backend="triton")


@pytest.mark.parametrize(
    "kv_cache_dtype,backend,shape",
    [("fp8_e4m3", "intel_amx", "tree"), ("fp8_e5m2", "intel_amx", "chain"), ("fp8_e4m3", "torch_native", "tree")],
)
def test_eagle_over_an_fp8_pool_is_plain_decoding_over_it(kv_cache_dtype, backend, shape, tmp_path_factory):
    """EAGLE's verify and draft_extend store and read the same rounded pool as plain decoding: its
    greedy tokens are plain fp8 decoding's, and every rejected node's slot comes back."""
    if backend == "intel_amx" and not is_available():
        pytest.skip("no C++")
    from tests.test_c12_eagle import CHAIN, GREEDY, PROMPTS, TREE, _eagle, _head, _ids, _plain, _with_oracle

    pool = dict(kv_cache_dtype=kv_cache_dtype, attention_backend=backend)
    expected = _plain("llama", **pool)
    head = _head("llama", "EAGLE", tmp_path_factory)
    engine = _eagle("llama", "EAGLE", head, {"tree": TREE, "chain": CHAIN}[shape], **pool, disable_radix_cache=True)
    rounds = _with_oracle(engine, {tuple(p): e for p, e in zip(PROMPTS, expected)})
    results = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert _ids(results) == expected and rounds["n"] > 0
    assert sum(r["meta_info"]["spec_accept_token_num"] for r in results) > 0


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e5m2", "fp8_e4m3"])
def test_tensor_parallel_over_an_fp8_pool_is_one_rank_over_it(kv_cache_dtype):
    """Each TP rank keeps its heads' K/V in its own fp8 pool: greedy tokens equal one rank's."""
    kwargs = dict(model_path=tiny_model_dir("llama"), max_total_tokens=512, attention_backend="torch_native")
    greedy = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    one = Engine(**kwargs, kv_cache_dtype=kv_cache_dtype).generate(input_ids=PROMPTS, sampling_params=greedy)
    with Engine(**kwargs, tp_size=2, kv_cache_dtype=kv_cache_dtype) as engine:
        two = engine.generate(input_ids=PROMPTS, sampling_params=greedy)
    assert [o["output_ids"] for o in two] == [o["output_ids"] for o in one]


@pytest.mark.parametrize(
    "kv_cache_dtype,backend",
    [
        ("fp8_e4m3", "torch_native"),
        pytest.param("fp8_e5m2", "intel_amx", marks=pytest.mark.skipif(not is_available(), reason="no C++")),
    ],
)
def test_standalone_speculation_over_an_fp8_pool_is_plain_decoding_over_it(kv_cache_dtype, backend, tmp_path):
    """The draft model's pool is fp8 too: its tokens only cost speed, and the target's verify reads the
    same rounded K/V as plain decoding, so greedy tokens are plain fp8 decoding's and every slot comes back."""
    from minisgl.tools.make_draft_model import make_truncated_model

    target = tiny_model_dir("llama")
    kwargs = dict(model_path=target, max_total_tokens=512, kv_cache_dtype=kv_cache_dtype, attention_backend=backend)
    expected = Engine(**kwargs).generate(input_ids=PROMPTS, sampling_params=GREEDY)
    draft = str(make_truncated_model(target, tmp_path / "draft", 1))
    spec = Engine(
        **kwargs, speculative_algorithm="STANDALONE", speculative_draft_model_path=draft, speculative_num_steps=3
    )
    results = spec.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [r["output_ids"] for r in results] == [e["output_ids"] for e in expected]
    assert sum(r["meta_info"]["spec_verify_ct"] for r in results) > 0
    sched = spec.scheduler
    assert spec.flush_cache()
    assert sched.token_to_kv_pool_allocator.available_size() == sched.worker_info.max_total_num_tokens


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e5m2", "fp8_e4m3"])
def test_pipeline_parallel_over_an_fp8_pool_is_one_process_over_it(kv_cache_dtype):
    """Each pipeline stage keeps its layers' K/V in its own fp8 pool: greedy tokens equal one process's."""
    kwargs = dict(model_path=tiny_model_dir("llama"), max_total_tokens=512, attention_backend="torch_native")
    one = Engine(**kwargs, kv_cache_dtype=kv_cache_dtype).generate(input_ids=PROMPTS, sampling_params=GREEDY)
    with Engine(**kwargs, pp_size=2, kv_cache_dtype=kv_cache_dtype) as engine:
        two = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in two] == [o["output_ids"] for o in one]
