"""MLA decode attention (one latent row per token, shared by every head) against plain torch."""

import pytest
import torch

import minisgl  # noqa: F401  (sets TRITON_INTERPRET on CPU before any kernel is decorated)
from minisgl.layers.attention.triton_ops.decode_mla_attention import decode_mla_attention_fwd
from tests.kernels.test_decode_attention import DEVICE, TOLERANCE, make_kv_indices


@pytest.mark.parametrize(
    "seq_lens,num_heads,kv_lora_rank,rope_dim,page_size,dtype",
    [
        ([1, 37, 300], 4, 32, 8, 1, torch.float32),  # rope narrower than a tl.dot operand: padded, masked
        ([64, 5], 20, 64, 16, 16, torch.float32),  # 20 heads: a second, partly masked head block
        ([129, 260, 3, 40], 16, 32, 16, 4, torch.bfloat16),
    ],
)
def test_decode_mla_matches_torch(seq_lens, num_heads, kv_lora_rank, rope_dim, page_size, dtype):
    g = torch.Generator().manual_seed(0)
    bs, width, max_kv_splits = len(seq_lens), kv_lora_rank + rope_dim, 4
    pool_size = (sum(seq_lens) + bs * page_size) * 2
    q = torch.randn(bs, num_heads, width, generator=g).to(dtype).to(DEVICE)
    kv_buffer = torch.randn(pool_size, 1, width, generator=g).to(dtype).to(DEVICE)
    kv_indptr = torch.tensor([0] + seq_lens).cumsum(0).to(torch.int32).to(DEVICE)
    kv_indices = make_kv_indices(seq_lens, page_size, pool_size, g).to(DEVICE)
    num_kv_splits = torch.randint(1, max_kv_splits + 1, (bs,), generator=g, dtype=torch.int32).to(DEVICE)
    o = torch.empty(bs, num_heads, kv_lora_rank, dtype=dtype, device=DEVICE)
    attn_logits = torch.empty(bs, num_heads, max_kv_splits, kv_lora_rank, dtype=torch.float32, device=DEVICE)
    attn_lse = torch.empty(bs, num_heads, max_kv_splits, dtype=torch.float32, device=DEVICE)
    scale = 0.125
    decode_mla_attention_fwd(
        q, kv_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits, scale,
        kv_lora_rank,
    )  # fmt: skip
    for b in range(bs):
        rows = kv_buffer[kv_indices[kv_indptr[b] : kv_indptr[b + 1]], 0].float()  # [len, width]
        p = torch.softmax(q[b].float() @ rows.T * scale, dim=-1)  # [heads, len]
        want = p @ rows[:, :kv_lora_rank]  # the value is the key's latent part
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(o[b].float(), want, atol=tol, rtol=tol)
