"""Split-KV paged decode attention: one new query token per request against its whole KV.

Mirrors SGLang's `python/sglang/srt/layers/attention/triton_ops/decode_attention.py`
(itself adapted from lightllm's flash-decoding kernels). Decode has one query row per
request, so parallelism over (request, head) alone leaves most of a GPU idle on long
sequences. Stage 1 therefore also splits each request's KV into `num_kv_splits[b]`
chunks; every chunk computes a partial softmax-weighted V and the log-sum-exp of its
logits. Stage 2 merges the chunks of a request with those LSEs.

The KV is addressed per token: `kv_indices[kv_indptr[b]:kv_indptr[b + 1]]` are the pool
slots of request b's tokens in order, so a paged layout (page_size > 1) arrives already
expanded to token slots by the caller.

SGLang also has a per-head stage-1 kernel for MHA, the MLA split of a 576/288-wide key
into a no-PE and a rope part, attention sinks, xAI temperature scaling and ROCm tuning;
minisgl keeps the grouped kernel only (MHA is a group of one), because the rest serves
models and hardware this project does not run.
"""

import torch
import triton
import triton.language as tl

# A split covers a multiple of this many tokens, so the KV loop of stage 1 rarely runs
# a ragged tail. Stage 2 must use the same value to recompute each split's bounds.
_MIN_BLOCK_KV = 32
# Query heads sharing one KV head are processed together as the M side of tl.dot.
_BLOCK_H = 16
_BLOCK_N = 32
# Default granularity of get_num_kv_splits: a split shorter than this costs more in
# launch width and stage-2 merging than it gains in parallelism.
_MIN_TOKENS_PER_SPLIT = 256


@triton.jit
def tanh(x):
    # triton.language has no portable tanh (only each backend's libdevice one).
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def _fwd_grouped_kernel_stage1(
    Q,
    K_Buffer,
    V_Buffer,
    sm_scale,
    kv_indptr,
    kv_indices,
    Att_Out,
    Att_Lse,
    num_kv_splits,
    stride_qbs,
    stride_qh,
    stride_buf_kbs,
    stride_buf_kh,
    stride_buf_vbs,
    stride_buf_vh,
    stride_mid_ob,
    stride_mid_oh,
    stride_mid_os,
    stride_lse_b,
    stride_lse_h,
    kv_group_num: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    MIN_BLOCK_KV: tl.constexpr,
    logit_cap: tl.constexpr,
    Lk: tl.constexpr,
    Lv: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    cur_head_id = tl.program_id(1)
    split_kv_id = tl.program_id(2)

    # Program axis 1 walks the KV heads, each in cdiv(kv_group_num, BLOCK_H) blocks of
    # its query heads; rows past the end of the group are masked off. (SGLang strides
    # head blocks across the whole head range, which mixes groups when a group larger
    # than BLOCK_H is not a multiple of it, e.g. 18 or 24.)
    blocks_per_group = tl.cdiv(kv_group_num, BLOCK_H)
    cur_kv_head = cur_head_id // blocks_per_group
    offs_h = (cur_head_id % blocks_per_group) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < kv_group_num
    cur_head = cur_kv_head * kv_group_num + offs_h

    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < Lk
    mask_dv = offs_dv < Lv

    cur_batch_kv_start_idx = tl.load(kv_indptr + cur_batch)
    cur_batch_seq_len = tl.load(kv_indptr + cur_batch + 1) - cur_batch_kv_start_idx
    kv_splits = tl.load(num_kv_splits + cur_batch)

    kv_len_per_split = tl.cdiv(tl.cdiv(cur_batch_seq_len, kv_splits), MIN_BLOCK_KV) * MIN_BLOCK_KV
    split_kv_start = kv_len_per_split * split_kv_id
    split_kv_end = tl.minimum(split_kv_start + kv_len_per_split, cur_batch_seq_len)

    e_max = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
    e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)

    # Splits past the end of a short request own no tokens; they write nothing and
    # stage 2 skips them by recomputing the same bounds.
    if split_kv_end > split_kv_start:
        offs_q = cur_batch * stride_qbs + cur_head[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(Q + offs_q, mask=mask_h[:, None] & mask_d[None, :], other=0.0)
        q = q.to(tl.float32)  # [BLOCK_H, BLOCK_DMODEL]
        for start_n in range(split_kv_start, split_kv_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < split_kv_end
            kv_loc = tl.load(kv_indices + cur_batch_kv_start_idx + offs_n, mask=mask_n, other=0)
            # Slot * row stride can pass 2**31 in a large pool.
            kv_loc = kv_loc.to(tl.int64)

            # K is loaded transposed, [BLOCK_DMODEL, BLOCK_N], as the right operand of q @ k.
            offs_buf_k = kv_loc[None, :] * stride_buf_kbs + cur_kv_head * stride_buf_kh + offs_d[:, None]
            k = tl.load(K_Buffer + offs_buf_k, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
            qk = tl.dot(q, k.to(tl.float32), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
            qk *= sm_scale
            if logit_cap > 0:
                qk = logit_cap * tanh(qk / logit_cap)
            # Masked head rows keep finite logits (their q is 0), so no row is all -inf
            # and the online softmax never computes inf - inf.
            qk = tl.where(mask_n[None, :], qk, float("-inf"))

            offs_buf_v = kv_loc[:, None] * stride_buf_vbs + cur_kv_head * stride_buf_vh + offs_dv[None, :]
            v = tl.load(V_Buffer + offs_buf_v, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)

            # Online softmax: rescale what was accumulated under the old running max.
            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max[:, None])
            acc = acc * re_scale[:, None] + tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
            e_sum = e_sum * re_scale + tl.sum(p, 1)
            e_max = n_e_max

        offs_mid_o = (
            cur_batch * stride_mid_ob
            + cur_head[:, None] * stride_mid_oh
            + split_kv_id * stride_mid_os
            + offs_dv[None, :]
        )
        tl.store(Att_Out + offs_mid_o, acc / e_sum[:, None], mask=mask_h[:, None] & mask_dv[None, :])
        offs_lse = cur_batch * stride_lse_b + cur_head * stride_lse_h + split_kv_id
        tl.store(Att_Lse + offs_lse, e_max + tl.log(e_sum), mask=mask_h)


def _decode_grouped_att_m_fwd(
    q,
    k_buffer,
    v_buffer,
    att_out,
    att_lse,
    kv_indptr,
    kv_indices,
    num_kv_splits,
    max_kv_splits,
    sm_scale,
    logit_cap,
):
    Lk = k_buffer.shape[-1]
    Lv = v_buffer.shape[-1]
    batch, head_num = q.shape[0], q.shape[1]
    num_kv_heads = k_buffer.shape[1]
    kv_group_num = head_num // num_kv_heads
    grid = (batch, num_kv_heads * triton.cdiv(kv_group_num, _BLOCK_H), max_kv_splits)
    _fwd_grouped_kernel_stage1[grid](
        q,
        k_buffer,
        v_buffer,
        sm_scale,
        kv_indptr,
        kv_indices,
        att_out,
        att_lse,
        num_kv_splits,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        att_out.stride(0),
        att_out.stride(1),
        att_out.stride(2),
        att_lse.stride(0),
        att_lse.stride(1),
        kv_group_num=kv_group_num,
        # tl.dot needs K >= 16 on GPUs; odd head dims (80, 96) pad up and mask.
        BLOCK_DMODEL=max(16, triton.next_power_of_2(Lk)),
        BLOCK_DV=max(16, triton.next_power_of_2(Lv)),
        BLOCK_N=_BLOCK_N,
        BLOCK_H=_BLOCK_H,
        MIN_BLOCK_KV=_MIN_BLOCK_KV,
        logit_cap=logit_cap,
        Lk=Lk,
        Lv=Lv,
        # Operands are upcast to fp32 before tl.dot. From fp16/bf16 that upcast is exact
        # in tf32, so tensor cores lose nothing; fp32 inputs ask for full precision.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4,
        num_stages=2,
    )


@triton.jit
def _fwd_kernel_stage2(
    Mid_O,
    Mid_Lse,
    O,
    kv_indptr,
    num_kv_splits,
    stride_mid_ob,
    stride_mid_oh,
    stride_mid_os,
    stride_lse_b,
    stride_lse_h,
    stride_obs,
    stride_oh,
    MAX_KV_SPLITS: tl.constexpr,
    MIN_BLOCK_KV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    Lv: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    cur_head = tl.program_id(1)

    cur_batch_seq_len = tl.load(kv_indptr + cur_batch + 1) - tl.load(kv_indptr + cur_batch)
    kv_splits = tl.load(num_kv_splits + cur_batch)
    kv_len_per_split = tl.cdiv(tl.cdiv(cur_batch_seq_len, kv_splits), MIN_BLOCK_KV) * MIN_BLOCK_KV

    offs_d = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < Lv
    offs_v = cur_batch * stride_mid_ob + cur_head * stride_mid_oh + offs_d
    offs_lse = cur_batch * stride_lse_b + cur_head * stride_lse_h

    e_sum = 0.0
    e_max = -float("inf")
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    # Each split's output is already normalised by its own sum, so its weight in the
    # merge is exp(lse_split - lse_total).
    for split_kv_id in range(0, MAX_KV_SPLITS):
        split_kv_start = kv_len_per_split * split_kv_id
        split_kv_end = tl.minimum(split_kv_start + kv_len_per_split, cur_batch_seq_len)
        if split_kv_end > split_kv_start:
            tv = tl.load(Mid_O + offs_v + split_kv_id * stride_mid_os, mask=mask_d, other=0.0)
            tlse = tl.load(Mid_Lse + offs_lse + split_kv_id)
            n_e_max = tl.maximum(tlse, e_max)
            old_scale = tl.exp(e_max - n_e_max)
            exp_lse = tl.exp(tlse - n_e_max)
            acc = acc * old_scale + exp_lse * tv
            e_sum = e_sum * old_scale + exp_lse
            e_max = n_e_max

    tl.store(O + cur_batch * stride_obs + cur_head * stride_oh + offs_d, acc / e_sum, mask=mask_d)


def _decode_softmax_reducev_fwd(logits, lse, o, kv_indptr, num_kv_splits, max_kv_splits):
    batch, head_num, _, Lv = logits.shape
    grid = (batch, head_num)
    _fwd_kernel_stage2[grid](
        logits,
        lse,
        o,
        kv_indptr,
        num_kv_splits,
        logits.stride(0),
        logits.stride(1),
        logits.stride(2),
        lse.stride(0),
        lse.stride(1),
        o.stride(0),
        o.stride(1),
        MAX_KV_SPLITS=max_kv_splits,
        MIN_BLOCK_KV=_MIN_BLOCK_KV,
        BLOCK_DV=max(16, triton.next_power_of_2(Lv)),
        Lv=Lv,
        num_warps=4,
        num_stages=2,
    )


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    num_kv_splits: torch.Tensor,
    max_kv_splits: int,
    sm_scale: float,
    logit_cap: float = 0.0,
) -> None:
    """Write softmax(q k^T * sm_scale) v over each request's paged KV into `o`.

    q: [bs, num_heads, head_dim]; k_buffer/v_buffer: [pool_size, num_kv_heads, head_dim]
    (one layer of the pool); o: [bs, num_heads, v_head_dim]. kv_indptr int32 [bs + 1] and
    kv_indices int32/int64 [total] list each request's token slots. attn_logits fp32
    [bs, num_heads, max_kv_splits, v_head_dim] and attn_lse fp32 [bs, num_heads,
    max_kv_splits] are scratch for the per-split partial results; num_kv_splits int32
    [bs] (each in 1..max_kv_splits) says how many splits each request uses.
    num_heads must be a multiple of num_kv_heads (any group size, not only powers of 2).
    Shapes depend only on bs and max_kv_splits, never on sequence lengths, so the call
    can be captured in a CUDA graph.
    """
    assert attn_logits.shape[2] == max_kv_splits and attn_lse.shape[2] == max_kv_splits
    assert q.shape[1] % k_buffer.shape[1] == 0
    # Kernels index every dimension but the last by stride: the last must be contiguous.
    assert all(t.stride(-1) == 1 for t in (q, k_buffer, v_buffer, o, attn_logits, attn_lse))
    _decode_grouped_att_m_fwd(
        q,
        k_buffer,
        v_buffer,
        attn_logits,
        attn_lse,
        kv_indptr,
        kv_indices,
        num_kv_splits,
        max_kv_splits,
        sm_scale,
        logit_cap,
    )
    _decode_softmax_reducev_fwd(attn_logits, attn_lse, o, kv_indptr, num_kv_splits, max_kv_splits)


def get_num_kv_splits(
    seq_lens: torch.Tensor,
    max_kv_splits: int,
    min_tokens_per_split: int = _MIN_TOKENS_PER_SPLIT,
) -> torch.Tensor:
    """Splits per request: ceil(seq_len / min_tokens_per_split), clamped to [1, max_kv_splits].

    A simpler stand-in for SGLang's `TritonAttnBackend.get_num_kv_splits`
    (`get_num_kv_splits_triton` in `layers/attention/triton_backend.py`), which also
    weighs batch size against the GPU's core count. Torch ops only, no host sync, so it
    can run inside a captured CUDA graph. Returns int32 [bs].
    """
    splits = (seq_lens + min_tokens_per_split - 1) // min_tokens_per_split
    return splits.clamp(1, max_kv_splits).to(torch.int32)
