"""Quantization schemes end to end: config checks, the offline tool, and accuracy against float.

The accuracy numbers come from minisgl.tools.quant_accuracy (per-layer error, logits cosine and
KL, greedy agreement, perplexity on benchmarks/data/perplexity_text.txt). Tiny random models have
near-uniform next-token distributions, so greedy agreement is low for them and the bounds are
loose; they still catch a wrong scale, a transposed weight or a layer left unquantized.
"""

import json
import shutil

import pytest

from minisgl.configs.model_config import ModelConfig
from minisgl.entrypoints.engine import Engine
from minisgl.layers.linear import LinearBase
from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE
from minisgl.layers.quantization.unquant import UnquantizedLinearMethod
from minisgl.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod, W8A8Int8MoEMethod
from minisgl.model_loader.loader import get_quant_config
from minisgl.tools.make_tiny_model import ARCHS
from minisgl.tools.quant_accuracy import (
    TEXT_PATH,
    chunked_perplexity,
    compare,
    dithered,
    dithered_ppl_ratios,
    per_layer_error,
    perplexity,
    text_ids,
)
from minisgl.tools.quantize_w8a8 import quantize_checkpoint
from tests._models import tiny_model_dir


def _with_quant_config(src: str, dst, quant_cfg: dict) -> str:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = quant_cfg
    (dst / "config.json").write_text(json.dumps(config))
    return str(dst)


def test_unknown_scheme_is_refused_by_name(tmp_path):
    path = _with_quant_config(tiny_model_dir("llama"), tmp_path / "m", {"quant_method": "awq", "bits": 4})
    with pytest.raises(ValueError, match=r"quantization_config.quant_method='awq'.*w8a8_int8"):
        get_quant_config(ModelConfig(path))
    with pytest.raises(ValueError, match=r"quantization='fp8'.*w8a8_int8"):
        get_quant_config(ModelConfig(tiny_model_dir("llama"), quantization="fp8"))
    # And the engine refuses it at load, naming it.
    with pytest.raises(ValueError, match="awq"):
        Engine(model_path=path, max_total_tokens=1024)


def test_flag_must_match_the_checkpoint(tmp_path):
    path = _with_quant_config(tiny_model_dir("llama"), tmp_path / "m", {"quant_method": "w8a8_int8"})
    assert ModelConfig(path).quantization == "w8a8_int8"
    assert ModelConfig(path, quantization="W8A8_INT8").quantization == "w8a8_int8"
    with pytest.raises(ValueError, match="does not match"):
        ModelConfig(path, quantization="gguf")


def test_float_weights_in_an_int8_checkpoint_are_refused(tmp_path):
    """A config that claims w8a8_int8 over float tensors must not be cast silently."""
    path = _with_quant_config(tiny_model_dir("llama"), tmp_path / "m", {"quant_method": "w8a8_int8"})
    with pytest.raises(ValueError, match="stores int8 weights"):
        Engine(model_path=path, max_total_tokens=1024)


def _layer_methods(engine):
    model = engine.scheduler.tp_worker.model_runner.model
    return {name: type(m.quant_method) for name, m in model.named_modules() if isinstance(m, (LinearBase, FusedMoE))}


def _check_w8a8(arch: str, tmp_path, text: str, windows: int) -> None:
    float_path = tiny_model_dir(arch)
    int8_path = str(quantize_checkpoint(float_path, tmp_path / "w8a8"))
    float_engine = Engine(model_path=float_path, max_total_tokens=4096)
    quant_engine = Engine(model_path=int8_path, max_total_tokens=4096)
    try:
        methods = _layer_methods(quant_engine)
        # Every projection and expert block is int8; only MoE routers stay float.
        for name, method in methods.items():
            expected = UnquantizedLinearMethod if name.endswith(".gate") else (W8A8Int8LinearMethod, W8A8Int8MoEMethod)
            assert issubclass(method, expected), f"{name}: {method.__name__}"
        report = compare(float_engine, quant_engine, text=text, windows=windows)
    finally:
        float_engine.shutdown()
        quant_engine.shutdown()
    assert report["per_layer_error_max"] < 0.05, report["per_layer_error"]
    # A random router sits near ties, so int8 noise flips some tokens' experts: DeepSeek-V3's
    # sigmoid grouped routing measured cosine 0.945 and KL 0.115 where llama gives 0.998 and 0.004.
    loose = arch == "deepseek_v3"
    assert report["logits_cosine"] > (0.9 if loose else 0.95)
    assert report["kl"] < (0.25 if loose else 0.1)
    assert abs(report["ppl_ratio"] - 1) < 0.05
    assert report["greedy_agreement"] > 0


def test_w8a8_int8_llama(tmp_path):
    _check_w8a8("llama", tmp_path, TEXT_PATH.read_text()[:400], windows=2)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "llama"])
def test_w8a8_int8_every_arch(arch, tmp_path):
    _check_w8a8(arch, tmp_path, TEXT_PATH.read_text(), windows=8)


def test_dithering_moves_w8a8_perplexity_and_not_the_float_models():
    """quant_accuracy --dither-seeds: a dither of one float rounding reaches the model (the float
    perplexity changes, by far less than 1e-4), is gone when the context ends, is the same for the
    same seed, and moves the W8A8 model's ratio from seed to seed (int8 rounding flips)."""
    path = tiny_model_dir("llama")
    common = dict(max_total_tokens=4096, disable_radix_cache=True)
    float_engine = Engine(model_path=path, **common)
    quant_engine = Engine(model_path=path, quantization="w8a8_int8", **common)
    try:
        ids = text_ids(float_engine, TEXT_PATH.read_text()[:400])
        base = perplexity(float_engine, ids)
        with dithered(float_engine, 0):
            shaken = perplexity(float_engine, ids)
        assert shaken != base and abs(shaken / base - 1) < 1e-4
        assert perplexity(float_engine, ids) == base
        ratios = dithered_ppl_ratios(float_engine, quant_engine, ids, seeds=3)
        assert dithered_ppl_ratios(float_engine, quant_engine, ids, seeds=1) == ratios[:1]
        assert len(set(ratios)) == 3, ratios
    finally:
        float_engine.shutdown()
        quant_engine.shutdown()


def test_online_and_offline_quantization_agree(tmp_path):
    """--quantization w8a8_int8 on the float checkpoint quantizes at load exactly as the tool does."""
    float_path = tiny_model_dir("qwen2")  # qkv bias: the fused bias path
    int8_path = str(quantize_checkpoint(float_path, tmp_path / "w8a8"))
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    outputs = []
    for kwargs in (dict(model_path=float_path, quantization="w8a8_int8"), dict(model_path=int8_path)):
        engine = Engine(max_total_tokens=1024, **kwargs)
        outputs.append(
            [o["output_ids"] for o in engine.generate(prompt=["Hello", "The river rose"], sampling_params=params)]
        )
        engine.shutdown()
    assert outputs[0] == outputs[1]


def test_chunked_perplexity_scores_what_llama_perplexity_scores():
    """chunked_perplexity (quant_accuracy --llama-perplexity's minisgl side) against transformers'
    logits on the same chunks: each n_ctx chunk run on its own, BOS in its first slot where the
    vocabulary adds one (bos_id=1), and only its second half scored, as llama-perplexity does."""
    import math

    import torch
    from transformers import AutoModelForCausalLM

    path, n_ctx = tiny_model_dir("llama"), 32
    engine = Engine(model_path=path, max_total_tokens=1024)
    try:
        ids = engine.tokenizer.encode(TEXT_PATH.read_text())[: 3 * n_ctx + 5]  # 3 chunks and a rest, unscored
        got = {bos_id: chunked_perplexity(engine, ids, n_ctx, bos_id) for bos_id in (None, 1)}
    finally:
        engine.shutdown()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for bos_id, ppl in got.items():
        nll, count = 0.0, 0
        for i in range(3):
            chunk = ids[i * n_ctx : (i + 1) * n_ctx]
            chunk = [bos_id, *chunk[1:]] if bos_id is not None else chunk
            with torch.no_grad():
                logprobs = hf(torch.tensor([chunk])).logits[0].double().log_softmax(-1)
            for j in range(n_ctx // 2 + 1, n_ctx):  # token j, predicted from position j - 1
                nll -= logprobs[j - 1, chunk[j]].item()
                count += 1
        assert math.isclose(ppl, math.exp(nll / count), rel_tol=1e-4), bos_id


def test_an_ignore_list_keeps_those_layers_in_float(tmp_path):
    """quantization_config.ignore, as SGLang reads it: every down_proj (a name the module's contains)
    and layer 0's attention projections (an re: pattern over the checkpoint's q/k/v names) are written
    float by the tool and served by the float method: the same output as the float model's layer, fed
    the same input, to the bit; every other projection int8."""
    float_path = tiny_model_dir("llama")
    ignore = ["down_proj", r"re:model\.layers\.0\.self_attn\.[qkv]_proj"]
    int8_path = quantize_checkpoint(float_path, tmp_path / "w8a8", ignore=ignore)
    config = json.loads((int8_path / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "w8a8_int8", "ignore": ignore}
    float_engine = Engine(model_path=float_path, max_total_tokens=1024)
    quant_engine = Engine(model_path=str(int8_path), max_total_tokens=1024)
    try:
        kept = {"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}
        methods = _layer_methods(quant_engine)
        assert {name for name, m in methods.items() if m is UnquantizedLinearMethod} == kept
        model = quant_engine.scheduler.tp_worker.model_runner.model
        for name in kept:  # the int8 method's parameters are gone, not left beside the float weight
            assert [p for p, _ in model.get_submodule(name).named_parameters()] == ["weight"], name
        errors = per_layer_error(float_engine, quant_engine, text_ids(float_engine, TEXT_PATH.read_text()[:200]))
    finally:
        float_engine.shutdown()
        quant_engine.shutdown()
    assert all(errors[name] == 0 for name in kept), errors
    assert all(err > 0 for name, err in errors.items() if name not in kept), errors


def test_an_ignore_list_that_splits_a_fused_layer_or_names_experts_is_refused(tmp_path):
    llama, moe = tiny_model_dir("llama"), tiny_model_dir("qwen3_moe")
    with pytest.raises(ValueError, match=r"keeps \['k_proj'\] of model.layers.0.self_attn.qkv_proj in float"):
        quantize_checkpoint(llama, tmp_path / "split", ignore=["layers.0.self_attn.k_proj"])
    with pytest.raises(ValueError, match="expert"):
        quantize_checkpoint(moe, tmp_path / "experts", ignore=["experts"])
    # The same lists in a checkpoint's config (written by hand), refused when the model is built.
    int8 = quantize_checkpoint(llama, tmp_path / "w8a8")
    for bad, error in (([r"re:.*\.gate_proj"], "gate_proj.*share one scheme"), ("down_proj", "list of module names")):
        config = json.loads((int8 / "config.json").read_text())
        config["quantization_config"]["ignore"] = bad
        (int8 / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=error):
            Engine(model_path=str(int8), max_total_tokens=1024)
    moe_int8 = _with_quant_config(moe, tmp_path / "moe", {"quant_method": "w8a8_int8", "ignore": ["mlp.experts"]})
    with pytest.raises(NotImplementedError, match="model.layers.0.mlp.experts: .* keeps this FusedMoE in float"):
        Engine(model_path=moe_int8, max_total_tokens=1024)


def test_an_ignore_list_under_tensor_parallelism(tmp_path):
    """Each rank re-creates its ignored layers' shards in float: TP 2 gives TP 1's greedy tokens
    (qwen2, whose q/k/v biases stay float either way)."""
    ignore = ["down_proj", r"re:model\.layers\.1\.self_attn\.[qkv]_proj"]
    path = str(quantize_checkpoint(tiny_model_dir("qwen2"), tmp_path / "w8a8", ignore=ignore))
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    outputs = []
    for tp_size in (1, 2):
        engine = Engine(model_path=path, tp_size=tp_size, max_total_tokens=1024)
        try:
            outputs.append(
                [o["output_ids"] for o in engine.generate(prompt=["Hello", "The river rose"], sampling_params=params)]
            )
        finally:
            engine.shutdown()
    assert outputs[0] == outputs[1]


def test_windowed_ppl_ratio_spreads_its_windows_and_pools_their_logs(monkeypatch, tmp_path):
    """quant_accuracy --text: the windows run from the text's start to its end, each is scored by both
    engines, and the ratio is the geometric mean of the windows' ratios; Markdown code blocks are
    not scored."""
    from minisgl.tools import quant_accuracy

    seen = []

    def fake_perplexity(engine, ids):  # the "quantized" engine is 1.1x or 1.2x worse, window by window
        seen.append((engine, ids[0], len(ids)))
        return 10.0 * (1.1 if ids[0] < 50 else 1.2) if engine == "quant" else 10.0

    monkeypatch.setattr(quant_accuracy, "perplexity", fake_perplexity)
    ratio, each = quant_accuracy.windowed_ppl_ratio("float", "quant", list(range(100)), windows=3, window=20)
    assert [first for engine, first, n in seen if engine == "quant"] == [0, 40, 80] and {n for *_, n in seen} == {20}
    assert each == pytest.approx([1.1, 1.1, 1.2]) and ratio == pytest.approx((1.1 * 1.1 * 1.2) ** (1 / 3))
    page = tmp_path / "page.md"
    page.write_text("Prose before.\n```python\ncode()\n```\nProse after.\n")
    assert "code()" not in quant_accuracy.read_texts([str(page)]) and "Prose after" in quant_accuracy.read_texts(
        [str(page)]
    )
    with pytest.raises(ValueError, match="fewer than one window"):
        quant_accuracy.windowed_ppl_ratio("float", "quant", list(range(10)), windows=3, window=20)
