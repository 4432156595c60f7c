"""The C++ attention kernels alone, at SmolLM2-135M's shapes, against torch's SDPA on the same keys.

    python benchmarks/bench_attention.py                     # float32 and bfloat16
    python benchmarks/bench_attention.py --dtypes bfloat16 --rounds 50
    python benchmarks/bench_attention.py --dtypes float32 --kv-cache-dtype bfloat16 --requests 64 --layers 30
    python benchmarks/bench_attention.py --dtypes bfloat16 --kv-cache-dtype fp8_e5m2 --requests 64 --layers 30
    python benchmarks/bench_attention.py --dtypes bfloat16 --requests 64 --layers 30 --page-size 16

Extend: --requests prompts of --prompt-len new tokens each (no cached prefix), as a prefill chunk
of bench_offline's workload holds them, through extend_attention_cpu (which also stores their
K/V in the pool). Decode: --requests requests with --prompt-len cached tokens and one new query
each, through decode_attention_cpu. The slots of a request are a random permutation of the pool's,
as after many requests have come and gone, so no prefetcher is helped by a contiguous layout; with
--page-size P, of the pool's pages of P slots, so a request's keys are contiguous within each page.
The SDPA row is torch's scaled_dot_product_attention over the same keys already gathered into a
contiguous [heads, tokens, dim] tensor per request: the work without the paged pool's indirection
(the torch_native backend pays the gather besides). A row's time is its median call, for one
layer; GFLOP/s counts 4 * d FLOPs per visible (query, key) pair. With --layers N each kernel call
runs over N pools in turn, as a forward's layers do, and is divided by N: one layer's pool may
fit in the last-level cache and be read from there round after round, N = 30 of them do not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from minisgl.kernels.cpu import is_available
from minisgl.server_args import KV_CACHE_DTYPE_CHOICES, KV_CACHE_DTYPES

sys.path.insert(0, str(Path(__file__).parent))
from roofline import timings  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M


def median_seconds(fn, rounds: int) -> float:
    return statistics.median(timings(fn, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=KV_CACHE_DTYPE_CHOICES,
        help="the pool's dtype (auto: each row's own)",
    )
    parser.add_argument(
        "--layers", type=int, default=1, help="pools to call in turn, as a forward's layers: 30 keeps K/V out of cache"
    )
    parser.add_argument("--page-size", type=int, default=1, help="slots per page of the pool (SGLang's page_size)")
    args = parser.parse_args()
    assert is_available(), "the C++ kernels did not build"
    ops = torch.ops.minisgl_kernel
    b, n, d, group = args.requests, args.prompt_len, HEAD_DIM, HEADS // KV_HEADS
    print(
        f"{torch.get_num_threads()} threads; {b} requests x {n} tokens, {HEADS} heads, {KV_HEADS} KV heads of {d}; "
        f"KV pool dtype {args.kv_cache_dtype}"
    )
    print(f"  {'dtype':9s} {'kernel':26s} {'ms/layer':>9s} {'GFLOP/s':>8s}")
    for name in args.dtypes:
        dtype = getattr(torch, name)
        torch.manual_seed(0)
        per_request = -(-(n + 1) // args.page_size)  # pages a request holds
        pool = b * per_request * args.page_size + 1
        kv_dtype = dtype if args.kv_cache_dtype == "auto" else KV_CACHE_DTYPES[args.kv_cache_dtype]
        pools = [
            (torch.randn(pool, KV_HEADS, d).to(kv_dtype), torch.randn(pool, KV_HEADS, d).to(kv_dtype))
            for _ in range(args.layers)
        ]
        pages = torch.randperm(b * per_request).view(b, per_request, 1) * args.page_size
        slots = (1 + pages + torch.arange(args.page_size)).view(b, -1)[:, : n + 1]  # slot 0 stays the dummy
        req_to_token = slots.int().contiguous()
        q = torch.randn(b * n, HEADS, d).to(dtype)
        key, value = torch.randn(b * n, KV_HEADS, d).to(dtype), torch.randn(b * n, KV_HEADS, d).to(dtype)
        o = torch.empty_like(q)
        lens, rows = torch.full((b,), n), torch.arange(b)
        loc = slots[:, :n].reshape(-1).contiguous()

        def extend():
            for k_buf, v_buf in pools:
                ops.extend_attention_cpu(
                    q, o, k_buf, v_buf, key, value, loc, req_to_token, rows, lens, lens, rows * n, d**-0.5
                )

        qs = q.view(b, n, HEADS, d).transpose(1, 2)
        # The keys and values the kernel attends: as the pool holds them (rounded to its dtype).
        rounded = lambda t: t.to(kv_dtype).to(dtype)  # noqa: E731
        ks = rounded(key).view(b, n, KV_HEADS, d).transpose(1, 2).repeat_interleave(group, 1)
        vs = rounded(value).view(b, n, KV_HEADS, d).transpose(1, 2).repeat_interleave(group, 1)
        extend()
        ref = F.scaled_dot_product_attention(qs.float(), ks.float(), vs.float(), is_causal=True)
        err = (o.view(b, n, HEADS, d).transpose(1, 2).float() - ref).abs().max().item()
        pairs = b * HEADS * n * (n + 1) / 2
        per_layer = args.layers
        results = {
            "extend_attention_cpu": (median_seconds(extend, args.rounds) / per_layer, pairs),
            "extend, SDPA (gathered)": (
                median_seconds(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True), args.rounds),
                pairs,
            ),
        }
        q1, o1 = torch.randn(b, HEADS, d).to(dtype), torch.empty(b, HEADS, d, dtype=dtype)
        key1, value1 = torch.randn(b, KV_HEADS, d).to(dtype), torch.randn(b, KV_HEADS, d).to(dtype)
        loc1, lens1 = slots[:, n].contiguous(), torch.full((b,), n + 1)

        def decode():
            for k_buf, v_buf in pools:
                ops.decode_attention_cpu(q1, o1, k_buf, v_buf, key1, value1, loc1, req_to_token, rows, lens1, d**-0.5)

        results["decode_attention_cpu"] = (median_seconds(decode, args.rounds) / per_layer, b * HEADS * (n + 1))
        for kernel, (secs, pairs) in results.items():
            print(f"  {name:9s} {kernel:26s} {1e3 * secs:9.3f} {4 * d * pairs / secs / 1e9:8.1f}")
        print(f"  {name:9s} extend vs SDPA in float32: max |difference| {err:.1e}")


if __name__ == "__main__":
    main()
