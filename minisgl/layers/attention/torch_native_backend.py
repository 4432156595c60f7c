"""Attention over the paged KV pool in plain PyTorch.

Mirrors python/sglang/srt/layers/attention/torch_native_backend.py: gather K/V
through ``req_to_token`` and call ``scaled_dot_product_attention``. It is the
reference the Triton backend is tested against, and the CPU default.

SGLang's version loops over requests in both modes. minisgl batches decode:
``init_forward_metadata`` builds, once per forward, a [bs, max_seq_len] slot
table and a padding mask, so each layer's decode attention is one gather and
one SDPA call however many requests run. Extend keeps the per-request loop:
prompts differ in length and SDPA's causal kernel wants dense, unpadded rows.
As in the Triton backend, extend reads the cached prefix from the pool and the
new tokens' K/V from its arguments, so a caller may attend over K/V the pool does
not hold (MLA's forward_normal, whose pool holds latents: mla_attention.py); K/V
it stores are first rounded to the pool's dtype, so they read the same either way.
MLA's absorbed attention is a one-KV-head GQA with values narrower than keys,
which both modes run as they are. An EAGLE tree (speculative/eagle_utils.py) replaces the
causal mask of an extend with ``spec_info.custom_mask``, as SGLang's backends take it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F

from minisgl.layers.attention.base_attn_backend import AttentionBackend


@dataclasses.dataclass
class DecodeMetadata:
    slots: torch.Tensor  # [bs, max_seq_len] KV slot of every position (padding reads slot 0)
    mask: torch.Tensor  # [bs, 1, 1, max_seq_len] True where a position is real


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, model_runner) -> None:
        self.device = model_runner.device
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.decode_metadata: Optional[DecodeMetadata] = None

    def init_forward_metadata(self, forward_batch) -> None:
        if not forward_batch.forward_mode.is_decode():
            return  # extend reads what it needs from the ForwardBatch
        max_len = max(forward_batch.seq_lens_cpu)
        positions = torch.arange(max_len, device=self.device)
        real = positions[None, :] < forward_batch.seq_lens[:, None]  # [bs, max_len]
        slots = self.req_to_token[forward_batch.req_pool_indices, :max_len].masked_fill(~real, 0)
        self.decode_metadata = DecodeMetadata(slots=slots.long(), mask=real[:, None, None, :])

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if save_kv_cache:
            self._save_kv(k, v, layer, forward_batch)
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)  # [num_tokens, heads, head_dim]
        k = k.reshape(-1, layer.tp_k_head_num, layer.qk_head_dim)
        v = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)
        out = torch.empty(q.shape[0], layer.tp_q_head_num, layer.v_head_dim, dtype=q.dtype, device=q.device)
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        if save_kv_cache and k_buf.dtype != q.dtype:
            # New tokens are seen as the pool holds them (rounded to --kv-cache-dtype), as every later
            # step and the C++ kernels see them, and as SGLang's backend does by reading them back.
            k, v = k.to(k_buf.dtype).to(q.dtype), v.to(v_buf.dtype).to(q.dtype)
        # EAGLE's trees (speculative/eagle_utils.py): each new token sees the prefix and its own
        # ancestors, one [extend_len, seq_len] block per request, flattened (SGLang's custom_mask).
        custom_mask = getattr(forward_batch.spec_info, "custom_mask", None)
        start = mask_start = 0
        for i in range(forward_batch.batch_size):
            extend_len = forward_batch.extend_seq_lens_cpu[i]
            prefix_len = forward_batch.extend_prefix_lens_cpu[i]
            seq_len = prefix_len + extend_len
            new = slice(start, start + extend_len)
            # [heads, tokens, head_dim]: the layout SDPA wants
            qi = q[new].transpose(0, 1)
            ki, vi = k[new], v[new]
            if prefix_len > 0:
                slots = self.req_to_token[forward_batch.req_pool_indices_cpu[i], :prefix_len]
                ki = torch.cat([_gather(k_buf, slots).to(q.dtype), ki])
                vi = torch.cat([_gather(v_buf, slots).to(q.dtype), vi])
            ki, vi = ki.transpose(0, 1), vi.transpose(0, 1)
            if custom_mask is not None:
                mask = custom_mask[mask_start : mask_start + extend_len * seq_len].view(extend_len, seq_len)
                mask_start += extend_len * seq_len
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=layer.scaling, enable_gqa=True)
            elif prefix_len == 0:
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=layer.scaling, enable_gqa=True)
            else:
                # New token j sits at absolute position prefix_len + j and sees keys 0..prefix_len + j.
                mask = torch.ones(extend_len, seq_len, dtype=torch.bool, device=q.device).tril(diagonal=prefix_len)
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=layer.scaling, enable_gqa=True)
            out[new] = o.transpose(0, 1)
            start += extend_len
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if save_kv_cache:
            self._save_kv(k, v, layer, forward_batch)
        md = self.decode_metadata
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        # The query heads sharing a KV head become that head's query rows: [bs, kv_heads, group, head_dim]
        # against [bs, kv_heads, max_len, head_dim], so no KV head is ever copied per query head.
        q = q.view(-1, layer.tp_k_head_num, layer.tp_q_head_num // layer.tp_k_head_num, layer.qk_head_dim)
        keys = _gather(k_buf, md.slots).transpose(1, 2).to(q.dtype)
        values = _gather(v_buf, md.slots).transpose(1, 2).to(q.dtype)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=md.mask, scale=layer.scaling)
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    @staticmethod
    def _save_kv(k, v, layer, forward_batch) -> None:
        forward_batch.token_to_kv_pool.set_kv_buffer(
            layer.layer_id,
            forward_batch.out_cache_loc,
            k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
            v.view(-1, layer.tp_v_head_num, layer.v_head_dim),
        )


def _gather(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """buffer[slots] for a [num_slots, heads, head_dim] pool: slots.shape + [heads, head_dim].

    Written as an embedding lookup of flattened rows, which copies whole rows and measured
    several times faster on CPU than advanced indexing of the 3-D buffer.
    """
    rows = F.embedding(slots, buffer.view(buffer.shape[0], -1))
    return rows.view(*slots.shape, *buffer.shape[1:])
