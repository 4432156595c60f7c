"""minisgl's GGUF-to-float conversion against transformers' own GGUF loader, on the shipped file.

convert_gguf reads the file with minisgl's tensor table (the quantized path's names and q/k
un-permutation) and dequantizes with gguf-py; transformers builds its model from the same file.
Every tensor must come out bit for bit the same, and the config must describe the same model.
transformers needs accelerate to load a GGUF file, which is why accelerate is a dev dependency
only: minisgl itself no longer does.
"""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from minisgl.model_loader.gguf import bundled_gguf_path, convert_gguf


@pytest.mark.slow  # ~40 s: transformers' own GGUF load; test_gguf_tensors.py checks the reader by default
def test_every_tensor_equals_transformers_gguf_load(tmp_path):
    path = bundled_gguf_path()
    converted = convert_gguf(path, tmp_path / "smollm2")  # not the cache: this code's own output
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    want = ref.state_dict()
    assert ref.config.tie_word_embeddings  # SmolLM2: the LM head is the embedding, stored once
    want.pop("lm_head.weight")
    got = load_file(converted / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32
        assert torch.equal(got[name], tensor), name  # q_proj and k_proj included: their rows un-permuted

    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    for key, value in ref.config.to_dict().items():
        if key in ("architectures", "quantization_config", "transformers_version", "_name_or_path"):
            continue
        assert config.get(key, value) == value, key
