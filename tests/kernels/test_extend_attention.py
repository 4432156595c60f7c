"""Extend attention (new tokens over a cached prefix, causal among themselves) against plain torch."""

import pytest
import torch

import minisgl  # noqa: F401  (sets TRITON_INTERPRET on CPU before any kernel is decorated)
from minisgl.layers.attention.triton_ops.extend_attention import extend_attention_fwd
from tests.kernels.test_decode_attention import DEVICE, TOLERANCE, make_kv_indices


def make_extend_case(
    prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, page_size, dtype, seed, device=DEVICE
):
    g = torch.Generator().manual_seed(seed)
    pool_size = (sum(prefix_lens) + len(prefix_lens) * page_size) * 2
    num_new = sum(extend_lens)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    return dict(
        q_extend=randn(num_new, num_heads, head_dim),
        k_extend=randn(num_new, num_kv_heads, head_dim),
        v_extend=randn(num_new, num_kv_heads, head_dim),
        k_buffer=randn(pool_size, num_kv_heads, head_dim),
        v_buffer=randn(pool_size, num_kv_heads, head_dim),
        qo_indptr=torch.tensor([0] + extend_lens).cumsum(0).to(torch.int32).to(device),
        kv_indptr=torch.tensor([0] + prefix_lens).cumsum(0).to(torch.int32).to(device),
        kv_indices=make_kv_indices(prefix_lens, page_size, pool_size, g).to(torch.int64).to(device),
        max_len_extend=max(extend_lens),
        sm_scale=head_dim**-0.5,
    )


def run_extend(case, logit_cap=0.0):
    q = case["q_extend"]
    o = torch.empty(*q.shape[:2], case["v_extend"].shape[-1], dtype=q.dtype, device=q.device)
    extend_attention_fwd(
        q,
        case["k_extend"],
        case["v_extend"],
        o,
        case["k_buffer"],
        case["v_buffer"],
        case["qo_indptr"],
        case["kv_indptr"],
        case["kv_indices"],
        case["max_len_extend"],
        case["sm_scale"],
        logit_cap,
    )
    return o


def extend_ref(case, logit_cap=0.0):
    """Per request: keys are prefix (gathered from the pool) then new tokens; new token i
    sees the whole prefix and new tokens 0..i."""
    qo, kv = case["qo_indptr"].tolist(), case["kv_indptr"].tolist()
    out = []
    for b in range(len(qo) - 1):
        slots = case["kv_indices"][kv[b] : kv[b + 1]]
        k = torch.cat([case["k_buffer"][slots], case["k_extend"][qo[b] : qo[b + 1]]]).float()
        v = torch.cat([case["v_buffer"][slots], case["v_extend"][qo[b] : qo[b + 1]]]).float()
        q = case["q_extend"][qo[b] : qo[b + 1]].float()  # [m, H, D]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("mhd,nhd->hmn", q, k) * case["sm_scale"]
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        m, n = q.shape[0], k.shape[0]
        visible = torch.arange(n, device=q.device)[None, :] <= (n - m) + torch.arange(m, device=q.device)[:, None]
        out.append(torch.einsum("hmn,nhd->mhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v))
    return torch.cat(out)


@pytest.mark.parametrize(
    "prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, page_size, dtype",
    [
        ([0], [1], 2, 2, 64, 1, torch.float32),  # one token, nothing cached
        ([0, 0], [5, 70], 4, 4, 64, 1, torch.float32),  # no prefix; 70 spans two query blocks
        ([13, 0, 80], [3, 9, 1], 9, 3, 64, 1, torch.float32),  # group of 3, scattered prefix slots
        ([32, 7], [20, 66], 3, 1, 128, 16, torch.float32),  # MQA, 16-token pages
        ([9, 100], [12, 4], 8, 2, 80, 4, torch.float32),  # odd head_dim padded to 128
        ([5, 0, 64, 1], [1, 17, 8, 30], 9, 3, 96, 4, torch.float16),
        ([40, 3], [25, 2], 4, 2, 128, 1, torch.bfloat16),
    ],
)
def test_extend_attention(prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, page_size, dtype):
    seed = sum(prefix_lens + extend_lens)
    case = make_extend_case(prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, page_size, dtype, seed)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(run_extend(case).float(), extend_ref(case), atol=tol, rtol=tol)


def test_extend_attention_logit_cap():
    case = make_extend_case([20, 6], [7, 11], 6, 2, 64, 1, torch.float32, seed=11)
    case["q_extend"] *= 8  # large logits, so the cap actually bends them
    torch.testing.assert_close(run_extend(case, logit_cap=5.0), extend_ref(case, logit_cap=5.0), atol=1e-4, rtol=1e-4)
