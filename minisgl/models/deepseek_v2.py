"""DeepSeek-V2 and DeepSeek-V3: multi-head latent attention and routed + shared experts.

Mirrors python/sglang/srt/models/deepseek_v2.py (MoEGate, DeepseekV2MoE,
DeepseekV2AttentionMLA, DeepseekV2DecoderLayer, DeepseekV2ForCausalLM with
post_load_weights, DeepseekV3ForCausalLM). Compare it with transformers'
modeling_deepseek_v2.py / modeling_deepseek_v3.py. The file holds the model's
semantics; how latent attention runs over the KV pool (the two equivalent paths,
the weight absorption) is layers/mla_attention.py, and the routers are
layers/moe/topk.py.

Attention: the query comes from hidden directly (q_proj, V2) or through a low-rank
bottleneck (q_a_proj, q_a_layernorm, q_b_proj: "q LoRA", V3). Keys and values come
from one compressed latent per token (kv_a_proj_with_mqa, then kv_a_layernorm) which
kv_b_proj expands per head into k_nope and v; rope acts on a separate, narrow key
part k_pe shared by all heads and on the matching part of the query, in the GPT-J
(interleaved) layout unless the config says rope_interleave = false.

MLP: the first first_k_dense_replace layers (and those off moe_layer_freq) are
dense; the others route each token to num_experts_per_tok of n_routed_experts
experts, scale their sum by routed_scaling_factor and add n_shared_experts always-on
experts. SGLang also fuses q_a_proj with kv_a_proj_with_mqa, fuses shared experts
into the routed ones, and has expert/data parallelism, two-batch overlap, NSA
(V3.2), MTP layers and quantized kernels; omitted.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from minisgl.distributed.parallel_state import get_tensor_model_parallel_world_size
from minisgl.layers.layernorm import RMSNorm
from minisgl.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear, apply_linear
from minisgl.layers.mla_attention import MLAAttention
from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE
from minisgl.layers.rotary_embedding import get_rope, yarn_get_mscale
from minisgl.models.llama import LlamaDecoderLayer, LlamaMLP
from minisgl.models.qwen3_moe import Qwen3MoeForCausalLM

# topk_method -> the scoring function DeepSeek's configs pair it with.
_TOPK_METHODS = {"greedy": "softmax", "group_limited_greedy": "softmax", "noaux_tc": "sigmoid"}


def _topk_method(config) -> str:
    # transformers' DeepseekV3Config has no topk_method: its router is always noaux_tc.
    default = "noaux_tc" if config.model_type == "deepseek_v3" else "greedy"
    method = getattr(config, "topk_method", None) or default
    if method not in _TOPK_METHODS:
        raise ValueError(f"unsupported topk_method {method!r}; minisgl has {sorted(_TOPK_METHODS)}")
    scoring = getattr(config, "scoring_func", None) or _TOPK_METHODS[method]
    if scoring != _TOPK_METHODS[method]:
        raise ValueError(f"topk_method {method!r} with scoring_func {scoring!r} is not a DeepSeek router")
    return method


class MoEGate(nn.Module):
    """The router's logits; V3's gate also carries the bias that steers the choice (not the weights)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size), requires_grad=False)
        self.e_score_correction_bias = None
        if _topk_method(config) == "noaux_tc":
            bias = torch.empty(config.n_routed_experts, dtype=torch.float32)
            self.e_score_correction_bias = nn.Parameter(bias, requires_grad=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return apply_linear(hidden_states, self.weight)  # [num_tokens, n_routed_experts]


class DeepseekV2MoE(nn.Module):
    def __init__(self, config, layer_id: int) -> None:
        super().__init__()
        self.routed_scaling_factor = config.routed_scaling_factor
        self.gate = MoEGate(config)
        grouped = _topk_method(config) != "greedy"
        self.experts = FusedMoE(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            layer_id=layer_id,
            renormalize=config.norm_topk_prob,
            num_expert_group=config.n_group if grouped else None,
            topk_group=config.topk_group if grouped else None,
            correction_bias=self.gate.e_score_correction_bias,
        )
        self.shared_experts = None
        if config.n_shared_experts:
            self.shared_experts = LlamaMLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.experts(hidden_states, self.gate(hidden_states)) * self.routed_scaling_factor
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states)
        return out


class DeepseekV2AttentionMLA(nn.Module):
    def __init__(self, config, layer_id: int, bias: bool = False) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        total_heads = config.num_attention_heads
        self.num_local_heads = total_heads // tp_size
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        hidden, eps = config.hidden_size, config.rms_norm_eps
        if self.q_lora_rank is not None:
            self.q_a_proj = ReplicatedLinear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps=eps)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, total_heads * self.qk_head_dim)
        else:
            self.q_proj = ColumnParallelLinear(hidden, total_heads * self.qk_head_dim)
        # One latent and one rope key per token for all heads: replicated on every rank.
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=eps)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank, total_heads * (self.qk_nope_head_dim + config.v_head_dim)
        )
        self.o_proj = RowParallelLinear(total_heads * config.v_head_dim, hidden, bias=bias)

        rope_scaling = getattr(config, "rope_scaling", None)
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
            rope_scaling = None
        self.rotary_emb = get_rope(
            self.qk_rope_head_dim,
            self.qk_rope_head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            rope_scaling,
            is_neox_style=not getattr(config, "rope_interleave", True),
        )
        scaling = self.qk_head_dim**-0.5
        if rope_scaling:
            # YaRN sharpens the softmax by mscale(factor, mscale_all_dim)^2 (1 when mscale_all_dim is absent).
            mscale = yarn_get_mscale(rope_scaling["factor"], float(rope_scaling.get("mscale_all_dim", 0)))
            scaling = scaling * mscale * mscale
        self.attn = MLAAttention(
            self.num_local_heads,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            config.v_head_dim,
            self.kv_lora_rank,
            scaling,
            layer_id,
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        if self.q_lora_rank is not None:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        else:
            q = self.q_proj(hidden_states)
        q_nope, q_pe = q.view(num_tokens, self.num_local_heads, self.qk_head_dim).split(
            [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1
        )
        latent, k_pe = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())  # [T, kv_lora_rank]
        q_pe, k_pe = self.rotary_emb(positions, q_pe.reshape(num_tokens, -1), k_pe.contiguous())
        q_pe = q_pe.view(num_tokens, self.num_local_heads, self.qk_rope_head_dim)
        return self.o_proj(self.attn(q_nope, q_pe, latent, k_pe, self.kv_b_proj, forward_batch))


class DeepseekV2DecoderLayer(LlamaDecoderLayer):
    attention_cls = DeepseekV2AttentionMLA

    def make_mlp(self, config, layer_id: int) -> nn.Module:
        is_sparse = (
            config.n_routed_experts is not None
            and layer_id >= config.first_k_dense_replace
            and layer_id % getattr(config, "moe_layer_freq", 1) == 0
        )
        if not is_sparse:
            return LlamaMLP(config.hidden_size, config.intermediate_size)
        return DeepseekV2MoE(config, layer_id)


class DeepseekV2ForCausalLM(Qwen3MoeForCausalLM):
    """Qwen3-MoE's loading (expert stacking); only gate/up projections are fused (no qkv_proj in MLA)."""

    decoder_layer_type = DeepseekV2DecoderLayer
    stacked_params_mapping = [("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = super().load_weights(weights)
        self.post_load_weights()
        return loaded

    def post_load_weights(self) -> None:
        """Split every kv_b_proj into the absorbed W_UK / W_UV, while its weight is still unpacked.

        An int8 checkpoint's weight is dequantized first (weight * weight_scale), as SGLang's
        post_load_weights does for w8a8_int8 (models/deepseek_v2.py at 64bca53)."""
        for layer in self.model.layers[self.model.start_layer : self.model.end_layer]:
            kv_b_proj = layer.self_attn.kv_b_proj
            weight = kv_b_proj.weight
            if weight.dtype == torch.int8:
                weight = (weight.float() * kv_b_proj.weight_scale).to(layer.self_attn.kv_a_layernorm.weight.dtype)
            layer.self_attn.attn.absorb_kv_b_proj(weight)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    pass


EntryClass = [DeepseekV2ForCausalLM, DeepseekV3ForCausalLM]
