"""MLAAttention: DeepSeek's multi-head latent attention over the latent KV pool.

Mirrors the execution half of DeepseekV2AttentionMLA in SGLang's
python/sglang/srt/models/deepseek_v2.py (forward_normal_prepare/core,
forward_absorb_prepare/core, post_load_weights) and the dispatch of
models/deepseek_common/attention_backend_handler.py (handle_attention_triton,
which SGLang also uses for torch_native and intel_amx). The model computes the
per-head query, the per-token latent c (kv_lora_rank wide, after kv_a_layernorm) and
the rotated rope key; this layer stores (c, k_pe) in the pool and attends, on one of
two paths that give the same result:

- forward_normal ("MHA", extend with no cached prefix anywhere in the batch): expand
  c through kv_b_proj into every head's k_nope and v, and run ordinary attention
  among the new tokens. A prompt's tokens are many; expanding them once is cheap.
- forward_absorb ("MLA", decode, and extend on top of a prefix): never expand the
  cache. With kv_b_proj split per head into W_UK [nope, c] and W_UV [v, c],
  q_nope . (W_UK c) = (q_nope W_UK) . c, so the query is moved into latent space
  once (q_nope W_UK, [heads, kv_lora_rank]) and attends to c directly: one key head
  [c, k_pe] and one value head c shared by all query heads (MQA). The output, a
  latent per head, is mapped to v by W_UV. Decode reads kv_lora_rank + rope values
  per cached token instead of heads * (nope + rope + v).

SGLang also has chunked-prefix MHA for long prefixes, fused rope/quantized variants
and FP8 weight absorption; omitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl import tracing
from minisgl.layers.radix_attention import RadixAttention

if TYPE_CHECKING:
    from minisgl.model_executor.forward_batch_info import ForwardBatch


class MLAAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,  # this rank's heads
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        kv_lora_rank: int,
        scaling: float,
        layer_id: int,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.layer_id = layer_id
        # Two views of the same layer's pool: per-head K/V of the new tokens, or the latent as one head.
        self.attn_mha = RadixAttention(
            num_heads, qk_nope_head_dim + qk_rope_head_dim, scaling, num_heads, layer_id, v_head_dim=v_head_dim
        )
        self.attn_mqa = RadixAttention(
            num_heads, kv_lora_rank + qk_rope_head_dim, scaling, 1, layer_id, v_head_dim=kv_lora_rank
        )
        self.w_kc: torch.Tensor | None = None  # [heads, qk_nope_head_dim, kv_lora_rank], W_UK
        self.w_vc: torch.Tensor | None = None  # [heads, kv_lora_rank, v_head_dim], W_UV transposed

    def absorb_kv_b_proj(self, kv_b_weight: torch.Tensor) -> None:
        """Split this rank's kv_b_proj weight [heads * (nope + v), kv_lora_rank] into W_UK and W_UV.

        Called once after loading, before the linear layers repack their weights for the device.
        """
        w = kv_b_weight.detach().view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        self.w_kc = w[:, : self.qk_nope_head_dim].contiguous()
        self.w_vc = w[:, self.qk_nope_head_dim :].transpose(1, 2).contiguous()

    def forward(
        self,
        q_nope: torch.Tensor,  # [T, heads, qk_nope_head_dim]
        q_pe: torch.Tensor,  # [T, heads, qk_rope_head_dim], rotated
        latent: torch.Tensor,  # [T, kv_lora_rank], normalized
        k_pe: torch.Tensor,  # [T, qk_rope_head_dim], rotated
        kv_b_proj: nn.Module,  # latent -> heads * (nope + v)
        forward_batch: "ForwardBatch",
    ) -> torch.Tensor:  # [T, heads * v_head_dim]
        pool = forward_batch.token_to_kv_pool
        pool.set_mla_kv_buffer(self.layer_id, forward_batch.out_cache_loc, latent, k_pe)
        if pool.dtype != latent.dtype:
            # The new tokens as the pool holds them (--kv-cache-dtype), as later steps see them.
            latent, k_pe = latent.to(pool.dtype).to(latent.dtype), k_pe.to(pool.dtype).to(k_pe.dtype)
        mode = forward_batch.forward_mode
        plain_extend = mode.is_extend() and not (mode.is_target_verify() or mode.is_draft_extend())
        if plain_extend and sum(forward_batch.extend_prefix_lens_cpu) == 0:
            tracing.point("MLAAttention.forward", layer_id=self.layer_id, method="mha")
            return self.forward_normal(q_nope, q_pe, latent, k_pe, kv_b_proj, forward_batch)
        tracing.point("MLAAttention.forward", layer_id=self.layer_id, method="mla_absorb")
        return self.forward_absorb(q_nope, q_pe, latent, k_pe, forward_batch)

    def forward_normal(self, q_nope, q_pe, latent, k_pe, kv_b_proj, forward_batch) -> torch.Tensor:
        num_tokens = q_nope.shape[0]
        kv = kv_b_proj(latent).view(num_tokens, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe[:, None, :].expand(-1, self.num_heads, -1)], dim=-1)
        # The pool holds latents, not these K/V: the backend attends among the new tokens only.
        return self.attn_mha(q, k, v.contiguous(), forward_batch, save_kv_cache=False)

    def forward_absorb(self, q_nope, q_pe, latent, k_pe, forward_batch) -> torch.Tensor:
        num_tokens = q_nope.shape[0]
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.w_kc)  # [heads, T, kv_lora_rank]
        q = torch.cat([q_latent.transpose(0, 1), q_pe], dim=-1)  # [T, heads, kv_lora_rank + rope]
        k = torch.cat([latent, k_pe], dim=-1)[:, None, :]  # [T, 1, kv_lora_rank + rope], as the pool's rows
        o = self.attn_mqa(q, k, k[..., : self.kv_lora_rank], forward_batch, save_kv_cache=False)
        o = o.view(num_tokens, self.num_heads, self.kv_lora_rank).transpose(0, 1)  # [heads, T, kv_lora_rank]
        return torch.bmm(o, self.w_vc).transpose(0, 1).reshape(num_tokens, self.num_heads * self.v_head_dim)
