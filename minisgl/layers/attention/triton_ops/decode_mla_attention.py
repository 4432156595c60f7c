"""Split-KV paged decode attention for MLA's absorbed form: every query head against one latent.

The MLA variant of decode_attention.py. SGLang runs MLA decode through its grouped
kernel with the key split into a no-PE part and a rope part (BLOCK_DPE), loading the
no-PE part once as K and again as V. Here the pool row [latent c | k_pe] is read once
per token and c serves as both the key's no-PE part and the value:

    logits = q_latent . c + q_pe . k_pe      (q_latent = q_nope W_UK, made by the caller)
    out    = softmax(logits * sm_scale) . c  (the caller applies W_UV)

All query heads share the single latent head, so a program takes BLOCK_H heads of one
request as the M side of tl.dot, as the grouped kernel does for a KV-head group. Stage 2
(the merge of the splits by their log-sum-exp) is decode_attention.py's, unchanged.
"""

import torch
import triton
import triton.language as tl

from minisgl.layers.attention.triton_ops.decode_attention import (
    _BLOCK_H,
    _BLOCK_N,
    _MIN_BLOCK_KV,
    _decode_softmax_reducev_fwd,
)


@triton.jit
def _fwd_mla_kernel_stage1(
    Q,
    KV_Buffer,
    sm_scale,
    kv_indptr,
    kv_indices,
    Att_Out,
    Att_Lse,
    num_kv_splits,
    stride_qbs,
    stride_qh,
    stride_buf_bs,
    stride_mid_ob,
    stride_mid_oh,
    stride_mid_os,
    stride_lse_b,
    stride_lse_h,
    head_num: tl.constexpr,
    Lc: tl.constexpr,  # kv_lora_rank: the latent's width, the value's width
    Lr: tl.constexpr,  # qk_rope_head_dim
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    MIN_BLOCK_KV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split_kv_id = tl.program_id(2)
    mask_h = offs_h < head_num

    offs_c = tl.arange(0, BLOCK_C)
    offs_r = tl.arange(0, BLOCK_R)
    mask_c = offs_c < Lc
    mask_r = offs_r < Lr

    cur_batch_kv_start_idx = tl.load(kv_indptr + cur_batch)
    cur_batch_seq_len = tl.load(kv_indptr + cur_batch + 1) - cur_batch_kv_start_idx
    kv_splits = tl.load(num_kv_splits + cur_batch)
    # The same split bounds as decode_attention.py's stage 1, which its stage 2 recomputes.
    kv_len_per_split = tl.cdiv(tl.cdiv(cur_batch_seq_len, kv_splits), MIN_BLOCK_KV) * MIN_BLOCK_KV
    split_kv_start = kv_len_per_split * split_kv_id
    split_kv_end = tl.minimum(split_kv_start + kv_len_per_split, cur_batch_seq_len)

    e_max = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
    e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)

    if split_kv_end > split_kv_start:
        offs_q = cur_batch * stride_qbs + offs_h[:, None] * stride_qh
        q_latent = tl.load(Q + offs_q + offs_c[None, :], mask=mask_h[:, None] & mask_c[None, :], other=0.0)
        q_pe = tl.load(Q + offs_q + Lc + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :], other=0.0)
        q_latent = q_latent.to(tl.float32)  # [BLOCK_H, BLOCK_C]
        q_pe = q_pe.to(tl.float32)  # [BLOCK_H, BLOCK_R]
        for start_n in range(split_kv_start, split_kv_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < split_kv_end
            kv_loc = tl.load(kv_indices + cur_batch_kv_start_idx + offs_n, mask=mask_n, other=0).to(tl.int64)
            row = KV_Buffer + kv_loc[:, None] * stride_buf_bs
            # One load of the latent block: the keys' no-PE part now, the values below.
            c = tl.load(row + offs_c[None, :], mask=mask_n[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
            k_pe = tl.load(row + Lc + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0)
            qk = tl.dot(q_latent, tl.trans(c), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
            qk += tl.dot(q_pe, tl.trans(k_pe.to(tl.float32)), input_precision=DOT_PRECISION)
            qk *= sm_scale
            qk = tl.where(mask_n[None, :], qk, float("-inf"))

            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max[:, None])
            acc = acc * re_scale[:, None] + tl.dot(p, c, input_precision=DOT_PRECISION)
            e_sum = e_sum * re_scale + tl.sum(p, 1)
            e_max = n_e_max

        offs_mid_o = cur_batch * stride_mid_ob + offs_h[:, None] * stride_mid_oh + split_kv_id * stride_mid_os
        tl.store(Att_Out + offs_mid_o + offs_c[None, :], acc / e_sum[:, None], mask=mask_h[:, None] & mask_c[None, :])
        offs_lse = cur_batch * stride_lse_b + offs_h * stride_lse_h + split_kv_id
        tl.store(Att_Lse + offs_lse, e_max + tl.log(e_sum), mask=mask_h)


def decode_mla_attention_fwd(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    o: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    num_kv_splits: torch.Tensor,
    max_kv_splits: int,
    sm_scale: float,
    kv_lora_rank: int,
) -> None:
    """Write softmax([q_latent, q_pe] . [c, k_pe] * sm_scale) . c over each request's paged latents into `o`.

    q: [bs, num_heads, kv_lora_rank + rope] (the absorbed query, then the rotated rope query);
    kv_buffer: [pool_size, 1, kv_lora_rank + rope], one layer of MLATokenToKVPool;
    o: [bs, num_heads, kv_lora_rank]. kv_indptr, kv_indices, num_kv_splits and the fp32 scratch
    attn_logits [bs, num_heads, max_kv_splits, kv_lora_rank] / attn_lse [bs, num_heads,
    max_kv_splits] are as in decode_attention_fwd, so the call can be captured in a CUDA graph.
    """
    assert kv_buffer.shape[1] == 1 and q.shape[-1] == kv_buffer.shape[-1]
    assert attn_logits.shape[2] == max_kv_splits and attn_logits.shape[3] == kv_lora_rank
    assert all(t.stride(-1) == 1 for t in (q, kv_buffer, o, attn_logits, attn_lse))
    batch, head_num = q.shape[0], q.shape[1]
    rope_dim = q.shape[-1] - kv_lora_rank
    grid = (batch, triton.cdiv(head_num, _BLOCK_H), max_kv_splits)
    _fwd_mla_kernel_stage1[grid](
        q, kv_buffer, sm_scale, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
        q.stride(0), q.stride(1), kv_buffer.stride(0),
        attn_logits.stride(0), attn_logits.stride(1), attn_logits.stride(2), attn_lse.stride(0), attn_lse.stride(1),
        head_num=head_num,
        Lc=kv_lora_rank,
        Lr=rope_dim,
        # tl.dot needs K >= 16 on GPUs; narrower parts pad up and mask.
        BLOCK_C=max(16, triton.next_power_of_2(kv_lora_rank)),
        BLOCK_R=max(16, triton.next_power_of_2(rope_dim)),
        BLOCK_N=_BLOCK_N,
        BLOCK_H=_BLOCK_H,
        MIN_BLOCK_KV=_MIN_BLOCK_KV,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4,
        num_stages=2,
    )  # fmt: skip
    _decode_softmax_reducev_fwd(attn_logits, attn_lse, o, kv_indptr, num_kv_splits, max_kv_splits)
