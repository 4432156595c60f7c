"""--kv-cache-dtype (SGLang's flag): a float32 model whose KV pool holds bfloat16.

The kernels themselves are checked against SDPA on the same rounded K/V in
tests/kernels/test_cpu_kernels.py; here the whole engine against Hugging Face's float32 model on
the sequences it generated, through chunked prefill over a cached prefix, decode and the radix
cache, with every slot back in the pool afterwards.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.entrypoints.engine import Engine
from minisgl.kernels.cpu import is_available
from minisgl.server_args import ServerArgs
from tests._models import tiny_model_dir

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [10, 11], [5, 6, 7, 8, 9, 14, 15], [19]]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
BACKENDS = ["torch_native", pytest.param("intel_amx", marks=pytest.mark.skipif(not is_available(), reason="no C++"))]
# bfloat16 keeps 8 bits of mantissa, so K/V move by up to 2^-9 relative; the logprobs moved by up to
# 0.013 (llama) and 0.031 (deepseek_v2, whose cached latent is expanded by kv_b_proj) against HF.
# A pool read as the wrong dtype, or the wrong slots, is off by whole units.
TOL = 5e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "deepseek_v2"])
def test_bf16_kv_pool_serves_a_float32_model(arch, backend):
    kwargs = dict(model_path=tiny_model_dir(arch), max_total_tokens=256, chunked_prefill_size=4)
    engine = Engine(**kwargs, attention_backend=backend, kv_cache_dtype="bf16")
    runner = engine.scheduler.tp_worker.model_runner
    full = Engine(**kwargs, attention_backend=backend).scheduler.tp_worker.model_runner
    assert runner.dtype == torch.float32 and runner.kv_cache_dtype == torch.bfloat16
    assert engine.server_args.kv_cache_dtype == "bfloat16"  # SGLang's alias, spelled out
    assert 2 * runner.token_to_kv_pool.get_kv_size_bytes() == full.token_to_kv_pool.get_kv_size_bytes()
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), dtype=torch.float32).eval()
    for _ in range(2):  # the second round reads its prompts' KV from the radix cache
        for ids, out in zip(PROMPTS, engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, return_logprob=True)):
            with torch.no_grad():  # HF's logprobs at the positions that chose each output token
                logits = hf(torch.tensor([ids + out["output_ids"]])).logits[0, len(ids) - 1 : -1]
            expected = torch.log_softmax(logits, dim=-1)
            chosen = expected[torch.arange(len(out["output_ids"])), out["output_ids"]]
            ours = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
            torch.testing.assert_close(ours, chosen, atol=TOL, rtol=0)
            # greedy: each token is HF's argmax, or within bfloat16's noise of it (a near tie)
            assert (expected.max(dim=-1).values - chosen <= TOL).all()
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


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "float16"])
def test_kv_cache_dtypes_minisgl_lacks_are_refused_by_name(name):
    with pytest.raises(ValueError, match=f"kv_cache_dtype '{name}' is not supported"):
        ServerArgs(model_path=tiny_model_dir("llama"), kv_cache_dtype=name)
