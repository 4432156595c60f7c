"""Fused mixture-of-experts MLP: two grouped GEMMs over tokens sorted by expert.

Mirrors `fused_experts_impl` of SGLang's
`python/sglang/srt/layers/moe/fused_moe_triton/fused_moe.py`, with `fused_moe_kernel` /
`invoke_fused_moe_kernel` from `fused_moe_triton_kernels.py` and `moe_align_block_size`
from `moe_align_block_size.py` (a CUDA op in sgl_kernel, written here in torch).

Each (token, k-th choice) pair is a "routed token". moe_align_block_size sorts them by
expert and pads every expert's run to a multiple of BLOCK_SIZE_M, so each M-block of
the GEMM belongs to exactly one expert and loads that expert's weights only:

    hidden [T, H] --GEMM w1[e]--> [T*k, 2I] --silu(gate)*up--> [T*k, I]
                  --GEMM w2[e], x routing weight--> [T*k, H] --sum over k--> [T, H]

SGLang also has FP8/INT8/INT4 weights with their scales, biases, other activations,
expert parallelism (expert id -1 for non-local experts), TMA loads, chunking of very
large batches and per-GPU tuned configs; minisgl keeps unquantised SiLU experts and
one fixed config, SGLang's default (also what it uses for deterministic inference).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

_CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def moe_align_block_size(
    topk_ids: torch.Tensor, block_size: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort routed tokens by expert, padding each expert's run to a multiple of block_size.

    topk_ids: [T, k]. Returns
      sorted_token_ids int32 [max_num_tokens_padded]: flat routed-token indices
        (t * k + j), grouped by expert; padding holds T * k, an index past the end that
        the kernel masks out.
      expert_ids int32 [cdiv(max_num_tokens_padded, block_size)]: the expert of each block.
      num_tokens_post_padded int32 [1]: how much of sorted_token_ids is used.
    Sizes depend only on T, k and num_experts, and nothing syncs with the host, so this
    can run inside a CUDA graph.
    """
    flat = topk_ids.flatten().long()  # [T*k]
    num_valid = flat.numel()
    # At most min(num_valid, num_experts) experts are used, each wasting < block_size slots.
    max_num_tokens_padded = num_valid + min(num_valid, num_experts) * (block_size - 1)

    # scatter_add_ rather than bincount: bincount reads the max id back to the host.
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded_counts = (counts + block_size - 1) // block_size * block_size
    padded_ends = padded_counts.cumsum(0)

    # A stable sort keeps each expert's tokens in token order; a token's rank within its
    # expert places it after the padded start of that expert's run.
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    rank = torch.arange(num_valid, device=flat.device) - (counts.cumsum(0) - counts)[sorted_experts]
    sorted_token_ids = torch.full((max_num_tokens_padded,), num_valid, dtype=torch.int32, device=flat.device)
    sorted_token_ids[(padded_ends - padded_counts)[sorted_experts] + rank] = order.to(torch.int32)

    block_starts = torch.arange(0, max_num_tokens_padded, block_size, device=flat.device)
    # Blocks past num_tokens_post_padded are skipped by the kernel; the clamp only keeps
    # their expert id in range.
    expert_ids = torch.searchsorted(padded_ends, block_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_token_ids, expert_ids.to(torch.int32), padded_ends[-1:].to(torch.int32)


@triton.jit
def fused_moe_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    N,
    K,
    EM,
    num_valid_tokens,
    stride_am,
    stride_ak,
    stride_be,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    top_k: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """C[token] = A[token // top_k] @ B[expert]^T (x routing weight) for one tile.

    A: [*, K]; B: [E, N, K]; C: [num_valid_tokens, N], rows indexed by routed token.
    """
    # Grouped program order: GROUP_SIZE_M consecutive M-blocks share each N-block in
    # turn, so a tile of B stays in L2 while several blocks of A use it.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    num_tokens_post_padded = tl.load(num_tokens_post_padded_ptr)
    if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded:
        return

    offs_token_id = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_token = tl.load(sorted_token_ids_ptr + offs_token_id).to(tl.int64)
    token_mask = offs_token < num_valid_tokens
    off_expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # Wrapping the N offsets keeps B loads in bounds without a mask; the extra columns
    # are dropped at the store.
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    # Routed token t * top_k + j reads row t of A; with top_k = 1 (the second GEMM)
    # it reads its own row.
    a_ptrs = a_ptr + (offs_token[:, None] // top_k) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + off_expert * stride_be + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_SIZE_K):
        mask_k = offs_k < K - k_start
        a = tl.load(a_ptrs, mask=token_mask[:, None] & mask_k[None, :], other=0.0)  # [BLOCK_SIZE_M, BLOCK_SIZE_K]
        b = tl.load(b_ptrs, mask=mask_k[:, None], other=0.0)  # [BLOCK_SIZE_K, BLOCK_SIZE_N]
        accumulator += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if MUL_ROUTED_WEIGHT:
        moe_weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0.0)
        accumulator *= moe_weight[:, None].to(tl.float32)

    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_token[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    c_mask = token_mask[:, None] & (offs_cn[None, :] < N)
    tl.store(c_ptrs, accumulator.to(c_ptr.dtype.element_ty), mask=c_mask)


def invoke_fused_moe_kernel(
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    topk_weights: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    mul_routed_weight: bool,
    top_k: int,
    config: dict[str, int],
) -> None:
    """Launch fused_moe_kernel: A [*, K], B [E, N, K], C [T*k, N], topk_weights [T*k] fp32."""
    EM = sorted_token_ids.shape[0]
    N, K = B.shape[1], B.shape[2]
    grid = (triton.cdiv(EM, config["BLOCK_SIZE_M"]) * triton.cdiv(N, config["BLOCK_SIZE_N"]),)
    fused_moe_kernel[grid](
        A,
        B,
        C,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        N,
        K,
        EM,
        topk_weights.numel(),
        A.stride(0),
        A.stride(1),
        B.stride(0),
        B.stride(2),
        B.stride(1),
        C.stride(0),
        C.stride(1),
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k,
        # Operands are upcast to fp32 before tl.dot. From fp16/bf16 that upcast is exact
        # in tf32, so tensor cores lose nothing; fp32 inputs ask for full precision.
        DOT_PRECISION="ieee" if A.dtype == torch.float32 else "tf32",
        **config,
    )


def fused_moe(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(hidden_states[t]) for every token t.

    hidden_states: [T, H]; w1: [E, 2I, H], gate rows then up rows (gate_up_proj merged);
    w2: [E, H, I] (down_proj); topk_weights fp32 [T, k]; topk_ids int [T, k].
    expert(x) = w2 @ (silu(w1_gate @ x) * (w1_up @ x)). Returns [T, H] in hidden_states' dtype.
    """
    num_tokens, hidden_size = hidden_states.shape
    num_experts, two_i, _ = w1.shape
    top_k = topk_ids.shape[1]
    assert w1.shape[2] == hidden_size and w2.shape == (num_experts, hidden_size, two_i // 2)
    assert topk_weights.shape == topk_ids.shape

    sorted_token_ids, expert_ids, num_tokens_post_padded = moe_align_block_size(
        topk_ids, _CONFIG["BLOCK_SIZE_M"], num_experts
    )
    # Flat [T*k] view, the index space of sorted_token_ids.
    topk_weights = topk_weights.reshape(-1)

    intermediate_cache1 = hidden_states.new_empty(num_tokens * top_k, two_i)  # [T*k, 2I]
    invoke_fused_moe_kernel(
        hidden_states,
        w1,
        intermediate_cache1,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        mul_routed_weight=False,
        top_k=top_k,
        config=_CONFIG,
    )
    gate, up = intermediate_cache1.float().chunk(2, dim=-1)
    intermediate_cache2 = (F.silu(gate) * up).to(hidden_states.dtype)  # [T*k, I]

    intermediate_cache3 = hidden_states.new_empty(num_tokens * top_k, hidden_size)  # [T*k, H]
    invoke_fused_moe_kernel(
        intermediate_cache2,
        w2,
        intermediate_cache3,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        mul_routed_weight=True,
        top_k=1,
        config=_CONFIG,
    )
    return intermediate_cache3.view(num_tokens, top_k, hidden_size).sum(dim=1)
