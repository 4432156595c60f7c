"""Split-KV paged decode attention against a per-request softmax in plain torch."""

import pytest
import torch

import minisgl  # noqa: F401  (sets TRITON_INTERPRET on CPU before any kernel is decorated)
from minisgl.layers.attention.triton_ops.decode_attention import (
    decode_attention_fwd,
    get_num_kv_splits,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def make_kv_indices(seq_lens: list[int], page_size: int, pool_size: int, generator: torch.Generator) -> torch.Tensor:
    """Pool slots of each request's KV, concatenated: whole random pages of the pool,
    so runs of page_size slots are contiguous and page-aligned (page_size 1: scattered)."""
    pages_per_req = [(n + page_size - 1) // page_size for n in seq_lens]
    pages = torch.randperm(pool_size // page_size, generator=generator)[: sum(pages_per_req)].split(pages_per_req)
    return torch.cat(
        [(p[:, None] * page_size + torch.arange(page_size)).flatten()[:n] for p, n in zip(pages, seq_lens)]
    )


def make_decode_case(
    seq_lens, num_heads, num_kv_heads, head_dim, page_size, dtype, index_dtype, max_kv_splits, seed, device=DEVICE
):
    g = torch.Generator().manual_seed(seed)
    bs = len(seq_lens)
    pool_size = (sum(seq_lens) + bs * page_size) * 2

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    return dict(
        q=randn(bs, num_heads, head_dim),
        k_buffer=randn(pool_size, num_kv_heads, head_dim),
        v_buffer=randn(pool_size, num_kv_heads, head_dim),
        kv_indptr=torch.tensor([0] + seq_lens).cumsum(0).to(torch.int32).to(device),
        kv_indices=make_kv_indices(seq_lens, page_size, pool_size, g).to(index_dtype).to(device),
        num_kv_splits=torch.randint(1, max_kv_splits + 1, (bs,), generator=g, dtype=torch.int32).to(device),
        max_kv_splits=max_kv_splits,
        sm_scale=head_dim**-0.5,
    )


def run_decode(case, logit_cap=0.0):
    q, v_buffer, max_kv_splits = case["q"], case["v_buffer"], case["max_kv_splits"]
    bs, num_heads, v_head_dim = q.shape[0], q.shape[1], v_buffer.shape[-1]
    o = torch.empty(bs, num_heads, v_head_dim, dtype=q.dtype, device=q.device)
    # Scratch is left uninitialised: splits that own no tokens must never be read.
    attn_logits = torch.empty(bs, num_heads, max_kv_splits, v_head_dim, dtype=torch.float32, device=q.device)
    attn_lse = torch.empty(bs, num_heads, max_kv_splits, dtype=torch.float32, device=q.device)
    decode_attention_fwd(
        q,
        case["k_buffer"],
        v_buffer,
        o,
        case["kv_indptr"],
        case["kv_indices"],
        attn_logits,
        attn_lse,
        case["num_kv_splits"],
        max_kv_splits,
        case["sm_scale"],
        logit_cap,
    )
    return o


def decode_ref(case, logit_cap=0.0):
    """Per request: softmax over all of its cached tokens, gathered from the pool by slot."""
    indptr = case["kv_indptr"].tolist()
    out = []
    for b in range(len(indptr) - 1):
        slots = case["kv_indices"][indptr[b] : indptr[b + 1]]
        q = case["q"][b].float()  # [H, D]
        group = q.shape[0] // case["k_buffer"].shape[1]
        k = case["k_buffer"][slots].float().repeat_interleave(group, dim=1)  # [n, H, D]
        v = case["v_buffer"][slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q, k) * case["sm_scale"]
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), v))
    return torch.stack(out)


@pytest.mark.parametrize(
    "seq_lens, num_heads, num_kv_heads, head_dim, page_size, dtype, index_dtype",
    [
        ([1], 4, 4, 64, 1, torch.float32, torch.int32),  # MHA, a single token of KV
        ([37, 1, 90, 5, 64], 9, 3, 64, 1, torch.float32, torch.int64),  # group of 3, scattered slots
        ([100, 17, 33], 3, 1, 128, 16, torch.float32, torch.int32),  # MQA, 16-token pages
        ([8, 70], 8, 2, 80, 4, torch.float32, torch.int32),  # odd head_dim padded to 128
        ([1, 45, 96, 12], 9, 3, 96, 4, torch.float16, torch.int64),
        ([63, 1, 130], 4, 2, 128, 1, torch.bfloat16, torch.int32),
        ([50, 3], 36, 2, 64, 16, torch.float32, torch.int32),  # group of 18 > BLOCK_H: two head blocks per KV head
    ],
)
def test_decode_attention(seq_lens, num_heads, num_kv_heads, head_dim, page_size, dtype, index_dtype):
    case = make_decode_case(
        seq_lens, num_heads, num_kv_heads, head_dim, page_size, dtype, index_dtype, max_kv_splits=4, seed=sum(seq_lens)
    )
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(run_decode(case).float(), decode_ref(case), atol=tol, rtol=tol)


def test_decode_attention_reads_a_bfloat16_pool_under_a_float32_query():
    """--kv-cache-dtype bf16: K/V are upcast to float32 before tl.dot, so against the reference on
    the same rounded K/V the result keeps float32's tolerance."""
    case = make_decode_case([37, 1, 90], 9, 3, 64, 1, torch.float32, torch.int64, max_kv_splits=4, seed=3)
    case["k_buffer"], case["v_buffer"] = case["k_buffer"].bfloat16(), case["v_buffer"].bfloat16()
    tol = TOLERANCE[torch.float32]
    torch.testing.assert_close(run_decode(case), decode_ref(case), atol=tol, rtol=tol)


def test_decode_attention_logit_cap():
    case = make_decode_case([40, 7], 6, 2, 64, 1, torch.float32, torch.int64, max_kv_splits=3, seed=7)
    case["q"] *= 8  # large logits, so the cap actually bends them
    torch.testing.assert_close(run_decode(case, logit_cap=5.0), decode_ref(case, logit_cap=5.0), atol=1e-4, rtol=1e-4)


def test_decode_attention_split_count_does_not_change_result():
    case = make_decode_case([200, 77, 1], 4, 2, 64, 1, torch.float32, torch.int32, max_kv_splits=8, seed=3)
    outs = []
    for splits in (1, 3, 8):
        case["num_kv_splits"] = torch.full((3,), splits, dtype=torch.int32, device=DEVICE)
        outs.append(run_decode(case))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0], outs[2], atol=1e-5, rtol=1e-5)


def test_get_num_kv_splits():
    seq_lens = torch.tensor([0, 1, 256, 257, 1000, 100000])
    splits = get_num_kv_splits(seq_lens, max_kv_splits=4, min_tokens_per_split=256)
    assert splits.dtype == torch.int32
    assert splits.tolist() == [1, 1, 1, 2, 4, 4]
