"""Scatter a batch's new K/V rows into one layer of the KV pool.

Plays the part of `_set_kv_buffer_impl` in SGLang's
`python/sglang/srt/mem_cache/memory_pool.py`, which calls the JIT CUDA kernel
`store_cache` (`python/sglang/jit_kernel/kvcache.py`) and otherwise falls back to
`k_cache[loc] = k`. Written in Triton here so that one readable kernel runs on GPU and,
through the interpreter, on CPU. SGLang also divides by FP8 k/v scales and can copy V
on a side stream while capturing CUDA graphs; minisgl keeps fp16/bf16/fp32 pools only.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_cache_kernel(
    K_Buffer,
    V_Buffer,
    Loc,
    Cache_K,
    Cache_V,
    stride_buf_kbs,
    stride_buf_kh,
    stride_buf_kd,
    stride_buf_vbs,
    stride_buf_vh,
    stride_buf_vd,
    stride_kbs,
    stride_kh,
    stride_kd,
    stride_vbs,
    stride_vh,
    stride_vd,
    head_dim: tl.constexpr,
    row_size: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program copies BLOCK elements of one token's [num_kv_heads * head_dim] row,
    # for K and for V. Strides are kept per dimension so that K/V views split out of a
    # fused QKV projection can be stored without a copy.
    cur_token = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row_size
    head = offs // head_dim
    dim = offs % head_dim

    # Slot * row stride can pass 2**31 in a large pool.
    loc = tl.load(Loc + cur_token).to(tl.int64)
    k = tl.load(Cache_K + cur_token * stride_kbs + head * stride_kh + dim * stride_kd, mask=mask)
    v = tl.load(Cache_V + cur_token * stride_vbs + head * stride_vh + dim * stride_vd, mask=mask)
    tl.store(K_Buffer + loc * stride_buf_kbs + head * stride_buf_kh + dim * stride_buf_kd, k, mask=mask)
    tl.store(V_Buffer + loc * stride_buf_vbs + head * stride_buf_vh + dim * stride_buf_vd, v, mask=mask)


def store_kv_cache(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
) -> None:
    """k_buffer[loc] = cache_k and v_buffer[loc] = cache_v, cast to the buffers' dtype.

    k_buffer/v_buffer: [pool_size, num_kv_heads, head_dim], one layer of the pool;
    loc: int32/int64 [n], distinct slots; cache_k/cache_v: [n, num_kv_heads, head_dim].
    """
    n, num_kv_heads, head_dim = cache_k.shape
    assert cache_v.shape == cache_k.shape and loc.shape == (n,)
    # Cast before the kernel, as SGLang's set_kv_buffer does, so the kernel is a pure
    # copy. (Inside a kernel the Triton CPU interpreter truncates fp32 -> bf16 where a
    # GPU rounds to nearest, so an in-kernel cast would not match torch bit for bit.)
    cache_k = cache_k.to(k_buffer.dtype)
    cache_v = cache_v.to(v_buffer.dtype)
    row_size = num_kv_heads * head_dim
    BLOCK = min(1024, triton.next_power_of_2(row_size))
    grid = (n, triton.cdiv(row_size, BLOCK))
    _store_kv_cache_kernel[grid](
        k_buffer,
        v_buffer,
        loc,
        cache_k,
        cache_v,
        *k_buffer.stride(),
        *v_buffer.stride(),
        *cache_k.stride(),
        *cache_v.stride(),
        head_dim=head_dim,
        row_size=row_size,
        BLOCK=BLOCK,
    )
