"""minisgl's C++ CPU kernels (minisgl/kernels/cpu) against the plain-torch code they replace.

Attention is checked against a per-request SDPA over keys gathered through req_to_token;
the elementwise kernels against the layers' forward_native, bit-for-bit in float32 where the
reference rounds at the same points. The float GEMM is test_cpu_gemm.py's.
"""

import pytest
import torch
import torch.nn.functional as F

from minisgl.entrypoints.engine import Engine
from minisgl.kernels.cpu import is_available
from minisgl.layers.activation import SiluAndMul
from minisgl.layers.attention.intel_amx_backend import IntelAMXAttnBackend
from minisgl.layers.layernorm import RMSNorm
from minisgl.layers.rotary_embedding import get_rope
from minisgl.layers.sampler import argmax_rows
from tests._models import tiny_model_dir
from tests.kernels.test_cpu_matrix_engines import brgemm_calls_seen, force_brgemm, needs

pytestmark = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")
ops = torch.ops.minisgl_kernel
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make_paged_case(prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, seed, kv_dtype=None):
    """Requests with random pool slots (scattered, as with page_size 1) and KV already stored;
    the pool holds kv_dtype (--kv-cache-dtype), the model's dtype by default."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    pool = sum(seq_lens) * 2 + 8
    max_context = max(seq_lens) + 5
    req_to_token = torch.zeros(len(seq_lens) + 3, max_context, dtype=torch.int32)
    req_pool_indices = torch.randperm(len(seq_lens) + 3, generator=g)[: len(seq_lens)]
    slots = torch.randperm(pool, generator=g)[: sum(seq_lens)].to(torch.int32).split(seq_lens)
    for r, s in zip(req_pool_indices.tolist(), slots):
        req_to_token[r, : len(s)] = s
    randn = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    num_tokens = sum(extend_lens)
    # q as the strided view the QKV projection produces: [tokens, heads * dim] inside a wider row
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    return dict(
        q=q,
        k_buffer=randn(pool, num_kv_heads, head_dim).to(kv_dtype or dtype),
        v_buffer=randn(pool, num_kv_heads, head_dim).to(kv_dtype or dtype),
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices.long(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        extend_seq_lens=torch.tensor(extend_lens, dtype=torch.int64),
        extend_start_loc=torch.tensor([0] + extend_lens[:-1], dtype=torch.int64).cumsum(0),
        slots=slots,
        prefix_lens=prefix_lens,
    )


def new_kv(c, extend_lens, num_kv_heads, dtype, head_dim=64):
    """The new tokens' K/V, as strided views like the QKV split's, and their slots: the kernels
    store them in the pool themselves before attending."""
    loc = torch.cat([s[len(s) - n :] for s, n in zip(c["slots"], extend_lens)]).long()
    kv = torch.randn(len(loc), 2 * num_kv_heads, head_dim).to(dtype)
    return kv[:, :num_kv_heads], kv[:, num_kv_heads:], loc


def reference_attention(c, scale):
    """Each request's new tokens attend causally to its whole sequence, in float64."""
    out, start = [], 0
    for slots, prefix, ext in zip(c["slots"], c["prefix_lens"], c["extend_seq_lens"].tolist()):
        q = c["q"][start : start + ext].double().transpose(0, 1)  # [heads, ext, dim]
        k = c["k_buffer"][slots.long()].double().transpose(0, 1)  # [kv_heads, seq, dim]
        v = c["v_buffer"][slots.long()].double().transpose(0, 1)
        mask = torch.ones(ext, prefix + ext, dtype=torch.bool).tril(diagonal=prefix)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out.append(o.transpose(0, 1))
        start += ext
    return torch.cat(out)


# (model dtype, pool dtype): the pool holds the model's dtype, bfloat16 (--kv-cache-dtype bf16) or
# float8 (--kv-cache-dtype fp8_e5m2, fp8_e4m3). With a narrower pool the reference reads the same
# rounded K/V, so the query keeps its own dtype's tolerance.
DTYPE_PAIRS = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.bfloat16),
    (torch.float16, torch.bfloat16),
    (torch.float32, torch.float8_e5m2),
    (torch.bfloat16, torch.float8_e5m2),
    (torch.float32, torch.float8_e4m3fn),
    (torch.bfloat16, torch.float8_e4m3fn),
]


@pytest.mark.parametrize("dtype,kv_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("head_dim", [64, 128, 32])
def test_decode_attention_matches_sdpa(dtype, kv_dtype, num_heads, num_kv_heads, head_dim):
    seq_lens = [1, 7, 64, 200, 33]
    c = make_paged_case(
        [n - 1 for n in seq_lens], [1] * len(seq_lens), num_heads, num_kv_heads, head_dim, dtype, 0, kv_dtype
    )
    key, value, loc = new_kv(c, [1] * len(seq_lens), num_kv_heads, dtype, head_dim)
    o = torch.empty(len(seq_lens), num_heads, head_dim, dtype=dtype)
    ops.decode_attention_cpu(
        c["q"],
        o,
        c["k_buffer"],
        c["v_buffer"],
        key,
        value,
        loc,
        c["req_to_token"],
        c["req_pool_indices"],
        c["seq_lens"],
        0.125,
    )
    # stored rounded to the pool's dtype exactly as torch's cast rounds (to nearest even)
    assert torch.equal(c["k_buffer"][loc], key.to(kv_dtype)) and torch.equal(c["v_buffer"][loc], value.to(kv_dtype))
    torch.testing.assert_close(o.double(), reference_attention(c, 0.125), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.fixture
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype,kv_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("seq_lens", [[1000], [3, 777]])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (8, 1)])
@pytest.mark.parametrize("head_dim", [64, 32])
def test_decode_attention_with_split_keys_matches_sdpa(
    four_threads, dtype, kv_dtype, seq_lens, num_heads, num_kv_heads, head_dim
):
    """Fewer (request, KV head) items than twice the 4 threads: each item's keys are split into
    ranges of at least 256 and merged by their log-sum-exp (decode.cpp's decode_split); the
    request of 3 tokens leaves its later ranges empty."""
    c = make_paged_case(
        [n - 1 for n in seq_lens], [1] * len(seq_lens), num_heads, num_kv_heads, head_dim, dtype, 1, kv_dtype
    )
    key, value, loc = new_kv(c, [1] * len(seq_lens), num_kv_heads, dtype, head_dim)
    o = torch.empty(len(seq_lens), num_heads, head_dim, dtype=dtype)
    args = (c["k_buffer"], c["v_buffer"], key, value, loc, c["req_to_token"], c["req_pool_indices"], c["seq_lens"])
    ops.decode_attention_cpu(c["q"], o, *args, 0.125)
    assert torch.equal(c["k_buffer"][loc], key.to(kv_dtype)) and torch.equal(c["v_buffer"][loc], value.to(kv_dtype))
    torch.testing.assert_close(o.double(), reference_attention(c, 0.125), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype,kv_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("prefix_lens,extend_lens", [([0, 0, 0], [1, 45, 100]), ([0, 17, 64], [70, 3, 33])])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (4, 4)])
@pytest.mark.parametrize("head_dim", [64, 128, 32])  # 32: the kernels' generic (runtime) head-dim path
def test_extend_attention_matches_sdpa(dtype, kv_dtype, prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim):
    c = make_paged_case(prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, 1, kv_dtype)
    key, value, loc = new_kv(c, extend_lens, num_kv_heads, dtype, head_dim)
    o = torch.empty(sum(extend_lens), num_heads, head_dim, dtype=dtype)
    ops.extend_attention_cpu(
        c["q"],
        o,
        c["k_buffer"],
        c["v_buffer"],
        key,
        value,
        loc,
        c["req_to_token"],
        c["req_pool_indices"],
        c["seq_lens"],
        c["extend_seq_lens"],
        c["extend_start_loc"],
        0.125,
    )
    # stored rounded to the pool's dtype exactly as torch's cast rounds (to nearest even)
    assert torch.equal(c["k_buffer"][loc], key.to(kv_dtype)) and torch.equal(c["v_buffer"][loc], value.to(kv_dtype))
    torch.testing.assert_close(o.double(), reference_attention(c, 0.125), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def random_tree_mask(prefix, ext, g):
    """An EAGLE-shaped [ext, prefix + ext] mask: node 0 the root, each later node a child of a
    random earlier one, seeing the whole prefix, its ancestors and itself."""
    tree = torch.eye(ext, dtype=torch.bool)
    for j in range(1, ext):
        tree[j] |= tree[int(torch.randint(0, j, (1,), generator=g))]
    return torch.cat([torch.ones(ext, prefix, dtype=torch.bool), tree], dim=1)


@pytest.mark.parametrize("dtype,kv_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("head_dim", [64, 128, 32])
def test_extend_attention_with_a_tree_mask_matches_sdpa(dtype, kv_dtype, head_dim):
    """EAGLE's verify: each request's new tokens are a tree (extend lengths past one block of 32
    too) and see the prefix and their ancestors only, as SDPA with the same boolean mask does."""
    prefix_lens, extend_lens, g = [0, 17, 130, 5], [8, 40, 16, 1], torch.Generator().manual_seed(3)
    c = make_paged_case(prefix_lens, extend_lens, 9, 3, head_dim, dtype, 4, kv_dtype)
    masks = [random_tree_mask(p, e, g) for p, e in zip(prefix_lens, extend_lens)]
    key, value, loc = new_kv(c, extend_lens, 3, dtype, head_dim)
    o = torch.empty(sum(extend_lens), 9, head_dim, dtype=dtype)
    args = [c["q"], o, c["k_buffer"], c["v_buffer"], key, value, loc, c["req_to_token"], c["req_pool_indices"]]
    lens = [c["seq_lens"], c["extend_seq_lens"], c["extend_start_loc"], 0.125]
    # Random entries past the last request's block, as in a compiled verify's static buffer: not read.
    ops.extend_attention_cpu(
        *args, *lens, torch.cat([m.flatten() for m in masks] + [torch.rand(50, generator=g) > 0.5])
    )
    expected, start = [], 0
    for slots, ext, mask in zip(c["slots"], extend_lens, masks):
        q = c["q"][start : start + ext].double().transpose(0, 1)
        k, v = (buf[slots.long()].double().transpose(0, 1) for buf in (c["k_buffer"], c["v_buffer"]))
        o_ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True)
        expected.append(o_ref.transpose(0, 1))
        start += ext
    torch.testing.assert_close(o.double(), torch.cat(expected), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_extend_attention_on_brgemm_matches_sdpa(head_dim, kv_dtype, monkeypatch):
    """A bf16 model over a bf16 or fp8 pool takes extend's Q . K^T and p . v on oneDNN's brgemm, as an
    AMX CPU runs them (MINISGL_BRGEMM=1 on a CPU without AMX): causal, with a prefix, and under a tree mask."""
    force_brgemm(monkeypatch, torch.bfloat16)
    test_extend_attention_matches_sdpa(torch.bfloat16, kv_dtype, [0, 17, 64], [70, 3, 33], 9, 3, head_dim)
    test_extend_attention_with_a_tree_mask_matches_sdpa(torch.bfloat16, kv_dtype, head_dim)


EXTEND_BF16 = """
import torch
from minisgl.kernels.cpu import is_available
assert is_available()
from tests.kernels.test_cpu_kernels import test_extend_attention_matches_sdpa
test_extend_attention_matches_sdpa(torch.bfloat16, torch.bfloat16, [0, 17, 64], [70, 3, 33], 9, 3, 64)
"""


@pytest.mark.parametrize("head_dim", [64, pytest.param(128, marks=pytest.mark.slow)])  # ~7 s each
def test_extend_attention_takes_the_own_tiles_on_amx_and_brgemms_bits(head_dim, monkeypatch):
    """On a CPU with amx_bf16, extend attention's Q . K^T and p . v multiply on the dense GEMMs' tile
    loop (gemm_amx.h), as those GEMMs do: oneDNN logs no brgemm call, and each output equals
    MINISGL_BRGEMM=1's (oneDNN's brgemm on the same tiles) bit for bit, causal and under a tree mask."""
    needs("amx_bf16")
    assert brgemm_calls_seen(None, EXTEND_BF16) == set()
    prefix_lens, extend_lens, g = [0, 17, 130, 5], [70, 40, 16, 1], torch.Generator().manual_seed(5)
    c = make_paged_case(prefix_lens, extend_lens, 9, 3, head_dim, torch.bfloat16, 6)
    key, value, loc = new_kv(c, extend_lens, 3, torch.bfloat16, head_dim)
    mask = torch.cat([random_tree_mask(p, e, g).flatten() for p, e in zip(prefix_lens, extend_lens)])
    lens = [c["seq_lens"], c["extend_seq_lens"], c["extend_start_loc"], 0.125]
    outputs = {}
    for setting in ("", "1"):
        monkeypatch.setenv("MINISGL_BRGEMM", setting)
        for custom_mask in (None, mask):
            o = torch.empty(sum(extend_lens), 9, head_dim, dtype=torch.bfloat16)
            pool = [c["k_buffer"], c["v_buffer"], key, value, loc, c["req_to_token"], c["req_pool_indices"]]
            ops.extend_attention_cpu(c["q"], o, *pool, *lens, custom_mask)
            outputs[setting, custom_mask is None] = o
    for causal in (True, False):
        assert torch.equal(outputs["", causal], outputs["1", causal])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extend_len,tree", [(8, True), (10, False)])
def test_extend_attention_of_one_small_request_gives_the_same_bits_on_any_number_of_threads(dtype, extend_len, tree):
    """An EAGLE verify at batch 1: one request's 8 (or 10) tokens over 3 KV heads are 3 work items,
    fewer than two per thread, so with 2 or 4 threads extend.cpp cuts them into smaller blocks (of 4
    or 5 tokens with AVX-512), with 1 thread it keeps one block. The blocks change who computes a row, not how: every
    thread count gives the same bits, and SDPA's result."""
    prefix, g = 100, torch.Generator().manual_seed(11)
    c = make_paged_case([prefix], [extend_len], 9, 3, 64, dtype, 12)
    key, value, loc = new_kv(c, [extend_len], 3, dtype)
    mask = (
        random_tree_mask(prefix, extend_len, g)
        if tree
        else torch.ones(extend_len, prefix + extend_len).tril(prefix).bool()
    )
    outputs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            o = torch.empty(extend_len, 9, 64, dtype=dtype)
            ops.extend_attention_cpu(
                c["q"], o, c["k_buffer"], c["v_buffer"], key, value, loc, c["req_to_token"], c["req_pool_indices"],
                c["seq_lens"], c["extend_seq_lens"], c["extend_start_loc"], 0.125, mask.flatten() if tree else None,
            )  # fmt: skip
            outputs.append(o)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])
    q = c["q"].double().transpose(0, 1)
    k, v = (buf[c["slots"][0].long()].double().transpose(0, 1) for buf in (c["k_buffer"], c["v_buffer"]))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(outputs[0].double(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_extend_attention_with_a_mask_reads_new_keys_from_their_own_slots():
    """EAGLE's draft steps: a request's lanes are one-token extends sharing its req_to_token row,
    each in its own slot past the row's prefix, each seeing the prefix's keys that are its
    ancestors. The kernel must read a lane's key from loc, not from the row."""
    lanes, prefix = 3, 10
    c = make_paged_case([prefix], [1], 4, 2, 64, torch.float32, 5)
    free = torch.tensor(sorted(set(range(len(c["k_buffer"]))) - set(c["slots"][0].tolist())))[:lanes]
    g = torch.Generator().manual_seed(6)
    key, value, q = (torch.randn(lanes, heads, 64, generator=g) for heads in (2, 2, 4))
    sees = torch.ones(lanes, prefix + 1, dtype=torch.bool)
    sees[:, 6:prefix] = torch.rand(lanes, 4, generator=g) > 0.5
    o = torch.empty(lanes, 4, 64)
    req = c["req_pool_indices"].repeat(lanes)
    ops.extend_attention_cpu(
        q, o, c["k_buffer"], c["v_buffer"], key, value, free.long(), c["req_to_token"], req,
        torch.full((lanes,), prefix + 1), torch.ones(lanes, dtype=torch.int64), torch.arange(lanes), 0.125,
        sees.flatten(),
    )  # fmt: skip
    for lane in range(lanes):
        slots = torch.cat([c["slots"][0][:prefix].long(), free[lane : lane + 1]])
        k, v = c["k_buffer"][slots].transpose(0, 1), c["v_buffer"][slots].transpose(0, 1)
        o_ref = F.scaled_dot_product_attention(
            q[lane : lane + 1].transpose(0, 1), k, v, attn_mask=sees[lane : lane + 1], scale=0.125, enable_gqa=True
        )
        torch.testing.assert_close(o[lane], o_ref.transpose(0, 1)[0], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("fault", ["hides itself", "sees a later token", "wrong size", "not bool"])
def test_extend_attention_refuses_a_bad_tree_mask(fault):
    c = make_paged_case([4], [3], 4, 4, 64, torch.float32, seed=7)
    key, value, loc = new_kv(c, [3], 4, torch.float32)
    mask = random_tree_mask(4, 3, torch.Generator().manual_seed(8))
    if fault == "hides itself":
        mask[1, 5] = False
    elif fault == "sees a later token":
        mask[0, 6] = True
    mask = mask.flatten()
    if fault == "wrong size":
        mask = mask[:-1]
    elif fault == "not bool":
        mask = mask.to(torch.uint8)
    message = {"not bool": "must be bool", "wrong size": "extend_len x seq_len"}.get(fault, "itself and no later")
    with pytest.raises(RuntimeError, match=message):
        ops.extend_attention_cpu(
            c["q"], torch.empty(3, 4, 64), c["k_buffer"], c["v_buffer"], key, value, loc, c["req_to_token"],
            c["req_pool_indices"], c["seq_lens"], c["extend_seq_lens"], c["extend_start_loc"], 0.125, mask,
        )  # fmt: skip


@pytest.mark.parametrize(
    "k_dtype,v_dtype",
    [(torch.float16, torch.float16), (torch.bfloat16, torch.float32), (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz)],
)
def test_attention_rejects_a_pool_of_another_dtype(k_dtype, v_dtype):
    """A float32 model's pool may hold float32, bfloat16 or float8 (e5m2, e4m3fn), K and V alike; nothing else."""
    c = make_paged_case([3], [1], 4, 4, 64, torch.float32, seed=2)
    key, value, loc = new_kv(c, [1], 4, torch.float32)
    o = torch.empty(1, 4, 64)
    with pytest.raises(RuntimeError, match=r"model dtype, bfloat16 or float8 \(e5m2, e4m3fn\)"):
        ops.extend_attention_cpu(
            c["q"],
            o,
            c["k_buffer"].to(k_dtype),
            c["v_buffer"].to(v_dtype),
            key,
            value,
            loc,
            c["req_to_token"],
            c["req_pool_indices"],
            c["seq_lens"],
            c["extend_seq_lens"],
            c["extend_start_loc"],
            0.125,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [576, 45])  # 45: whole steps of two vectors, then the rest one by one
def test_rmsnorm_matches_forward_native(dtype, d):
    # Seeded, and relative as well as absolute: the two paths may round an output of 4 or more to
    # neighbouring bf16 numbers, 0.03125 apart, more than the absolute tolerance (an unseeded run
    # met one such value among 21,312 and failed).
    g = torch.Generator().manual_seed(d)
    norm = RMSNorm(d, eps=1e-5).to(dtype)
    norm.weight.data = torch.randn(d, generator=g).to(dtype)
    x, res = torch.randn(37, d, generator=g).to(dtype), torch.randn(37, d, generator=g).to(dtype)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(ops.rmsnorm_cpu(x, norm.weight, 1e-5), norm.forward_native(x), atol=tol, rtol=tol)
    out, new_res = ops.fused_add_rmsnorm_cpu(x, res, norm.weight, 1e-5)
    ref_out, ref_res = norm.forward_native(x, res)
    torch.testing.assert_close(new_res, ref_res, atol=0, rtol=0)  # one rounded add: exact
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=tol)


# shorter than a vector; one AVX2 vector; one AVX-512 vector; many; many and a tail (max_of's masked step)
@pytest.mark.parametrize("vocab", [1, 7, 8, 16, 49152, 49157])
def test_argmax_cpu_matches_torch_argmax(vocab):
    x = torch.randn(40, vocab)
    if vocab > 1:
        x[1] = 0.5  # all tied: the first index
        x[2, -1] = float("inf")
        x[3, vocab // 2 :] = x[3].max() + 1  # tied maxima: the first of them
        x[4, -1], x[5, 0] = float("nan"), float("nan")  # NaN counts as the largest value, as in torch
        x[6, vocab // 2 :] = float("nan")
    x[7] = float("-inf")
    assert torch.equal(ops.argmax_cpu(x), torch.argmax(x, dim=-1))
    wide = torch.randn(5, 2 * vocab + 3)[:, 1 : vocab + 1]  # rows of a larger tensor (strided)
    assert torch.equal(ops.argmax_cpu(wide), torch.argmax(wide, dim=-1))
    assert ops.argmax_cpu(torch.empty(0, vocab)).shape == (0,)
    with pytest.raises(RuntimeError, match="argmax_cpu: expects float32"):
        ops.argmax_cpu(x.bfloat16())
    # what the kernel does not take, argmax_rows leaves to torch.argmax
    for other in (x.t(), x.bfloat16(), x[None]):
        assert torch.equal(argmax_rows(other), torch.argmax(other, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [1536, 45])  # 45: one step of 32 values, then 13 one by one
def test_silu_and_mul_matches_torch(dtype, d):
    x = torch.randn(23, 2 * d).to(dtype) * 4
    torch.testing.assert_close(
        ops.silu_and_mul_cpu(x), SiluAndMul().forward_native(x), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [64, 48, 32])  # 48: a half of 24, with AVX-512 one vector and 8 one by one
def test_rotary_embedding_matches_forward_native(dtype, rotary_dim):
    rope = get_rope(64, rotary_dim, 512, 10000.0)
    g = torch.Generator().manual_seed(rotary_dim)  # seeded and relative too, as the RMSNorm test
    qkv = torch.randn(19, (9 + 2 * 3) * 64, generator=g).to(dtype)
    q, k = qkv[:, : 9 * 64], qkv[:, 9 * 64 : 12 * 64]  # strided views, as the models pass them
    positions = torch.randint(0, 512, (19,), generator=g)
    q_out, k_out = ops.rotary_embedding_cpu(positions, q, k, 64, rope.cos_sin_cache)
    q_ref, k_ref = rope.forward_native(positions, q, k)
    torch.testing.assert_close(q_out, q_ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    torch.testing.assert_close(k_out, k_ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("arch,page_size", [("llama", 1), ("qwen3", 4), ("qwen3_moe", 1)])
def test_intel_amx_backend_matches_torch_native(arch, page_size):
    """End to end: the same greedy tokens as the torch_native backend, through prefill in small
    chunks (extend over a cached prefix), decode, and a second round that reuses the radix cache;
    afterwards every KV slot is back in the pool."""
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [10, 11], [5, 6, 7, 8, 9, 14, 15], [19]]
    greedy = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    kwargs = dict(model_path=tiny_model_dir(arch), max_total_tokens=256, page_size=page_size, chunked_prefill_size=4)
    native = Engine(**kwargs, attention_backend="torch_native")
    amx = Engine(**kwargs, attention_backend="intel_amx")
    assert isinstance(amx.scheduler.tp_worker.model_runner.attn_backend, IntelAMXAttnBackend)
    for _ in range(2):
        expected = native.generate(input_ids=prompts, sampling_params=greedy)
        got = amx.generate(input_ids=prompts, sampling_params=greedy)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in expected]
    assert amx.flush_cache() and amx.scheduler.token_to_kv_pool_allocator.available_size() == 256


@pytest.mark.parametrize("kv_dtype", [torch.float8_e5m2, torch.float8_e4m3fn])
def test_every_fp8_code_widens_exactly_and_stores_round_as_torch_casts(kv_dtype):
    """All 256 codes of the pool dtype read back as torch widens them (the kernels' vector widening
    against c10's scalar one), e4m3's two NaN codes excepted: they read as +-480, and no store makes
    them, since torch's cast (and so the kernels' stores) saturates e4m3 at +-448. Values past the
    format's range are stored as torch's cast stores them."""
    codes = torch.arange(256, dtype=torch.uint8).view(kv_dtype)
    want = codes.float()
    compared = ~want.isnan() if kv_dtype == torch.float8_e4m3fn else torch.ones(256, dtype=torch.bool)

    def decode(c, key):
        _, _, loc = new_kv(c, [1], 1, torch.float32)
        o, zeros = torch.empty(1, 1, 64), torch.zeros(1, 1, 64)
        ops.decode_attention_cpu(
            zeros, o, c["k_buffer"], c["v_buffer"], key, zeros, loc, c["req_to_token"], c["req_pool_indices"],
            c["seq_lens"], 1.0,
        )  # fmt: skip
        return o[0, 0], loc

    for i in range(4):  # 64 codes at a time: the value row of a request's one cached token
        c = make_paged_case([1], [1], 1, 1, 64, torch.float32, seed=5, kv_dtype=kv_dtype)
        cached = c["slots"][0][0].long()
        c["k_buffer"][cached] = torch.zeros(1, 64).to(kv_dtype)
        c["v_buffer"][cached] = codes[64 * i : 64 * (i + 1)].view(1, 64)
        # q = 0 scores both keys 0: the output is the mean of the cached value row and the new zeros
        out, _ = decode(c, torch.zeros(1, 1, 64))
        ok = compared[64 * i : 64 * (i + 1)]
        torch.testing.assert_close(out[ok], want[64 * i : 64 * (i + 1)][ok] / 2, atol=0, rtol=0, equal_nan=True)
    for big in (1e6, -1e6):  # e4m3 saturates at +-448, e5m2 overflows to +-inf, as torch's cast does
        c = make_paged_case([1], [1], 1, 1, 64, torch.float32, seed=6, kv_dtype=kv_dtype)
        key = torch.full((1, 1, 64), big)
        _, loc = decode(c, key)
        assert torch.equal(c["k_buffer"][loc].view(torch.uint8), key.to(kv_dtype).view(torch.uint8))
