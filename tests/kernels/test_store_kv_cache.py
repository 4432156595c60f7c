"""store_kv_cache against indexed assignment in plain torch."""

import pytest
import torch

import minisgl  # noqa: F401  (sets TRITON_INTERPRET on CPU before any kernel is decorated)
from minisgl.layers.attention.triton_ops.store_kv_cache import store_kv_cache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "n, num_kv_heads, head_dim, src_dtype, buf_dtype, loc_dtype",
    [
        (1, 2, 64, torch.float32, torch.float32, torch.int64),
        (7, 3, 80, torch.bfloat16, torch.bfloat16, torch.int32),  # row of 240: masked tail
        (5, 8, 160, torch.float32, torch.bfloat16, torch.int64),  # row of 1280: two blocks, rounding cast
        (4, 1, 128, torch.float16, torch.bfloat16, torch.int32),  # half -> bfloat16
        (6, 2, 96, torch.bfloat16, torch.float32, torch.int64),  # widening cast
    ],
)
def test_store_kv_cache(n, num_kv_heads, head_dim, src_dtype, buf_dtype, loc_dtype):
    g = torch.Generator().manual_seed(n * head_dim)
    pool_size = 4 * n + 8
    k_buffer = torch.randn(pool_size, num_kv_heads, head_dim, generator=g).to(buf_dtype).to(DEVICE)
    v_buffer = torch.randn(pool_size, num_kv_heads, head_dim, generator=g).to(buf_dtype).to(DEVICE)
    loc = torch.randperm(pool_size, generator=g)[:n].to(loc_dtype).to(DEVICE)
    # K and V as views of one fused projection output, the way a model produces them:
    # the token stride spans both, so neither view is contiguous.
    kv = torch.randn(n, 2, num_kv_heads, head_dim, generator=g).to(src_dtype).to(DEVICE)
    cache_k, cache_v = kv[:, 0], kv[:, 1]

    k_ref, v_ref = k_buffer.clone(), v_buffer.clone()
    k_ref[loc.long()] = cache_k.to(buf_dtype)
    v_ref[loc.long()] = cache_v.to(buf_dtype)

    store_kv_cache(k_buffer, v_buffer, loc, cache_k, cache_v)
    # Exact: the kernel rounds once, as torch's cast does, and leaves other slots alone.
    assert torch.equal(k_buffer, k_ref)
    assert torch.equal(v_buffer, v_ref)


def test_store_kv_cache_empty_batch():
    k_buffer = torch.zeros(4, 2, 64, device=DEVICE)
    v_buffer = torch.zeros(4, 2, 64, device=DEVICE)
    empty = torch.empty(0, 2, 64, device=DEVICE)
    store_kv_cache(k_buffer, v_buffer, torch.empty(0, dtype=torch.int64, device=DEVICE), empty, empty)
    assert not k_buffer.any() and not v_buffer.any()
