"""Llama, as a composition of execution bricks from layers/.

Mirrors python/sglang/srt/models/llama.py (LlamaMLP, LlamaAttention,
LlamaDecoderLayer, LlamaModel, LlamaForCausalLM, load_weights). The file holds
model semantics only: no cache, batching or sampling logic. Compare it line by
line with transformers' modeling_llama.py. SGLang also supports pipeline
parallelism and quantization here; omitted.
"""

from __future__ import annotations

from typing import Iterable, Optional, Union

import torch
from torch import nn

from minisgl.distributed.parallel_state import (
    get_pipeline_model_parallel_rank,
    get_pipeline_model_parallel_world_size,
    get_tensor_model_parallel_world_size,
)
from minisgl.layers.activation import SiluAndMul
from minisgl.layers.aux_hidden_states import AuxHiddenStates, default_eagle3_layers
from minisgl.layers.layernorm import RMSNorm
from minisgl.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minisgl.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from minisgl.layers.radix_attention import RadixAttention
from minisgl.layers.rotary_embedding import get_rope
from minisgl.layers.utils import PPMissingLayer, PPProxyTensors, get_layer_id, make_layers
from minisgl.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.model_loader.weight_utils import default_weight_loader


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    def __init__(self, config, layer_id: int, bias: bool = False) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = getattr(config, "num_key_value_heads", None) or self.total_num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.total_num_heads
        self.num_heads = self.total_num_heads // tp_size
        self.num_kv_heads = max(1, self.total_num_kv_heads // tp_size)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, self.total_num_heads, self.total_num_kv_heads, bias=bias
        )
        self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, config.hidden_size)
        self.rotary_emb = get_rope(
            self.head_dim,
            self.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            getattr(config, "rope_scaling", None),
        )
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class LlamaDecoderLayer(nn.Module):
    # What the Llama family varies per model: the attention class, Q/K/V bias, the MLP.
    attention_cls: type[nn.Module] = LlamaAttention
    attention_bias = False

    def __init__(self, config, layer_id: int) -> None:
        super().__init__()
        bias = getattr(config, "attention_bias", self.attention_bias)
        self.self_attn = self.attention_cls(config, layer_id, bias=bias)
        self.mlp = self.make_mlp(config, layer_id)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def make_mlp(self, config, layer_id: int) -> nn.Module:
        return LlamaMLP(config.hidden_size, config.intermediate_size)

    def forward(
        self, positions, hidden_states, forward_batch, residual: Optional[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, config, decoder_layer_type: type[nn.Module] = LlamaDecoderLayer) -> None:
        super().__init__()
        pp_rank, pp_size = get_pipeline_model_parallel_rank(), get_pipeline_model_parallel_world_size()
        self.is_first_rank, self.is_last_rank = pp_rank == 0, pp_rank == pp_size - 1
        self.embed_tokens = (
            VocabParallelEmbedding(config.vocab_size, config.hidden_size) if self.is_first_rank else PPMissingLayer()
        )
        self.layers, self.start_layer, self.end_layer = make_layers(
            config.num_hidden_layers, lambda i: decoder_layer_type(config, i)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps) if self.is_last_rank else PPMissingLayer()
        self.layers_to_capture: list[int] = []  # EAGLE3: the layers whose input the draft reads

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch, pp_proxy_tensors=None):
        """(hidden states, EAGLE3's aux hidden states) on the last stage; PPProxyTensors before it."""
        if self.is_first_rank:
            hidden_states, residual = self.embed_tokens(input_ids), None  # [num_tokens, hidden]
        else:
            hidden_states, residual = pp_proxy_tensors["hidden_states"], pp_proxy_tensors["residual"]
        aux_hidden_states = AuxHiddenStates(self.layers_to_capture)
        for i in range(self.start_layer, self.end_layer):
            aux_hidden_states.capture(i, hidden_states, residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        if not self.is_last_rank:
            return PPProxyTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states, aux_hidden_states.get()


class LlamaForCausalLM(nn.Module):
    decoder_layer_type: type[nn.Module] = LlamaDecoderLayer
    # checkpoint name -> (fused parameter name, shard id)
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, self.decoder_layer_type)
        tie = getattr(config, "tie_word_embeddings", False)
        self.lm_head = PPMissingLayer()
        if self.model.is_last_rank:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
            if tie and self.model.is_first_rank:
                self.lm_head.tie_weights(self.model.embed_tokens)
        # Tied, but the embedding is on the first stage: the last loads its tensor into its own head.
        self.tied_across_stages = tie and self.model.is_last_rank and not self.model.is_first_rank
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch, pp_proxy_tensors=None
    ) -> Union[LogitsProcessorOutput, PPProxyTensors]:
        out = self.model(input_ids, positions, forward_batch, pp_proxy_tensors)
        if not self.model.is_last_rank:
            return out  # PPProxyTensors, for the next stage
        hidden_states, aux_hidden_states = out
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch, aux_hidden_states)

    def get_embed_and_head(self) -> tuple[nn.Module, nn.Module]:
        """What an EAGLE draft shares with its target (speculative/eagle_worker.py)."""
        return self.model.embed_tokens, self.lm_head

    def set_eagle3_layers_to_capture(self, layer_ids: Optional[list[int]] = None) -> None:
        """EAGLE3 reads the hidden states entering these layers (SGLang's default when None)."""
        n = self.config.num_hidden_layers
        self.model.layers_to_capture = default_eagle3_layers(n) if layer_ids is None else list(layer_ids)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Route each checkpoint tensor to its parameter's weight_loader; return the names loaded."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or not self._on_this_stage(name):
                continue
            if name == "lm_head.weight" and getattr(self.config, "tie_word_embeddings", False):
                continue
            if name == "model.embed_tokens.weight" and self.tied_across_stages:
                name = "lm_head.weight"
            target = self._load_one(params, name, tensor)
            if target is not None:
                loaded.add(target)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"checkpoint is missing weights for: {sorted(missing)[:8]}")
        return loaded

    def _on_this_stage(self, name: str) -> bool:
        """Whether this pipeline stage holds the weight: its own layers, the embedding on the first,
        the norm and head on the last (a tied head also takes the embedding's tensor)."""
        layer_id = get_layer_id(name)
        if layer_id is not None:
            return self.model.start_layer <= layer_id < self.model.end_layer
        if name == "model.embed_tokens.weight":
            return self.model.is_first_rank or self.tied_across_stages
        if name in ("model.norm.weight", "lm_head.weight"):
            return self.model.is_last_rank
        return True

    def _load_one(self, params: dict, name: str, tensor: torch.Tensor) -> Optional[str]:
        for param_name, ckpt_name, shard_id in self.stacked_params_mapping:
            if f".{ckpt_name}." in name:
                fused = name.replace(ckpt_name, param_name)
                params[fused].weight_loader(params[fused], tensor, shard_id)
                return fused
        if name not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no parameter in {type(self).__name__}")
        param = params[name]
        getattr(param, "weight_loader", default_weight_loader)(param, tensor)
        return name


EntryClass = LlamaForCausalLM
