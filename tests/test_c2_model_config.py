"""C2: ModelConfig.from_server_args normalizes the model's personality before a model class is chosen."""

import json
import shutil

import pytest
import torch

from minisgl.configs.model_config import ModelConfig
from minisgl.server_args import ServerArgs
from tests._models import tiny_model_dir


@pytest.mark.parametrize(
    "arch,head_dim,experts,top_k",
    [("llama", 16, 0, 0), ("qwen2", 16, 0, 0), ("qwen3", 32, 0, 0), ("qwen3_moe", 16, 8, 2)],
)
def test_c2_personality(arch, head_dim, experts, top_k):
    path = tiny_model_dir(arch)
    mc = ModelConfig.from_server_args(ServerArgs(model_path=path, context_length=512))
    assert mc.model_path == path and not mc.is_draft_model
    assert mc.context_len == 512 and mc.dtype == torch.float32
    assert mc.is_generation and not mc.is_multimodal
    assert (mc.head_dim, mc.num_experts, mc.num_experts_per_tok, mc.is_moe) == (head_dim, experts, top_k, experts > 0)
    assert mc.hf_config.rope_theta > 0


def test_c2_draft_and_dtype(tiny_llama):
    args = ServerArgs(model_path=tiny_llama, dtype="bfloat16")
    mc = ModelConfig.from_server_args(args, model_path=tiny_model_dir("qwen3"), is_draft_model=True)
    assert mc.is_draft_model and mc.architectures == ["Qwen3ForCausalLM"] and mc.dtype == torch.bfloat16


def test_c2_gguf_alias_resolves_to_a_folder(smollm2):
    mc = ModelConfig.from_server_args(ServerArgs(model_path="SmolLM2-135M-Instruct"))
    assert mc.model_path == smollm2
    assert (mc.num_attention_heads, mc.num_key_value_heads, mc.hf_config.tie_word_embeddings) == (9, 3, True)


def test_c2_errors(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="exceeds"):
        ModelConfig.from_server_args(ServerArgs(model_path=tiny_llama, context_length=10**6))
    with pytest.raises((FileNotFoundError, ValueError), match="not found"):
        ModelConfig.from_server_args(ServerArgs(model_path=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig.from_server_args(ServerArgs(model_path=tiny_llama, dtype="int3"))


def test_c2_unknown_architecture_is_refused_at_load(tiny_llama, tmp_path):
    from minisgl.entrypoints.engine import Engine

    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["FooForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture"):
        Engine(model_path=str(bad), max_total_tokens=64)
