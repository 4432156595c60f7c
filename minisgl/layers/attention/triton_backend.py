"""Attention over the paged KV pool with minisgl's Triton kernels.

Mirrors python/sglang/srt/layers/attention/triton_backend.py (TritonAttnBackend:
init_forward_metadata, forward_extend, forward_decode, and the CUDA-graph hooks
init_cuda_graph_state / init_forward_metadata_capture_cuda_graph /
init_forward_metadata_replay_cuda_graph). ``init_forward_metadata`` turns the
batch's req_to_token rows into the flat (kv_indptr, kv_indices) form the
kernels read, once per forward; every layer then reuses it. SGLang also
supports sliding windows, custom masks, speculative verify/draft metadata and
deterministic split sizes; minisgl keeps extend and decode.

For MLA models (``use_mla_backend``) the pool holds one latent row per token, and
decode runs the MLA kernel (triton_ops/decode_mla_attention.py), whose per-split
scratch is kv_lora_rank wide; extend runs the same kernel as MHA (see
layers/mla_attention.py for the shapes it is given).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from minisgl.layers.attention.base_attn_backend import AttentionBackend
from minisgl.layers.attention.triton_ops.decode_attention import decode_attention_fwd, get_num_kv_splits
from minisgl.layers.attention.triton_ops.decode_mla_attention import decode_mla_attention_fwd
from minisgl.layers.attention.triton_ops.extend_attention import extend_attention_fwd
from minisgl.layers.attention.triton_ops.store_kv_cache import store_kv_cache


@dataclasses.dataclass
class ForwardMetadata:
    kv_indptr: torch.Tensor  # [bs + 1], into kv_indices
    kv_indices: torch.Tensor  # KV slots: whole sequences (decode) or prefixes only (extend)
    qo_indptr: Optional[torch.Tensor] = None  # [bs + 1], extend only
    max_extend_len: int = 0
    attn_logits: Optional[torch.Tensor] = None  # [bs, heads, max_kv_splits, v_head_dim], decode only
    attn_lse: Optional[torch.Tensor] = None  # [bs, heads, max_kv_splits], decode only
    num_kv_splits: Optional[torch.Tensor] = None  # [bs], decode only


class TritonAttnBackend(AttentionBackend):
    supports_cuda_graph = True
    # SGLang's default --triton-attention-num-kv-splits.
    max_kv_splits = 8

    def __init__(self, model_runner) -> None:
        self.device = model_runner.device
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        mc = model_runner.model_config
        self.num_head = mc.num_attention_heads // model_runner.tp_size
        self.use_mla = model_runner.use_mla_backend
        # The width of decode's output per head: MLA's absorbed attention returns a latent.
        self.v_head_dim = mc.kv_lora_rank if self.use_mla else mc.head_dim
        self.forward_metadata: Optional[ForwardMetadata] = None

    def _gather_kv_indices(self, req_pool_indices: torch.Tensor, lens: torch.Tensor, max_len: int) -> tuple:
        """Flatten req_to_token[req, :len] for every request (SGLang does this in a Triton kernel)."""
        kv_indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=self.device)
        kv_indptr[1:] = torch.cumsum(lens, dim=0)
        rows = self.req_to_token[req_pool_indices, :max_len]  # [bs, max_len]
        keep = torch.arange(max_len, device=self.device)[None, :] < lens[:, None]
        return kv_indptr, rows[keep].to(torch.int64)

    def init_forward_metadata(self, forward_batch) -> None:
        bs = forward_batch.batch_size
        if forward_batch.forward_mode.is_decode():
            kv_indptr, kv_indices = self._gather_kv_indices(
                forward_batch.req_pool_indices, forward_batch.seq_lens, max(forward_batch.seq_lens_cpu)
            )
            self.forward_metadata = ForwardMetadata(
                kv_indptr=kv_indptr,
                kv_indices=kv_indices,
                attn_logits=torch.empty(
                    bs, self.num_head, self.max_kv_splits, self.v_head_dim, dtype=torch.float32, device=self.device
                ),
                attn_lse=torch.empty(bs, self.num_head, self.max_kv_splits, dtype=torch.float32, device=self.device),
                num_kv_splits=get_num_kv_splits(forward_batch.seq_lens, self.max_kv_splits),
            )
            return
        kv_indptr, kv_indices = self._gather_kv_indices(
            forward_batch.req_pool_indices,
            forward_batch.extend_prefix_lens,
            max(max(forward_batch.extend_prefix_lens_cpu), 1),
        )
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        qo_indptr[1:] = torch.cumsum(forward_batch.extend_seq_lens, dim=0)
        self.forward_metadata = ForwardMetadata(
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            qo_indptr=qo_indptr,
            max_extend_len=max(forward_batch.extend_seq_lens_cpu),
        )

    # ---- CUDA graphs: the metadata lives in static buffers the captured kernels read ------

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * max_context_len, dtype=torch.int64, device=self.device)
        self.cuda_graph_attn_logits = torch.empty(
            max_bs, self.num_head, self.max_kv_splits, self.v_head_dim, dtype=torch.float32, device=self.device
        )
        self.cuda_graph_attn_lse = torch.empty(
            max_bs, self.num_head, self.max_kv_splits, dtype=torch.float32, device=self.device
        )
        self.cuda_graph_num_kv_splits = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.forward_metadata = ForwardMetadata(
            kv_indptr=self.cuda_graph_kv_indptr[: bs + 1],
            kv_indices=self.cuda_graph_kv_indices,
            attn_logits=self.cuda_graph_attn_logits[:bs],
            attn_lse=self.cuda_graph_attn_lse[:bs],
            num_kv_splits=self.cuda_graph_num_kv_splits[:bs],
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int
    ) -> None:
        """Refill the static buffers in place for a (padded) decode batch of size bs."""
        kv_indptr, kv_indices = self._gather_kv_indices(req_pool_indices[:bs], seq_lens[:bs], max_seq_len)
        self.cuda_graph_kv_indptr[: bs + 1].copy_(kv_indptr)
        self.cuda_graph_kv_indices[: kv_indices.numel()].copy_(kv_indices)
        self.cuda_graph_num_kv_splits[:bs].copy_(get_num_kv_splits(seq_lens[:bs], self.max_kv_splits))
        self.init_forward_metadata_capture_cuda_graph(bs)

    def _prologue(self, q, k, v, layer, forward_batch, save_kv_cache: bool):
        """Shared by both modes: write the new K/V into the pool, shape q, allocate the output."""
        k = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim)
        v = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        if save_kv_cache:
            store_kv_cache(k_buf, v_buf, forward_batch.out_cache_loc, k, v)
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        o = torch.empty(q.shape[0], layer.tp_q_head_num, layer.v_head_dim, dtype=q.dtype, device=q.device)
        return q, k, v, o, k_buf, v_buf

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        q, k, v, o, k_buf, v_buf = self._prologue(q, k, v, layer, forward_batch, save_kv_cache)
        md = self.forward_metadata
        extend_attention_fwd(
            q, k, v, o, k_buf, v_buf, md.qo_indptr, md.kv_indptr, md.kv_indices,
            md.max_extend_len, layer.scaling, layer.logit_cap,
        )  # fmt: skip
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        q, _, _, o, k_buf, v_buf = self._prologue(q, k, v, layer, forward_batch, save_kv_cache)
        md = self.forward_metadata
        if self.use_mla:
            decode_mla_attention_fwd(
                q, k_buf, o, md.kv_indptr, md.kv_indices, md.attn_logits, md.attn_lse,
                md.num_kv_splits, self.max_kv_splits, layer.scaling, kv_lora_rank=layer.v_head_dim,
            )  # fmt: skip
            return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)
        decode_attention_fwd(
            q, k_buf, v_buf, o, md.kv_indptr, md.kv_indices, md.attn_logits, md.attn_lse,
            md.num_kv_splits, self.max_kv_splits, layer.scaling, layer.logit_cap,
        )  # fmt: skip
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)
