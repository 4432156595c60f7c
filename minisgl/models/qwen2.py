"""Qwen2: Llama's architecture with a bias on the Q/K/V projections.

Mirrors python/sglang/srt/models/qwen2.py. SGLang keeps a full copy of the
decoder here; in minisgl the one difference is the whole file, which makes
the difference easy to see.
"""

from minisgl.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_bias = True


class Qwen2ForCausalLM(LlamaForCausalLM):
    decoder_layer_type = Qwen2DecoderLayer


EntryClass = Qwen2ForCausalLM
