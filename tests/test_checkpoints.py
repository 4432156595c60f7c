"""The checkpoints minisgl runs on: tiny random models and the SmolLM2 GGUF conversion."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from minisgl.model_loader import gguf
from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH, convert_gguf, resolve_model_path
from minisgl.tools.make_tiny_model import ARCHS, make_tiny_model
from minisgl.tools.make_tiny_model import main as make_tiny_model_main
from tests._models import smollm2_dir, tiny_model_dir


def _tensors_of(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _tensors(folder) -> dict[str, torch.Tensor]:
    return _tensors_of(f"{folder}/model.safetensors")


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_is_deterministic(arch, tmp_path):
    a = make_tiny_model(arch, tmp_path / "a")
    b = make_tiny_model(arch, tmp_path / "b")
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_tiny_model_seed_changes_weights_only(tmp_path):
    a = make_tiny_model("qwen3", tmp_path / "a", seed=0)
    b = make_tiny_model("qwen3", tmp_path / "b", seed=1)
    assert (a / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def test_tiny_model_cli(tmp_path, capsys):
    make_tiny_model_main(["--arch", "mixtral", "--out", str(tmp_path / "m"), "--seed", "0"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == (
        make_tiny_model("mixtral", tmp_path / "again") / "model.safetensors"
    ).read_bytes()


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_loads_offline_with_its_personality(arch):
    folder = tiny_model_dir(arch)
    config = AutoConfig.from_pretrained(folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tensors = _tensors(folder)
    assert config.model_type == arch
    # DeepSeek-V3's tiny model has a dense first layer before its MoE ones; MLA has no grouped
    # KV heads (its one latent is shared by every head), so its config repeats the head count.
    assert (config.hidden_size, config.num_hidden_layers) == (64, 3 if arch == "deepseek_v3" else 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 4 if arch.startswith("deepseek") else 2)
    assert config.max_position_embeddings == 1024
    assert config.vocab_size == len(tokenizer) == 512
    assert all(t.dtype == torch.float32 for t in tensors.values())
    generation = json.loads(open(f"{folder}/generation_config.json").read())
    assert generation["eos_token_id"] == config.eos_token_id == tokenizer.eos_token_id

    if arch == "llama":
        assert config.tie_word_embeddings
        assert "lm_head.weight" not in tensors
        rope = config.rope_parameters
        assert rope["rope_type"] == "llama3"
        assert (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]) == (8.0, 1.0, 4.0)
        assert rope["original_max_position_embeddings"] == 256
    else:
        assert not config.tie_word_embeddings
        assert "lm_head.weight" in tensors
    if arch == "qwen2":
        bias = tensors["model.layers.0.self_attn.q_proj.bias"]
        assert bias.shape == (64,) and bias.abs().sum() > 0
    if arch == "qwen3":
        assert config.head_dim == 32
        assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 32, 64)
        assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (32,)
    if arch == "qwen3_moe":
        assert (config.num_experts, config.num_experts_per_tok) == (8, 2)
        assert config.norm_topk_prob and config.moe_intermediate_size == 32
        assert config.decoder_sparse_step == 1 and config.mlp_only_layers == []
        # Saved per expert, as hub checkpoints are (transformers fuses them in memory).
        assert tensors["model.layers.1.mlp.experts.7.gate_proj.weight"].shape == (32, 64)
    if arch == "mixtral":
        assert (config.num_local_experts, config.num_experts_per_tok) == (4, 2)
        assert tensors["model.layers.1.block_sparse_moe.experts.3.w1.weight"].shape == (128, 64)

    # The random weights must give peaked logits: greedy output varies instead of repeating.
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer("The river rose early", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert len(set(out[0, ids.shape[1] :].tolist())) >= 8


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_tokenizer_round_trips_and_chats(arch):
    folder = tiny_model_dir(arch)
    fast = PreTrainedTokenizerFast.from_pretrained(folder)
    # For qwen2, AutoTokenizer rebuilds the tokenizer as Qwen2Tokenizer; it must agree.
    auto = AutoTokenizer.from_pretrained(folder)
    text = "The capital of France is Paris.\n\n  Numbers: 2024, 3.14; naïve café — 日本 ✓"
    ids = fast(text).input_ids
    assert auto(text).input_ids == ids
    assert fast.decode(ids) == auto.decode(ids) == text
    assert len(fast("The capital of France is Paris.").input_ids) < len("The capital of France is Paris.") // 2

    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(fast(special).input_ids) == 1
    assert fast.eos_token == "<|endoftext|>" and fast.bos_token is None

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    prompt = fast.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == prompt


def test_resolve_model_path_accepts_a_folder_and_explains_the_rest(tmp_path):
    folder = tiny_model_dir("llama")
    assert resolve_model_path(folder) == folder

    expected = r"'nope' not found: expected a folder with config\.json, a \.gguf file"
    with pytest.raises(FileNotFoundError, match=expected):
        resolve_model_path("nope")
    with pytest.raises(FileNotFoundError, match=DEFAULT_MODEL_PATH):
        resolve_model_path(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="is not a model"):
        resolve_model_path(str(tmp_path))  # a folder, but no config.json
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="is not a model"):
        resolve_model_path(str(tmp_path / "weights.bin"))


def test_convert_gguf_never_leaves_a_half_folder(tmp_path, monkeypatch):
    def crash(gguf_path, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(gguf, "_write_hf_folder", crash)
    (tmp_path / "m.gguf").write_bytes(b"")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    # A .gguf file is converted to float when another scheme than gguf is asked for.
    with pytest.raises(RuntimeError, match="mid-conversion"):
        resolve_model_path(str(tmp_path / "m.gguf"), quantization="w8a8_int8")
    assert list((tmp_path / "cache").iterdir()) == []

    # A finished folder is reused without converting again.
    (tmp_path / "cache" / "m").mkdir()
    (tmp_path / "cache" / "m" / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path / "m.gguf"), quantization="w8a8_int8") == str(tmp_path / "cache" / "m")
    assert convert_gguf(tmp_path / "m.gguf", tmp_path / "cache" / "m") == tmp_path / "cache" / "m"


def test_smollm2_converts_and_answers():
    folder = smollm2_dir()
    assert folder == resolve_model_path(DEFAULT_MODEL_PATH)
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == ["LlamaForCausalLM"] and config.tie_word_embeddings
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert not hasattr(config, "quantization_config")

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|im_end|>"
    generation = json.loads(open(f"{folder}/generation_config.json").read())
    assert generation["eos_token_id"] == tokenizer.eos_token_id == config.eos_token_id

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_weights_iterator_reads_what_safetensors_reads(tmp_path):
    """minisgl reads tensors with plain reads (no memory map, see weight_utils): every dtype,
    shape and value must be what safetensors' own reader returns, for two files in order."""
    from safetensors.torch import save_file

    from minisgl.model_loader.weight_utils import safetensors_weights_iterator

    torch.manual_seed(0)
    first = {
        "b.bf16": torch.randn(3, 5).to(torch.bfloat16),
        "a.f32": torch.randn(7),
        "c.f16": torch.randn(2, 2, 2).to(torch.float16),
        "d.i64": torch.arange(-3, 3),
        "e.empty": torch.empty(0, 4),
        "f.bool": torch.tensor([True, False]),
    }
    second = {"g.i32": torch.arange(4, dtype=torch.int32).reshape(2, 2)}
    save_file(first, tmp_path / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file(second, tmp_path / "model-00002-of-00002.safetensors")
    got = list(safetensors_weights_iterator(str(tmp_path)))
    assert sorted(name for name, _ in got[:-1]) == sorted(first) and got[-1][0] == "g.i32"
    expected = {**_tensors_of(tmp_path / "model-00001-of-00002.safetensors"), **second}
    for name, tensor in got:
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name

    # The real checkpoint too, tensor for tensor, and without mapping it: a memory-mapped file's
    # pages would count as resident memory (RssFile) while the iterator holds it open.
    folder = smollm2_dir()
    reference = _tensors(folder)
    size_mb = sum(t.numel() * t.element_size() for t in reference.values()) / 2**20
    before, most = _rss_file_mb(), 0.0
    got = {}
    for name, tensor in safetensors_weights_iterator(folder):
        got[name] = tensor
        most = max(most, _rss_file_mb() - before)
    assert got.keys() == reference.keys()
    assert all(torch.equal(got[k], reference[k]) for k in reference)
    assert most < 0.1 * size_mb, f"{most:.0f} MB of the {size_mb:.0f} MB checkpoint mapped while reading it"


def _rss_file_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:")) / 1024


def test_weights_iterator_refuses_a_truncated_file(tmp_path):
    from safetensors.torch import save_file

    from minisgl.model_loader.weight_utils import safetensors_weights_iterator

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(64, 64)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="'w' is cut short"):
        list(safetensors_weights_iterator(str(tmp_path)))
