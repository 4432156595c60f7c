"""The CPU-specific paths around the C++ kernels: packed linear weights (minisgl's GEMM and the
oneDNN fallback), the lazily touched KV pool and the CPU's chunked-prefill default. Each is
checked against the plain behaviour it replaces."""

import pytest
import torch
import torch.nn.functional as F

from minisgl.entrypoints.engine import Engine
from minisgl.kernels.cpu import has_packed_gemm, packed_gemm_block_n
from minisgl.kernels.cpu.features import vnni_gemm_engine
from minisgl.layers import linear
from minisgl.layers.linear import LinearBase, apply_linear, pack_linear_weight
from minisgl.mem_cache.memory_pool import MHATokenToKVPool
from minisgl.server_args import ServerArgs


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [1, 37, 300])
@pytest.mark.parametrize("out_features", [96, 72])  # 72: not a multiple of any panel width, so oneDNN
@pytest.mark.parametrize("gemm", ["minisgl", "oneDNN"])
def test_packed_weight_matches_f_linear(dtype, tol, rows, out_features, gemm, monkeypatch):
    if gemm == "oneDNN":  # the path where the kernels cannot be built
        monkeypatch.setattr(linear, "has_packed_gemm", lambda: False)
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, 64, generator=g).to(dtype)
    bias = torch.randn(out_features, generator=g).to(dtype)
    x = torch.randn(rows, 64, generator=g).to(dtype)
    packed = pack_linear_weight(weight)
    if packed.dim() == 4:  # the VNNI layout, where AVX512-BF16 or AMX multiplies this dtype
        assert vnni_gemm_engine(dtype) is not None and out_features % 32 == 0 and packed.dtype == dtype
    elif packed.dim() == 3:  # minisgl's panels (gemm.cpp), in the weight's own dtype
        assert linear.has_packed_gemm() and out_features % packed_gemm_block_n() == 0
        assert packed.shape == (out_features // packed_gemm_block_n(), 64, packed_gemm_block_n())
        assert packed.dtype == dtype
    else:  # oneDNN's blocked layout: 16-bit where oneDNN multiplies it on this CPU, else a float32 copy
        assert packed.is_mkldnn
        assert packed.dtype == (dtype if dtype in linear._ONEDNN_DTYPES else torch.float32)
    y = apply_linear(x, packed, bias)
    assert y.dtype == dtype and y.shape == (rows, out_features)
    torch.testing.assert_close(y.float(), F.linear(x.float(), weight.float(), bias.float()), atol=tol, rtol=tol)
    # 3-D inputs are flattened for the GEMM and restored
    assert apply_linear(x.view(1, rows, 64), packed, bias).shape == (1, rows, out_features)


@pytest.mark.parametrize("onednn_has_bf16", [True, False])
def test_a_plain_16_bit_weight_onednn_cannot_multiply_goes_to_f_linear(onednn_has_bf16, monkeypatch):
    """A weight no layer packed (DeepSeek's MoE router) reaches apply_linear plain. On an AVX2 CPU
    oneDNN has no bf16 GEMM and used to fail on it ("could not create a primitive descriptor");
    there it must go to F.linear. Where oneDNN has one (forced either way here), oneDNN takes it."""
    if onednn_has_bf16 and not linear._HAS_ONEDNN:
        pytest.skip("this torch build has no oneDNN")
    dtypes = {torch.float32, torch.bfloat16} if onednn_has_bf16 else {torch.float32}
    monkeypatch.setattr(linear, "_ONEDNN_DTYPES", frozenset(dtypes))
    calls = []
    monkeypatch.setattr(linear, "_onednn_linear", lambda x, w, b: calls.append(w.dtype) or F.linear(x, w, b))
    g = torch.Generator().manual_seed(0)
    weight, x = torch.randn(8, 64, generator=g).bfloat16(), torch.randn(5, 64, generator=g).bfloat16()
    y = apply_linear(x, weight)
    assert calls == ([torch.bfloat16] if onednn_has_bf16 else [])
    torch.testing.assert_close(y.float(), F.linear(x.float(), weight.float()), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not has_packed_gemm(), reason="the CPU kernels could not be built on this machine")
@pytest.mark.parametrize("dtype,gemm", [("float32", "minisgl"), ("bfloat16", "minisgl"), ("float32", "oneDNN")])
def test_loaded_model_keeps_its_dtype_in_the_packed_gemm(tiny_llama, dtype, gemm, monkeypatch):
    """Every linear layer's weight is packed once, in the model's dtype: a bf16 model holds no float32 copy.
    The LM head packs the weight it shares with the tied embedding in place, and the embedding reads
    the checkpoint's rows back out of the panels: the vocabulary matrix is held once (with oneDNN's
    blocked layout, which cannot be read by rows, the head keeps a copy)."""
    from safetensors.torch import load_file

    if gemm == "oneDNN":
        monkeypatch.setattr(linear, "has_packed_gemm", lambda: False)
    engine = Engine(model_path=tiny_llama, device="cpu", dtype=dtype, max_total_tokens=256)
    try:
        model = engine.scheduler.tp_worker.model_runner.model
        linears = [m for m in model.modules() if isinstance(m, LinearBase)]
        assert linears and all(m.weight.dtype == getattr(torch, dtype) for m in linears)
        if gemm == "oneDNN":
            assert all(m.weight.is_mkldnn for m in linears) and model.lm_head.gemm_weight.is_mkldnn
        elif vnni_gemm_engine(getattr(torch, dtype)):  # bf16 on AVX512-BF16 or AMX: the engines' VNNI layout
            assert all(m.weight.dim() == 4 for m in linears) and model.lm_head.gemm_weight.dim() == 4
        elif not linear._onednn_is_faster(getattr(torch, dtype)):  # every N here is a multiple of 32
            assert all(m.weight.dim() == 3 for m in linears) and model.lm_head.gemm_weight.dim() == 3
        embed, head = model.model.embed_tokens, model.lm_head
        assert embed.weight is head.weight
        checkpoint = load_file(f"{tiny_llama}/model.safetensors")["model.embed_tokens.weight"].to(getattr(torch, dtype))
        ids = torch.tensor([[0, 5, 5], [checkpoint.shape[0] - 1, 17, 3]])
        assert torch.equal(embed(ids), checkpoint[ids])
        if head.weight.dim() in (3, 4):  # minisgl's panels: one tensor serves the lookup and the logits
            assert head.packed_weight is None and head.gemm_weight is head.weight
        else:  # oneDNN's blocked layout cannot be read by rows: the head multiplies a copy of its own
            assert head.packed_weight is not None and head.packed_weight.is_mkldnn
    finally:
        engine.shutdown()


@pytest.mark.skipif(not has_packed_gemm(), reason="the CPU kernels could not be built on this machine")
@pytest.mark.parametrize(
    "layout,dtype",
    [("panels", torch.float32), ("panels", torch.bfloat16), ("vnni", torch.bfloat16), ("vnni", torch.float16)],
)
def test_weight_rows_read_back_the_packed_rows(layout, dtype):
    """weight_rows on either packed layout returns exactly the plain weight's rows (both packings
    are pure layout, so both run on any CPU), and refuses an id outside the vocabulary."""
    weight = torch.randn(96, 40, generator=torch.Generator().manual_seed(0)).to(dtype)
    ops = torch.ops.minisgl_kernel
    packed = ops.convert_weight_packed_vnni(weight) if layout == "vnni" else ops.convert_weight_packed(weight)
    ids = torch.tensor([[95, 0, 31, 32], [33, 33, 64, 7]])
    assert torch.equal(linear.weight_rows(packed, ids), weight[ids])
    assert torch.equal(linear.weight_rows(weight, ids), weight[ids])
    assert linear.weight_rows(packed, torch.zeros(0, dtype=torch.long)).shape == (0, 40)
    with pytest.raises(RuntimeError, match="id 96 is out of range for 96 rows"):
        linear.weight_rows(packed, torch.tensor([1, 96]))


def test_kv_pool_zeroes_only_the_padding_page():
    # Freed memory full of NaN, which the pool's uninitialized buffers are then likely to reuse.
    junk = [torch.full((68, 2, 8), float("nan")) for _ in range(8)]
    del junk
    pool = MHATokenToKVPool(
        size=64, page_size=4, dtype=torch.float32, head_num=2, head_dim=8, layer_num=2, device="cpu"
    )
    for buf in (*pool.k_buffer, *pool.v_buffer):
        assert buf.shape == (68, 2, 8)
        assert torch.count_nonzero(buf[:4]) == 0  # masked reads of padding land here


def test_cpu_chunks_prefill_by_default(tiny_llama):
    assert ServerArgs(model_path=tiny_llama, device="cpu").chunked_prefill_size == 2048
    assert ServerArgs(model_path=tiny_llama, device="cpu", chunked_prefill_size=64).chunked_prefill_size == 64
    assert ServerArgs(model_path=tiny_llama, device="cuda").chunked_prefill_size is None


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_bf16_moe_model_runs_the_fused_kernel_as_close_to_hf_as_the_loop(arch, monkeypatch):
    """A bf16 MoE model's experts go to fused_experts_cpu (on the matrix engines where the CPU has
    them, else on float panels). Its prefill logits must be as close to Hugging Face's float32 ones
    as the loop over experts gets (both are bf16 models: the other layers' rounding sets the
    distance). In float32, test_parity_hf holds the same models to 1e-4 and identical tokens."""
    from minisgl.layers.quantization import unquant
    from tests._models import tiny_model_dir
    from tests.test_parity_hf import PROMPTS, _capture_prefill_logits, _hf_model

    if not has_packed_gemm():
        pytest.skip("the CPU kernels could not be built on this machine")
    path = tiny_model_dir(arch)

    def prefill_logits(fused: bool) -> tuple[torch.Tensor, list[list[int]]]:
        if not fused:
            monkeypatch.setattr(unquant, "_fused_experts_cpu_layout", lambda w13, w2: None)
        engine = Engine(model_path=path, dtype="bfloat16", max_total_tokens=2048)
        monkeypatch.undo()
        model = engine.scheduler.tp_worker.model_runner.model
        experts = [m.w13_packed for m in model.modules() if hasattr(m, "w13_packed")]
        assert experts and all(isinstance(w, torch.Tensor) == fused for w in experts)  # a stack only when fused
        prompt_ids = [engine.tokenizer.encode(p) for p in PROMPTS]
        captured = _capture_prefill_logits(engine)
        engine.generate(input_ids=prompt_ids, sampling_params={"max_new_tokens": 1})
        return captured[0].float(), prompt_ids

    fused, prompt_ids = prefill_logits(fused=True)
    loop, _ = prefill_logits(fused=False)
    hf = _hf_model(path)
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([ids])).logits[0, -1] for ids in prompt_ids])
    fused_err, loop_err = (fused - ref).abs().max(), (loop - ref).abs().max()
    assert fused_err <= 1.25 * loop_err, f"fused kernel {fused_err:.3f} from HF, the loop {loop_err:.3f}"
    # Both runs route alike (topk_softmax_cpu); a bf16 model's router logits often tie, and a tie
    # picks the lower expert id where HF's float32 model knows which is larger: about 0.98 here.
    fused_cos, loop_cos = (F.cosine_similarity(x, ref, dim=-1).min() for x in (fused, loop))
    assert fused_cos > 0.97 and fused_cos >= loop_cos - 0.005, f"cosine {fused_cos:.4f}, the loop's {loop_cos:.4f}"
