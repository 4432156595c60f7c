"""Build tiny random checkpoints that look, on disk, exactly like real ones.

Tests, notebooks and traces need models that load in milliseconds yet carry every
personality the engine must handle: tied embeddings and llama3 rope scaling (llama),
qkv bias (qwen2), a head_dim that is not hidden/heads plus q/k norm (qwen3), sparse
MoE blocks (qwen3_moe, mixtral), and multi-head latent attention with shared experts
and YaRN rope (deepseek_v2: no q LoRA, softmax greedy gate; deepseek_v3: q LoRA, a
dense first layer, sigmoid gate with correction bias over expert groups). Each checkpoint is made by transformers' own
config and model classes and saved with ``save_pretrained``, so its tensor names,
shapes and config keys are the ones a hub checkpoint has, and HF transformers can
serve as the reference implementation the engine is compared against.

Everything is deterministic: the same (arch, seed) gives byte-identical files, so
golden traces recorded on these models stay stable.

    python -m minisgl.tools.make_tiny_model --arch qwen3 --out /tmp/tiny-qwen3
"""

from __future__ import annotations

import argparse
import pathlib

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3")

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]  # ids 0, 1, 2
TOKENIZER_VOCAB_SIZE = 512
MAX_POSITION_EMBEDDINGS = 1024

# ChatML, the format of Qwen and SmolLM2 instruct models.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The tokenizer's training text, written for this project (no third-party text), so
# that merges form real English subwords and decoded output reads like words.
CORPUS = """\
The river rose early in the spring, and the people of the valley walked down to the
water to watch it pass. Old boats were pulled up on the grass, and the children counted
the birds that rested on the stones. Nobody was in a hurry. The bread was warm, the
morning was bright, and the long road to the city could wait another day.

A serving engine is a patient machine. It takes many requests at once, places their
tokens in a shared cache, and decides at every step which work should run next. When a
new prompt arrives, the scheduler looks for a prefix that is already stored, so that the
model does not compute the same keys and values twice. When memory runs low, it pauses a
request and returns to it later. The model itself only turns numbers into other numbers.

What is the capital of France? The capital of France is Paris. What is the capital of
Italy? The capital of Italy is Rome. Questions and answers like these are simple, but a
good answer is short, correct and polite. The assistant should say what it knows, say
when it does not know, and never invent a fact to fill the silence.

In the workshop the carpenter measured each board twice before cutting it once. She kept
her tools clean and her notes in order, because a small mistake in the first hour becomes
a large mistake by the evening. Her apprentice asked why the work was so slow. She smiled
and said that slow work done well is faster than quick work done again.

Numbers have their own quiet music: one, two, three, four, five, six, seven, eight, nine,
ten. A table of values, a list of names, a line of code that reads from left to right.
The computer follows each instruction in order, and when the order is wrong, it follows
the wrong order with the same care. That is why we test what we build, and why we read
what we test.

At night the town grew still. The lamps were lit one by one along the harbor, and the
sound of the sea came through the open windows. A letter waited on the table, written
in a careful hand: thank you for the visit, the garden is green again, and the door is
always open to friends who travel from far away.
"""


# Qwen2's pre-tokenizer split (transformers' models/qwen2/tokenization_qwen2.py).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on CORPUS; any (NFC) text round-trips through it.

    The pipeline is exactly Qwen2's, because for model_type qwen2 `AutoTokenizer`
    ignores tokenizer.json's pipeline and rebuilds it as `Qwen2Tokenizer` from the
    vocab and merges; with the same pipeline every loader encodes identically.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        # All 256 byte symbols, so bytes absent from CORPUS still encode.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.split("\n\n"), trainer)
    # Like Qwen: no BOS is prepended; <|endoftext|> ends and pads a document.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        chat_template=CHAT_TEMPLATE,
    )


def _config(
    arch: str, vocab_size: int, eos_token_id: int, num_hidden_layers: int | None = None
) -> tuple[type[PreTrainedModel], PreTrainedConfig]:
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=num_hidden_layers or 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        # The tokenizer prepends no BOS; Llama's and Mixtral's default id (1) is <|im_start|> here.
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        dtype="float32",
    )
    if arch == "llama":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        }
        return LlamaForCausalLM, LlamaConfig(**common, tie_word_embeddings=True, rope_parameters=rope)
    if arch == "qwen2":
        # Qwen2 always has q/k/v bias; it is not a config switch.
        return Qwen2ForCausalLM, Qwen2Config(**common, tie_word_embeddings=False)
    if arch == "qwen3":
        # head_dim 32 != hidden/heads (16): q_proj is [128, 64], o_proj is [64, 128].
        return Qwen3ForCausalLM, Qwen3Config(**common, head_dim=32, tie_word_embeddings=False)
    if arch == "qwen3_moe":
        moe = dict(
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
        # Qwen3 configs default head_dim to 128; keep hidden/heads here.
        config = Qwen3MoeConfig(**common, **moe, head_dim=16, tie_word_embeddings=False)
        return Qwen3MoeForCausalLM, config
    if arch == "mixtral":
        moe = dict(num_local_experts=4, num_experts_per_tok=2)
        return MixtralForCausalLM, MixtralConfig(**common, **moe, tie_word_embeddings=False)
    if arch in ("deepseek_v2", "deepseek_v3"):
        return _deepseek_config(arch, common, num_hidden_layers)
    raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")


def _deepseek_config(
    arch: str, common: dict, num_hidden_layers: int | None
) -> tuple[type[PreTrainedModel], PreTrainedConfig]:
    """MLA at 1/16 of DeepSeek's widths (kv_lora_rank 32, rope 8, nope 16, v 16), 8 routed experts.

    Both use YaRN with DeepSeek's keys (mscale, mscale_all_dim), so the cos/sin magnitude and the
    softmax scale both change; beta_fast 32 / beta_slow 1 over 256 original positions leave some
    rope dimensions extrapolated, some interpolated and one on the ramp.
    """
    mla = dict(
        common,
        num_key_value_heads=4,  # MLA has no KV heads of its own; HF reads this for its cache
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
        tie_word_embeddings=False,
    )
    if arch == "deepseek_v2":
        rope = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256,
                    beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707)  # fmt: skip
        config = DeepseekV2Config(
            **mla, q_lora_rank=None, topk_method="greedy", n_group=1, topk_group=1,
            routed_scaling_factor=1.5, norm_topk_prob=False, first_k_dense_replace=0, rope_parameters=rope,
        )  # fmt: skip
        return DeepseekV2ForCausalLM, config
    rope = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256,
                beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.8)  # fmt: skip
    config = DeepseekV3Config(
        **dict(mla, num_hidden_layers=num_hidden_layers or 3), q_lora_rank=24, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1, rope_interleave=True,
        num_nextn_predict_layers=0, rope_parameters=rope,
    )  # fmt: skip
    return DeepseekV3ForCausalLM, config


@torch.no_grad()
def _randomize(model: PreTrainedModel, seed: int) -> None:
    """Overwrite every parameter from one seeded generator, in name order.

    The models' own init (std 0.02, zero biases, unit norms) gives near-flat logits,
    so greedy decoding repeats one token, and it leaves biases and norm weights where
    a loader that drops them goes unnoticed. Std 0.2 keeps greedy output varied for
    every arch (measured: 0.1 collapses some prompts into one repeated token, 0.25
    into short loops); biases are non-zero and norm weights are 1 + noise.
    A private generator, not torch.manual_seed, so the caller's RNG is left alone.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.1 * noise)
        else:
            param.copy_(0.2 * noise)
    # DeepSeek-V3's router bias is a buffer; left at zero, a loader that dropped it would pass.
    for name, buf in sorted(model.named_buffers()):
        if name.endswith("e_score_correction_bias"):
            buf.copy_(0.1 * torch.randn(buf.shape, generator=gen, dtype=torch.float32))


def make_tiny_model(arch: str, out_dir, seed: int = 0, num_hidden_layers: int | None = None) -> pathlib.Path:
    """Write a tiny random `arch` checkpoint (config, safetensors, tokenizer) to out_dir; num_hidden_layers
    overrides the arch's 2 (3 for deepseek_v3), e.g. for as many pipeline stages."""
    out = pathlib.Path(out_dir)
    tokenizer = build_tokenizer()
    eos_token_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    model_cls, config = _config(arch, len(tokenizer), eos_token_id, num_hidden_layers)
    model = model_cls(config).to(torch.float32).eval()
    _randomize(model, seed)
    model.generation_config = GenerationConfig(eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHS, required=True)
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-hidden-layers", type=int, default=None)
    args = parser.parse_args(argv)
    print(make_tiny_model(args.arch, args.out, args.seed, args.num_hidden_layers))


if __name__ == "__main__":
    main()
