"""The roofline of this CPU for SmolLM2-135M: what memory and GEMMs allow, measured here.

    python benchmarks/roofline.py [--dtype float32|bfloat16] [--context 200]

Measures the machine (read bandwidth from DRAM and from a cache-sized buffer; the peak GEMM
rate on the model's layer shapes), then prints the floor of a decode step at a few batch sizes
and of a 2,048-token prefill chunk: the larger of "FLOPs at the peak rate" and "bytes at DRAM
bandwidth" (the weights, plus the KV a decode step reads). Beside it, the time the same GEMMs
take when, as in a real step, all 30 layers' weights are streamed from memory: through
apply_linear's path (minisgl's packed GEMM where it was built) and through oneDNN on float32
weights, the path before it. Compare them with the step times benchmarks/profile_step.py prints.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch

from minisgl.layers.linear import pack_linear_weight

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 30, 9, 3, 64, 49152
SHAPES = [((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), (HIDDEN, HEADS * HEAD_DIM), (2 * INTER, HIDDEN), (HIDDEN, INTER)]


def timings(fn, reps: int = 5) -> list[float]:
    """Seconds of each of reps calls of fn, after one untimed call that warms caches and kernels."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def best_of(fn, reps: int = 5) -> float:
    return min(timings(fn, reps))


def cpu_name() -> str:
    """The CPU's model name, as lscpu prints it (from /proc/cpuinfo)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def read_bandwidth(nbytes: int) -> float:
    x = torch.ones(nbytes // 4)
    return nbytes / best_of(lambda: x.sum())


def onednn_float32(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked layout in float32: the path minisgl's GEMM is compared with."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.float(), 64)


def gemm_rate(dtype: torch.dtype, m: int, layers: int, lm_head: bool, pack=pack_linear_weight) -> float:
    """FLOP/s of one forward's dense layers at batch m, through apply_linear with weights packed by
    `pack`, with `layers` distinct copies of the weights: 1 keeps them in cache, LAYERS streams
    them from memory as a real step does. A decode step also runs the LM head."""
    from minisgl.layers.linear import apply_linear

    weights = [[pack(torch.randn(n, k).to(dtype)) for n, k in SHAPES] for _ in range(layers)]
    head = pack(torch.randn(VOCAB, HIDDEN).to(dtype))
    xs = {k: torch.randn(m, k).to(dtype) for k in (HIDDEN, INTER, HEADS * HEAD_DIM)}

    def step():
        for i in range(LAYERS):
            for w, (n, k) in zip(weights[i % layers], SHAPES):
                apply_linear(xs[k], w)
        if lm_head:
            apply_linear(xs[HIDDEN], head)

    flops = 2 * m * (LAYERS * sum(n * k for n, k in SHAPES) + (VOCAB * HIDDEN if lm_head else 0))
    return flops / best_of(step, reps=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--context", type=int, default=200, help="tokens of KV each decoding request reads")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    elt = torch.finfo(dtype).bits // 8
    print(f"{args.dtype}, {torch.get_num_threads()} threads, ATen ISA {torch.backends.cpu.get_cpu_capability()}")

    dram, cache = read_bandwidth(1 << 30), read_bandwidth(32 << 20)
    print(f"read bandwidth: {dram / 1e9:.1f} GB/s from a 1 GiB buffer, {cache / 1e9:.1f} GB/s from 32 MiB")

    weight_bytes = (LAYERS * sum(n * k for n, k in SHAPES) + VOCAB * HIDDEN) * pack_linear_weight(
        torch.zeros(2 * INTER, HIDDEN).to(dtype)
    ).element_size()  # 2 bytes where bf16 weights stay bf16
    kv_bytes_per_token = LAYERS * 2 * KV_HEADS * HEAD_DIM * elt
    print(
        f"weights streamed per forward: {weight_bytes / 1e6:.0f} MB (as apply_linear stores them); "
        f"KV per token: {kv_bytes_per_token / 1e3:.1f} KB"
    )

    # A prefill chunk's GEMMs, weights in cache: the best rate here, whichever path reaches it.
    peak = max(gemm_rate(dtype, 2048, 1, lm_head=False, pack=p) for p in (pack_linear_weight, onednn_float32))
    print(f"peak GEMM rate: {peak / 1e9:.0f} GFLOP/s (a 2,048-token chunk's dense layers, weights in cache)")
    print(
        f"\n{'forward':26s} {'compute':>8s} {'memory':>8s} {'floor':>8s}   "
        f"{'GEMMs as run (weights streamed)':>32s} {'same on oneDNN float32':>26s}"
    )
    for m in (1, 8, 32, 64, 2048):
        decode = m <= 64  # decode: m requests, one token each; else a prefill chunk of m tokens
        flops = 2 * m * (LAYERS * sum(n * k for n, k in SHAPES) + (VOCAB * HIDDEN if decode else 0))
        compute_s = flops / peak
        memory_s = (weight_bytes + (m * args.context * kv_bytes_per_token if decode else 0)) / dram
        name = f"decode, batch {m}" if decode else f"prefill chunk, {m} tokens"
        measured = ["", ""]
        if decode:
            for i, pack in enumerate((pack_linear_weight, onednn_float32)):
                cold = gemm_rate(dtype, m, LAYERS, lm_head=True, pack=pack)
                measured[i] = f"{1e3 * flops / cold:7.1f} ms ({cold / 1e9:.0f} GFLOP/s)"
        print(
            f"{name:26s} {1e3 * compute_s:6.1f}ms {1e3 * memory_s:6.1f}ms {1e3 * max(compute_s, memory_s):6.1f}ms"
            f"   {measured[0]:>32s} {measured[1]:>26s}"
        )
    print("\nfloor = max(FLOPs at the peak GEMM rate, weights + KV at DRAM bandwidth). The last two columns")
    print("time the same forward's GEMMs with every layer's weights distinct, streamed from memory as in a")
    print("real decode step, through apply_linear's path and through oneDNN: how well each overlaps the")
    print("weight stream with its FMAs, not the floor, bounds a step.")


if __name__ == "__main__":
    main()
