"""Extend (prefill with a cached prefix) attention over a paged KV pool.

Mirrors `_fwd_kernel` / `extend_attention_fwd` of SGLang's
`python/sglang/srt/layers/attention/triton_ops/extend_attention.py`. Each request has
a prefix already in the pool (possibly empty, e.g. a radix-cache hit) and a run of new
tokens. A program owns BLOCK_M new tokens of one request and one query head and runs
one online softmax in two stages: first over the whole prefix, read from the pool
through kv_indices; then over the new tokens, read from k_extend/v_extend (contiguous,
so no index gather) with a causal mask.

SGLang's version also takes a custom attention mask (speculative-decoding trees), a
non-causal mode, sliding windows, attention sinks, xAI temperature scaling, the MLA
rope split of the head dim and per-architecture block sizes, and the file adds a
"unified" single-stage kernel; minisgl omits them all: its models are causal decoders
with plain GQA, and one block-size rule keeps the kernel readable.
"""

import torch
import triton
import triton.language as tl

from minisgl.layers.attention.triton_ops.decode_attention import tanh

# Tiles and pipelining on a GPU with 16-bit inputs (NATIVE_DOT), the best of eleven measured on
# an H200 (32 query heads, 8 KV heads of 128, bf16): three stages keep K/V loads ahead of the dots.
_GPU_CONFIG = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)


@triton.jit
def _dot(a, b, NATIVE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a @ b, accumulated in fp32. On a GPU 16-bit operands go to the tensor cores as they are
    (the softmax probabilities cast down to V's dtype, as flash attention does); under the CPU
    interpreter, and for fp32 inputs, both are upcast first."""
    if NATIVE_DOT:
        out = tl.dot(a.to(b.dtype), b)
    else:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PRECISION)
    return out


@triton.jit
def _fwd_kernel(
    Q_Extend,
    K_Extend,
    V_Extend,
    O_Extend,
    K_Buffer,
    V_Buffer,
    qo_indptr,
    kv_indptr,
    kv_indices,
    sm_scale,
    stride_qbs,
    stride_qh,
    stride_kbs,
    stride_kh,
    stride_vbs,
    stride_vh,
    stride_obs,
    stride_oh,
    stride_buf_kbs,
    stride_buf_kh,
    stride_buf_vbs,
    stride_buf_vh,
    kv_group_num: tl.constexpr,
    logit_cap: tl.constexpr,
    Lq: tl.constexpr,
    Lv: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    NATIVE_DOT: tl.constexpr,
):
    cur_seq = tl.program_id(0)
    cur_head = tl.program_id(1)
    cur_block_m = tl.program_id(2)
    cur_kv_head = cur_head // kv_group_num

    cur_seq_extend_start_idx = tl.load(qo_indptr + cur_seq)
    cur_seq_len_extend = tl.load(qo_indptr + cur_seq + 1) - cur_seq_extend_start_idx
    # The grid is sized for the longest request; shorter ones have nothing here.
    if cur_block_m * BLOCK_M >= cur_seq_len_extend:
        return
    cur_seq_kv_start_idx = tl.load(kv_indptr + cur_seq)
    cur_seq_len_prefix = tl.load(kv_indptr + cur_seq + 1) - cur_seq_kv_start_idx

    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_m = cur_block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # positions within the new tokens
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < cur_seq_len_extend
    mask_d = offs_d < Lq
    mask_dv = offs_dv < Lv

    offs_q = (cur_seq_extend_start_idx + offs_m[:, None]) * stride_qbs + cur_head * stride_qh + offs_d[None, :]
    q = tl.load(Q_Extend + offs_q, mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    if not NATIVE_DOT:
        q = q.to(tl.float32)  # [BLOCK_M, BLOCK_DMODEL]

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    deno = tl.zeros([BLOCK_M], dtype=tl.float32)
    e_max = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")

    # Stage 1: the prefix, visible to every new token. Only key columns are masked:
    # padded query rows load q = 0 and so keep finite logits, so no row is all -inf.
    for start_n in range(0, cur_seq_len_prefix, BLOCK_N):
        mask_n = (start_n + offs_n) < cur_seq_len_prefix
        kv_loc = tl.load(kv_indices + cur_seq_kv_start_idx + start_n + offs_n, mask=mask_n, other=0)
        # Slot * row stride can pass 2**31 in a large pool.
        kv_loc = kv_loc.to(tl.int64)

        # K is loaded transposed, [BLOCK_DMODEL, BLOCK_N], as the right operand of q @ k.
        offs_buf_k = kv_loc[None, :] * stride_buf_kbs + cur_kv_head * stride_buf_kh + offs_d[:, None]
        k = tl.load(K_Buffer + offs_buf_k, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        qk = _dot(q, k, NATIVE_DOT, DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        qk *= sm_scale
        if logit_cap > 0:
            qk = logit_cap * tanh(qk / logit_cap)
        qk = tl.where(mask_n[None, :], qk, float("-inf"))

        offs_buf_v = kv_loc[:, None] * stride_buf_vbs + cur_kv_head * stride_buf_vh + offs_dv[None, :]
        v = tl.load(V_Buffer + offs_buf_v, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)

        n_e_max = tl.maximum(tl.max(qk, 1), e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max[:, None])
        deno = deno * re_scale + tl.sum(p, 1)
        acc = acc * re_scale[:, None] + _dot(p, v, NATIVE_DOT, DOT_PRECISION)
        e_max = n_e_max

    # Stage 2: the new tokens, causally. Keys past this block's last query are never
    # visible, so the loop stops there. Every row sees new token 0 in the first tile, so
    # its running max is finite before any tile that hides all of its keys: such a tile
    # adds exp(-inf - max) = 0 and never computes inf - inf.
    cur_block_m_end = tl.minimum(cur_seq_len_extend, (cur_block_m + 1) * BLOCK_M)
    for start_n in range(0, cur_block_m_end, BLOCK_N):
        mask_n = (start_n + offs_n) < cur_block_m_end
        mask_causal = offs_m[:, None] >= (start_n + offs_n[None, :])

        offs_new = cur_seq_extend_start_idx + start_n + offs_n  # rows of k_extend / v_extend
        offs_k = offs_new[None, :] * stride_kbs + cur_kv_head * stride_kh + offs_d[:, None]
        k = tl.load(K_Extend + offs_k, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        qk = _dot(q, k, NATIVE_DOT, DOT_PRECISION)
        qk *= sm_scale
        if logit_cap > 0:
            qk = logit_cap * tanh(qk / logit_cap)
        qk = tl.where(mask_causal & mask_n[None, :], qk, float("-inf"))

        offs_v = offs_new[:, None] * stride_vbs + cur_kv_head * stride_vh + offs_dv[None, :]
        v = tl.load(V_Extend + offs_v, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)

        n_e_max = tl.maximum(tl.max(qk, 1), e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max[:, None])
        deno = deno * re_scale + tl.sum(p, 1)
        acc = acc * re_scale[:, None] + _dot(p, v, NATIVE_DOT, DOT_PRECISION)
        e_max = n_e_max

    offs_o = (cur_seq_extend_start_idx + offs_m[:, None]) * stride_obs + cur_head * stride_oh + offs_dv[None, :]
    tl.store(O_Extend + offs_o, acc / deno[:, None], mask=mask_m[:, None] & mask_dv[None, :])


def extend_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float = 0.0,
) -> None:
    """Causal attention of each request's new tokens over its cached prefix and themselves.

    q_extend: [num_new_tokens, num_heads, head_dim]; k_extend/v_extend:
    [num_new_tokens, num_kv_heads, head_dim], the new tokens' K/V (the caller has also
    written them into the pool, but they are read from here); o_extend:
    [num_new_tokens, num_heads, v_head_dim]. qo_indptr [bs + 1] splits the new tokens by
    request. kv_indptr [bs + 1] / kv_indices [total] list the pool slots of each
    request's prefix only (a prefix may be empty). k_buffer/v_buffer:
    [pool_size, num_kv_heads, head_dim], one layer of the pool. max_len_extend: the
    largest number of new tokens of any request (sizes the grid).
    Always causal and without a custom mask (SGLang's takes one for speculative trees).
    """
    Lq, Lv = q_extend.shape[-1], v_extend.shape[-1]
    batch_size, head_num = qo_indptr.shape[0] - 1, q_extend.shape[1]
    assert head_num % k_extend.shape[1] == 0
    # The kernel indexes every dimension but the last by stride: the last must be contiguous.
    assert all(t.stride(-1) == 1 for t in (q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer))
    kv_group_num = head_num // k_extend.shape[1]

    # tl.dot needs K >= 16 on GPUs; odd head dims (80, 96) pad up and mask.
    BLOCK_DMODEL = max(16, triton.next_power_of_2(Lq))
    BLOCK_DV = max(16, triton.next_power_of_2(Lv))
    native_dot = q_extend.is_cuda and q_extend.dtype != torch.float32
    if native_dot and BLOCK_DMODEL <= 128:
        config = dict(_GPU_CONFIG)
    else:
        # fp32 operands (the CPU interpreter, fp32 models) and heads wider than 128 keep the
        # untuned tiles: smaller for wide heads, so a tile's fp32 copy fits in registers.
        BLOCK_M = BLOCK_N = 64 if BLOCK_DMODEL <= 128 else 32
        config = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4 if Lq <= 64 else 8, num_stages=1)

    grid = (batch_size, head_num, triton.cdiv(max_len_extend, config["BLOCK_M"]))
    _fwd_kernel[grid](
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        sm_scale,
        q_extend.stride(0),
        q_extend.stride(1),
        k_extend.stride(0),
        k_extend.stride(1),
        v_extend.stride(0),
        v_extend.stride(1),
        o_extend.stride(0),
        o_extend.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        kv_group_num=kv_group_num,
        logit_cap=logit_cap,
        Lq=Lq,
        Lv=Lv,
        BLOCK_DMODEL=BLOCK_DMODEL,
        BLOCK_DV=BLOCK_DV,
        DOT_PRECISION="ieee" if q_extend.dtype == torch.float32 else "tf32",
        NATIVE_DOT=native_dot,
        **config,
    )
