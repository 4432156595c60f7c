"""GPU check of minisgl's Triton kernels: correctness at real sizes, then speed against torch.

    python benchmarks/gpu_check.py

Needs a CUDA device (on a CPU-only machine it says so and exits with status 1). Runs in
well under five minutes on one H100/H200-class GPU:

1. check_correctness(): the kernel tests' own cases and plain-torch references
   (tests/kernels/test_*.py) at serving sizes: batches up to 64,
   sequences of 128..4096 tokens, 32 query / 8 KV heads, head_dim 128, bf16.
2. bench_decode / bench_extend / bench_moe: each kernel against the obvious
   plain-torch implementation and against a dense SDPA (or the same GEMMs without
   routing) on pre-gathered tensors, printing time, GB/s and TFLOP/s.

Each check is one function called from main(), so further GPU checks slot in the same way.
benchmarks/gpu_engine_check.py checks whole engines on the GPU (parity, loops, CUDA graphs, EAGLE).
"""

import sys
from pathlib import Path

import torch

# The repo root, so that `tests.kernels` (whose cases and references are reused) imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton.testing  # noqa: E402

import minisgl  # noqa: E402,F401  (before triton: on CPU it must set TRITON_INTERPRET first)
from minisgl.layers.attention.triton_ops.decode_attention import (  # noqa: E402
    decode_attention_fwd,
    get_num_kv_splits,
)
from minisgl.layers.attention.triton_ops.extend_attention import extend_attention_fwd  # noqa: E402
from minisgl.layers.moe.fused_moe_triton.fused_moe import fused_moe  # noqa: E402
from tests.kernels import test_decode_attention as decode  # noqa: E402
from tests.kernels import test_extend_attention as extend  # noqa: E402
from tests.kernels import test_fused_moe as moe  # noqa: E402
from tests.kernels import test_rmsnorm, test_store_kv_cache  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16
MAX_KV_SPLITS = 16


def bench_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=50)


def report(name: str, ms: float, num_bytes: float = 0.0, flops: float = 0.0) -> None:
    line = f"    {name:<28} {ms * 1e3:10.1f} us"
    if num_bytes:
        line += f"  {num_bytes / ms / 1e6:8.1f} GB/s"
    if flops:
        line += f"  {flops / ms / 1e9:8.2f} TFLOP/s"
    print(line)


def check_correctness() -> None:
    print("== correctness at real sizes (bf16, 32 heads / 8 KV heads, head_dim 128)")
    gen = torch.Generator().manual_seed(0)
    for bs, page_size in ((1, 1), (16, 16), (64, 1)):
        seq_lens = torch.randint(128, 4097, (bs,), generator=gen).tolist()
        case = decode.make_decode_case(
            seq_lens,
            NUM_HEADS,
            NUM_KV_HEADS,
            HEAD_DIM,
            page_size,
            DTYPE,
            torch.int32,
            MAX_KV_SPLITS,
            seed=bs,
            device="cuda",
        )
        case["num_kv_splits"] = get_num_kv_splits(torch.tensor(seq_lens, device="cuda"), MAX_KV_SPLITS)
        err = (decode.run_decode(case).float() - decode.decode_ref(case)).abs().max().item()
        print(f"    decode  bs={bs:<3} page_size={page_size:<3} max|err|={err:.2e}")
        assert err < decode.TOLERANCE[DTYPE], err

    for bs, page_size in ((1, 1), (4, 16), (16, 1)):
        prefix_lens = torch.randint(0, 2049, (bs,), generator=gen).tolist()
        prefix_lens[0] = 0  # always one request with nothing cached
        extend_lens = torch.randint(128, 1025, (bs,), generator=gen).tolist()
        case = extend.make_extend_case(
            prefix_lens, extend_lens, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, page_size, DTYPE, seed=bs, device="cuda"
        )
        err = (extend.run_extend(case).float() - extend.extend_ref(case)).abs().max().item()
        print(f"    extend  bs={bs:<3} page_size={page_size:<3} max|err|={err:.2e}")
        assert err < extend.TOLERANCE[DTYPE], err

    for num_tokens in (1, 64, 512):
        case = moe.make_moe_case(num_tokens, 2048, 768, 128, 8, DTYPE, seed=num_tokens, device="cuda")
        ref = moe.fused_moe_ref(**case)
        err = ((fused_moe(**case).float() - ref).abs().max() / ref.abs().max()).item()
        print(f"    fused_moe T={num_tokens:<4} E=128 top-8  max|err|/max|ref|={err:.2e}")
        assert err < moe.TOLERANCE[DTYPE], err

    test_rmsnorm.test_rmsnorm(4096, 4096, DTYPE)
    test_rmsnorm.test_fused_add_rmsnorm(4096, 4096, DTYPE)
    test_store_kv_cache.test_store_kv_cache(4096, NUM_KV_HEADS, HEAD_DIM, DTYPE, DTYPE, torch.int64)
    print("    rmsnorm, fused_add_rmsnorm, store_kv_cache at 4096 rows: ok")


def bench_decode() -> None:
    print("== decode attention (uniform lengths; bytes = K + V read)")
    for bs, seq_len in ((1, 4096), (16, 2048), (64, 1024), (64, 4096)):
        pool = torch.randn(2, bs * seq_len, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        k_buffer, v_buffer = pool[0], pool[1]
        kv_indices = torch.randperm(bs * seq_len, device="cuda", dtype=torch.int32)
        kv_indptr = torch.arange(bs + 1, device="cuda", dtype=torch.int32) * seq_len
        q = torch.randn(bs, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        o = torch.empty_like(q)
        attn_logits = torch.empty(bs, NUM_HEADS, MAX_KV_SPLITS, HEAD_DIM, device="cuda", dtype=torch.float32)
        attn_lse = torch.empty(bs, NUM_HEADS, MAX_KV_SPLITS, device="cuda", dtype=torch.float32)
        num_kv_splits = get_num_kv_splits(torch.full((bs,), seq_len, device="cuda"), MAX_KV_SPLITS)
        scale = HEAD_DIM**-0.5

        def triton_decode():
            decode_attention_fwd(
                q,
                k_buffer,
                v_buffer,
                o,
                kv_indptr,
                kv_indices,
                attn_logits,
                attn_lse,
                num_kv_splits,
                MAX_KV_SPLITS,
                scale,
            )

        def gather(buffer):  # [bs, Hkv, seq_len, D]
            return buffer[kv_indices.long()].view(bs, seq_len, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)

        def torch_decode():
            return torch.nn.functional.scaled_dot_product_attention(
                q[:, :, None], gather(k_buffer), gather(v_buffer), scale=scale, enable_gqa=True
            )

        k_dense, v_dense = gather(k_buffer).contiguous(), gather(v_buffer).contiguous()

        def dense_sdpa():
            return torch.nn.functional.scaled_dot_product_attention(
                q[:, :, None], k_dense, v_dense, scale=scale, enable_gqa=True
            )

        kv_bytes = 2 * bs * seq_len * NUM_KV_HEADS * HEAD_DIM * pool.element_size()
        print(f"  bs={bs} seq_len={seq_len}")
        report("triton decode_attention_fwd", bench_ms(triton_decode), kv_bytes)
        report("torch gather + SDPA", bench_ms(torch_decode), kv_bytes)
        report("dense SDPA (pre-gathered)", bench_ms(dense_sdpa), kv_bytes)


def bench_extend() -> None:
    from torch.nn.attention.bias import causal_lower_right

    print("== extend attention (uniform lengths; FLOPs of the causal part only)")
    for bs, prefix_len, extend_len in ((1, 0, 4096), (4, 1024, 1024), (16, 2048, 256)):
        seq_len = prefix_len + extend_len
        pool = torch.randn(2, max(1, bs * prefix_len), NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        k_buffer, v_buffer = pool[0], pool[1]
        kv_indices = torch.randperm(bs * prefix_len, device="cuda", dtype=torch.int64)
        kv_indptr = torch.arange(bs + 1, device="cuda", dtype=torch.int32) * prefix_len
        qo_indptr = torch.arange(bs + 1, device="cuda", dtype=torch.int32) * extend_len
        q = torch.randn(bs * extend_len, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        kv_new = torch.randn(2, bs * extend_len, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        o = torch.empty_like(q)
        scale = HEAD_DIM**-0.5

        def triton_extend():
            extend_attention_fwd(
                q, kv_new[0], kv_new[1], o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, extend_len, scale
            )

        def full_kv(buffer, new):  # [bs, H, seq_len, D], GQA heads repeated
            prefix = buffer[kv_indices].view(bs, prefix_len, NUM_KV_HEADS, HEAD_DIM)
            kv = torch.cat([prefix, new.view(bs, extend_len, NUM_KV_HEADS, HEAD_DIM)], dim=1)
            return kv.transpose(1, 2).repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)

        q_dense = q.view(bs, extend_len, NUM_HEADS, HEAD_DIM).transpose(1, 2)
        mask = causal_lower_right(extend_len, seq_len)

        def torch_extend():
            k, v = full_kv(k_buffer, kv_new[0]), full_kv(v_buffer, kv_new[1])
            return torch.nn.functional.scaled_dot_product_attention(q_dense, k, v, attn_mask=mask, scale=scale)

        k_dense, v_dense = full_kv(k_buffer, kv_new[0]).contiguous(), full_kv(v_buffer, kv_new[1]).contiguous()
        q_dense_c = q_dense.contiguous()

        def dense_sdpa():
            return torch.nn.functional.scaled_dot_product_attention(
                q_dense_c, k_dense, v_dense, attn_mask=mask, scale=scale
            )

        visible_pairs = bs * (extend_len * prefix_len + extend_len * (extend_len + 1) // 2)
        flops = 4 * NUM_HEADS * HEAD_DIM * visible_pairs
        print(f"  bs={bs} prefix={prefix_len} extend={extend_len}")
        report("triton extend_attention_fwd", bench_ms(triton_extend), flops=flops)
        report("torch gather + SDPA", bench_ms(torch_extend), flops=flops)
        report("dense SDPA (pre-gathered)", bench_ms(dense_sdpa), flops=flops)


def bench_moe() -> None:
    print("== fused MoE (Qwen3-30B-A3B shape: E=128, H=2048, I=768, top-8; bytes = weights of used experts)")
    num_experts, hidden, inter, top_k = 128, 2048, 768, 8
    w1 = torch.randn(num_experts, 2 * inter, hidden, device="cuda", dtype=DTYPE) * hidden**-0.5
    w2 = torch.randn(num_experts, hidden, inter, device="cuda", dtype=DTYPE) * inter**-0.5
    for num_tokens in (1, 64, 512, 4096):
        x = torch.randn(num_tokens, hidden, device="cuda", dtype=DTYPE)
        topk_weights, topk_ids = torch.randn(num_tokens, num_experts, device="cuda").softmax(-1).topk(top_k, dim=-1)

        def torch_moe():
            out = torch.zeros_like(x)
            for e in range(num_experts):
                token, slot = (topk_ids == e).nonzero(as_tuple=True)
                gate, up = (x[token] @ w1[e].T).chunk(2, dim=-1)
                y = (torch.nn.functional.silu(gate) * up) @ w2[e].T
                out.index_add_(0, token, y * topk_weights[token, slot, None].to(DTYPE))
            return out

        # The same GEMM work without routing: every routed token through one expert.
        x_routed = x.repeat_interleave(top_k, dim=0)

        def dense_gemms():
            gate, up = (x_routed @ w1[0].T).chunk(2, dim=-1)
            return (torch.nn.functional.silu(gate) * up) @ w2[0].T

        used_experts = topk_ids.unique().numel()
        weight_bytes = used_experts * 3 * hidden * inter * w1.element_size()
        flops = num_tokens * top_k * 6 * hidden * inter
        print(f"  T={num_tokens} ({used_experts} experts used)")
        report("triton fused_moe", bench_ms(lambda: fused_moe(x, w1, w2, topk_weights, topk_ids)), weight_bytes, flops)
        report("torch per-expert loop", bench_ms(torch_moe), weight_bytes, flops)
        report("dense GEMMs, one expert", bench_ms(dense_gemms), 3 * hidden * inter * w1.element_size(), flops)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit(
            "gpu_check: no CUDA device here; this script checks the Triton kernels on a GPU. "
            "On CPU run `python -m pytest tests/kernels` instead."
        )
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    check_correctness()
    bench_decode()
    bench_extend()
    bench_moe()


if __name__ == "__main__":
    main()
