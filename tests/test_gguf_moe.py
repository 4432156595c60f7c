"""A Qwen3-MoE GGUF file, written by llama.cpp's own converter: its float conversion, and its
experts served from their blocks (--quantization gguf, GGUFMoEMethod).

tests/data/tiny-qwen3moe-f32.gguf is the one-layer tiny Qwen3-MoE checkpoint (make_tiny_model,
seed 0) converted by the convert_hf_to_gguf.py that llama-cpp-python 0.3.36 vendors
(scripts/setup_llama_cpp.sh installs it) with ``--outtype f32``. The converter refuses a BPE
pre-tokenizer it has no hash for, so it was run with ``get_vocab_base_pre`` returning "qwen2", the
pre-tokenizer the tiny tokenizer copies (make_tiny_model.build_tokenizer). To rebuild it:

    import sys; sys.path[:0] = [LLAMA_CPP, LLAMA_CPP + "/gguf-py"]
    import conversion.base as b
    for cls in vars(b).values():
        if isinstance(cls, type) and hasattr(cls, "get_vocab_base_pre"):
            cls.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    import convert_hf_to_gguf as c
    sys.argv = ["convert_hf_to_gguf.py", TINY_DIR, "--outfile", OUT, "--outtype", "f32"]
    c.main()

In float32 the file holds the checkpoint's values exactly, so the conversion must give them back
bit for bit: each expert split out of llama.cpp's stacked [experts, rows, cols] tensors, the
router, q/k norms. transformers 5.25 cannot be the reference here as it is for SmolLM2
(test_gguf_conversion.py): its GGUF config leaves the experts' width at the default 768, which
minisgl's conversion takes from the file instead, and its model then refuses the weights.
"""

import functools
import json
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import load_file

from minisgl.entrypoints.engine import Engine
from minisgl.layers.moe.fused_moe_native import fused_experts_native
from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE
from minisgl.layers.quantization.gguf import GGUFMoEMethod
from minisgl.layers.quantization.gguf_kernel import MMVQ_MAX_ROWS, ggml_dequantize
from minisgl.model_loader.gguf import convert_gguf
from minisgl.tools.make_tiny_model import make_tiny_model
from tests.test_parity_hf import _hf_model, hf_greedy

GGUF = Path(__file__).parent / "data" / "tiny-qwen3moe-f32.gguf"


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3_moe", tmp_path_factory.mktemp("hf"), seed=0, num_hidden_layers=1)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    return convert_gguf(GGUF, tmp_path_factory.mktemp("gguf") / "tiny-qwen3moe")


def test_the_conversion_gives_back_the_checkpoint_bit_for_bit(original, converted):
    want = load_file(original / "model.safetensors")
    got = load_file(converted / "model.safetensors")
    assert sorted(got) == sorted(want)  # model.layers.0.mlp.experts.{0..7}.{gate,up,down}_proj, mlp.gate, ...
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name

    config, ref = (json.loads((folder / "config.json").read_text()) for folder in (converted, original))
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config["moe_intermediate_size"] == ref["moe_intermediate_size"] == 32  # transformers' GGUF config: 768
    assert config["rms_norm_eps"] == pytest.approx(ref["rms_norm_eps"], rel=1e-7)  # stored as float32 in GGUF
    skip = ("rms_norm_eps", "transformers_version", "_model_name_or_path")
    assert {k: v for k, v in config.items() if k not in skip} == {k: v for k, v in ref.items() if k not in skip}


@pytest.mark.parametrize("served", ["conversion", "file"])
def test_minisgl_serves_the_conversion_as_hf_serves_the_checkpoint(original, converted, served):
    """Both ways minisgl reads the file: its float conversion, and the file itself (--quantization
    gguf, chosen for a .gguf path), whose float32 matrices the GGUF methods hold as stored."""
    model = _hf_model(original)
    engine = Engine(model_path=str(converted if served == "conversion" else GGUF), max_total_tokens=512)
    try:
        prompts = [[5, 17, 42, 99, 3], [7, 7, 250, 11]]
        outs = engine.generate(
            input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        )
        assert [out["output_ids"] for out in outs] == [hf_greedy(model, ids, 8) for ids in prompts]
    finally:
        engine.shutdown()


# The blocks the quantized copy holds: each expert stack its own type (llama.cpp's mixes give the
# down projection another), every other matrix Q8_0, the router left in float32 as llama.cpp's
# quantizer always leaves ffn_gate_inp.
BLOCK_TYPES = {"ffn_gate_exps": T.Q4_1, "ffn_up_exps": T.Q4_1, "ffn_down_exps": T.Q4_0, "ffn_gate_inp": T.F32}


def write_quantized(path: Path, metadata: Optional[dict] = None, experts=None) -> Path:
    """tiny-qwen3moe-f32.gguf rewritten with its matrices in BLOCK_TYPES' blocks (gguf-py's quantize,
    which rounds as llama.cpp's quantize_row_*_ref does); metadata and tokenizer copied as they are,
    but for the keys in `metadata`; `experts(kind)`, when given, supplies each expert stack instead."""
    reader = GGUFReader(GGUF)
    writer = GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            value = (metadata or {}).get(field.name, field.contents())
            writer.add_key_value(field.name, value, field.types[0], sub_type)
    for tensor in reader.tensors:
        data, kind = np.asarray(tensor.data), tensor.name.split(".")[-2]
        if experts is not None and kind.endswith("_exps"):
            data = experts(kind)
        weight_type = BLOCK_TYPES.get(kind, T.Q8_0) if data.ndim > 1 else T.F32
        if weight_type == T.F32:
            writer.add_tensor(tensor.name, data)
        else:
            writer.add_tensor(tensor.name, quantize(data, weight_type), raw_dtype=weight_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Path:
    return write_quantized(tmp_path_factory.mktemp("gguf-q") / "tiny-qwen3moe-q.gguf")


def _moe_layer(engine: Engine):
    return engine.scheduler.tp_worker.model_runner.model.model.layers[0].mlp.experts


def test_experts_stay_in_their_blocks_and_serve_as_their_float_conversion(quantized, tmp_path, monkeypatch):
    """The quantized file served from its blocks against its own float32 conversion (the same
    blocks dequantized up front). With the integer path off every GEMM keeps float activations,
    so the two differ only in the order of float32 sums: the same greedy tokens, logits within
    1e-4. Experts, like every other matrix, are uint8 stacks of the file's blocks: no float copy."""
    from minisgl.tools.quant_accuracy import last_position_logits

    monkeypatch.setattr("minisgl.layers.quantization.gguf_kernel.MMVQ_MAX_ROWS", 0)
    blocks = Engine(model_path=str(quantized), max_total_tokens=512)
    floats = Engine(model_path=str(convert_gguf(quantized, tmp_path / "float")), max_total_tokens=512)
    try:
        experts = _moe_layer(blocks)
        assert isinstance(experts.quant_method, GGUFMoEMethod)
        assert (experts.w13_type, experts.w2_type) == (T.Q4_1, T.Q4_0)
        assert experts.w13_qweight.dtype == experts.w2_qweight.dtype == torch.uint8
        assert experts.w13_qweight.shape == (8, 2 * 32, 64 // 32 * 20)  # [E, 2I, H / 32 Q4_1 blocks of 20 bytes]
        assert experts.w2_qweight.shape == (8, 64, 32 // 32 * 18)  # [E, H, I / 32 Q4_0 blocks of 18 bytes]
        model = blocks.scheduler.tp_worker.model_runner.model
        floating = {name for name, p in model.named_parameters() if p.is_floating_point() and p.dim() > 1}
        assert floating == {"model.layers.0.mlp.gate.weight"}  # the router only

        prompts = [[5, 17, 42, 99, 3], [7, 7, 250, 11], list(range(40, 100))]
        params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        outs = [e.generate(input_ids=prompts, sampling_params=params) for e in (blocks, floats)]
        assert [o["output_ids"] for o in outs[0]] == [o["output_ids"] for o in outs[1]]
        got, want = last_position_logits(blocks, prompts), last_position_logits(floats, prompts)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    finally:
        blocks.shutdown()
        floats.shutdown()


@pytest.mark.parametrize("tokens", [1, 3, 400])
def test_the_gguf_moe_method_against_float_experts(quantized, tokens):
    """One layer, as served: the experts' output against fused_experts_native on the dequantized
    experts. An expert given up to MMVQ_MAX_ROWS rows rounds them to 8 bits per block (the integer
    path), so at 1 and 3 tokens the output is within that rounding (measured: 0.9% and 1.3% of
    the largest output); at 400 tokens every expert has about 100 rows and keeps them in float, so
    the output is within float32 rounding."""
    engine = Engine(model_path=str(quantized), max_total_tokens=512)
    try:
        layer = _moe_layer(engine)
        g = torch.Generator().manual_seed(tokens)
        x = torch.randn(tokens, 64, generator=g)
        topk_weights, topk_ids = torch.rand(tokens, 2, generator=g), torch.randint(0, 8, (tokens, 2), generator=g)
        rows = torch.bincount(topk_ids.flatten(), minlength=8)
        integer = bool(rows.max() <= MMVQ_MAX_ROWS)
        assert integer or rows.min() > MMVQ_MAX_ROWS  # one path for every expert
        got = layer.quant_method.apply(layer, x, topk_weights, topk_ids)
        w13, w2 = (
            [ggml_dequantize(e, weight_type) for e in stack]
            for stack, weight_type in ((layer.w13_qweight, layer.w13_type), (layer.w2_qweight, layer.w2_type))
        )
        want = fused_experts_native(x, w13, w2, topk_weights, topk_ids, lambda h, w: h @ w.t())
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=0, atol=(0.03 if integer else 1e-5) * scale)
    finally:
        engine.shutdown()


def test_the_graph_runner_refuses_experts_in_blocks_by_name(quantized):
    """The loop over experts reads the routing on the host, which a compiled graph cannot."""
    with pytest.raises(ValueError, match="GGUFMoEMethod runs these experts in a loop"):
        Engine(model_path=str(quantized), max_total_tokens=512, enable_torch_compile=True)


def test_a_tensor_parallel_rank_keeps_whole_blocks_of_the_down_projection():
    """Under tensor parallelism a rank keeps its share of each expert's intermediate dimension: for
    down_proj [H, I] that is a run of whole blocks of every row. FusedMoE.weight_loader cuts the
    parameter's own width, here bytes, where for float experts it is weights."""
    layer = torch.nn.Module()
    layer.tp_rank, layer.intermediate_size_per_partition = 1, 32  # the second of two ranks: columns 32..63 of I = 64
    loader = functools.partial(FusedMoE.weight_loader, layer)
    GGUFMoEMethod(None).create_weights(layer, 2, 64, 32, torch.float32, weight_loader=loader)
    layer.w2_qweight_type.weight_loader(layer.w2_qweight_type, torch.tensor(int(T.Q4_1)), "w2", 1)
    full = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    blocks = torch.from_numpy(quantize(full, T.Q4_1))  # [H, 2 blocks of 20 bytes]
    layer.w2_qweight.weight_loader(layer.w2_qweight, blocks, "w2", 1)
    assert layer.w2_qweight.shape == (2, 64, 20)
    torch.testing.assert_close(
        ggml_dequantize(layer.w2_qweight[1], T.Q4_1), ggml_dequantize(blocks, T.Q4_1)[:, 32:], rtol=0, atol=0
    )
    with pytest.raises(ValueError, match="not a whole number of 32-weight blocks"):
        GGUFMoEMethod(None).create_weights(layer, 2, 64, 16, torch.float32, weight_loader=None)
        layer.w2_qweight_type.weight_loader(layer.w2_qweight_type, torch.tensor(int(T.Q4_1)), "w2", 0)


def test_tp2_serves_experts_in_blocks_as_tp1(tmp_path):
    """TP=2 over gloo from the blocks gives TP=1's greedy tokens. Each rank keeps half of every
    expert's intermediate rows and, of each down-projection row, the whole blocks of its half: the
    tiny file's experts are 32 wide, one block, so this file's are 64 (random, 8 experts), two."""
    rng = np.random.default_rng(0)
    shapes = {"ffn_gate_exps": (8, 64, 64), "ffn_up_exps": (8, 64, 64), "ffn_down_exps": (8, 64, 64)}
    path = write_quantized(
        tmp_path / "tiny-qwen3moe-i64.gguf",
        metadata={"qwen3moe.expert_feed_forward_length": 64},
        experts=lambda kind: (rng.standard_normal(shapes[kind]) / 8).astype(np.float32),
    )
    kw = dict(model_path=str(path), max_total_tokens=256, max_running_requests=8)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17]]
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    with Engine(**kw) as engine:
        want = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    with Engine(tp_size=2, **kw) as engine:
        got = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    for g, w in zip(got, want):
        ours, ref = ([lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]] for r in (g, w))
        assert ours == pytest.approx(ref, abs=1e-4)  # measured: 7e-7 at most
