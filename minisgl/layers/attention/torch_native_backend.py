"""Attention over the paged KV pool in plain PyTorch, one request at a time.

Mirrors python/sglang/srt/layers/attention/torch_native_backend.py: gather each
request's K/V through ``req_to_token`` and call ``scaled_dot_product_attention``.
It is the reference the Triton backend is tested against, and the CPU default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.layers.attention.base_attn_backend import AttentionBackend


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, model_runner) -> None:
        self.device = model_runner.device

    def init_forward_metadata(self, forward_batch) -> None:
        # Everything this backend needs is already on the ForwardBatch.
        pass

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if save_kv_cache:
            self._save_kv(k, v, layer, forward_batch)
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)  # [num_tokens, heads, head_dim]
        out = torch.empty(q.shape[0], layer.tp_q_head_num, layer.v_head_dim, dtype=q.dtype, device=q.device)
        start = 0
        for i in range(forward_batch.batch_size):
            extend_len = forward_batch.extend_seq_lens_cpu[i]
            prefix_len = forward_batch.extend_prefix_lens_cpu[i]
            seq_len = prefix_len + extend_len
            keys, values = self._gather_kv(layer, forward_batch, i, seq_len)
            # New token j sits at absolute position prefix_len + j and sees keys 0..prefix_len + j.
            mask = torch.ones(extend_len, seq_len, dtype=torch.bool, device=q.device).tril(diagonal=prefix_len)
            out[start : start + extend_len] = self._sdpa(q[start : start + extend_len], keys, values, mask, layer)
            start += extend_len
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if save_kv_cache:
            self._save_kv(k, v, layer, forward_batch)
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)  # [batch_size, heads, head_dim]
        out = torch.empty(q.shape[0], layer.tp_q_head_num, layer.v_head_dim, dtype=q.dtype, device=q.device)
        for i in range(forward_batch.batch_size):
            keys, values = self._gather_kv(layer, forward_batch, i, forward_batch.seq_lens_cpu[i])
            out[i : i + 1] = self._sdpa(q[i : i + 1], keys, values, None, layer)
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    @staticmethod
    def _save_kv(k, v, layer, forward_batch) -> None:
        forward_batch.token_to_kv_pool.set_kv_buffer(
            layer.layer_id,
            forward_batch.out_cache_loc,
            k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
            v.view(-1, layer.tp_v_head_num, layer.v_head_dim),
        )

    @staticmethod
    def _gather_kv(layer, forward_batch, i: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        req_pool_idx = forward_batch.req_pool_indices_cpu[i]
        slots = forward_batch.req_to_token_pool.req_to_token[req_pool_idx, :seq_len]
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        return k_buf[slots], v_buf[slots]  # [seq_len, kv_heads, head_dim]

    @staticmethod
    def _sdpa(q, keys, values, mask, layer) -> torch.Tensor:
        # SDPA wants [heads, tokens, head_dim]; enable_gqa broadcasts each KV head over its group.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            keys.transpose(0, 1).to(q.dtype),
            values.transpose(0, 1).to(q.dtype),
            attn_mask=mask,
            scale=layer.scaling,
            enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
        )
        return out.transpose(0, 1)
