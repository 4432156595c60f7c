"""A Qwen3-MoE GGUF file, written by llama.cpp's own converter, through minisgl's float conversion.

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

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minisgl.entrypoints.engine import Engine
from minisgl.model_loader.gguf import convert_gguf, gguf_quant_weights_iterator
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


def test_minisgl_serves_the_conversion_as_hf_serves_the_checkpoint(original, converted):
    model = _hf_model(original)
    engine = Engine(model_path=str(converted), max_total_tokens=512)
    try:
        prompts = [[5, 17, 42, 99, 3], [7, 7, 250, 11]]
        outs = engine.generate(
            input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        )
        assert [out["output_ids"] for out in outs] == [hf_greedy(model, ids, 8) for ids in prompts]
    finally:
        engine.shutdown()


def test_experts_kept_quantized_are_refused_by_name(converted):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(converted)
    with pytest.raises(NotImplementedError, match="blk.0.ffn_down_exps.weight.*MoE experts kept quantized"):
        next(gguf_quant_weights_iterator(str(GGUF), config, torch.float32))
