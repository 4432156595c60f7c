"""One decode step's GEMMs at one row, weights on 4 KiB pages against the same weights on huge pages.

    python benchmarks/bench_huge_pages.py                 # float32 and bfloat16, 30 passes each
    python benchmarks/bench_huge_pages.py --passes 60

The weights are SmolLM2-135M's (30 layers of qkv_proj, o_proj, gate_up_proj and down_proj, and
the 49,152-row LM head), random, packed as the model packs them (pack_linear_weight: panels, or
the VNNI layout on a CPU with AVX512-BF16). Two copies are made: one left where torch allocated
it, one moved by minisgl/huge_pages.py::move_to_huge_pages, as ModelRunner.load_model moves a
CPU model's weights. One pass multiplies every weight once with weight_packed_linear, as a
batch-1 decode step does, so every byte comes from DRAM. The copies take turns, pass after pass,
so drift on a shared host falls on both; a row shows the median pass, and the last line the
ratio. The huge-page row says how much of its copy the kernel really backed with 2 MiB pages
(AnonHugePages): 0 where transparent huge pages are off.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from minisgl.huge_pages import move_to_huge_pages, smaps_rollup_bytes
from minisgl.kernels.cpu import is_available
from minisgl.layers.linear import pack_linear_weight

# (N, K) of SmolLM2-135M's GEMMs, once per layer, then the LM head.
LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LM_HEAD = (49152, 576)


def weights(dtype: torch.dtype) -> list[torch.Tensor]:
    shapes = LAYER * 30 + [LM_HEAD]
    return [pack_linear_weight((torch.randn(n, k) * 0.02).to(dtype)) for n, k in shapes]


def one_pass(ws: list[torch.Tensor], xs: dict[int, torch.Tensor]) -> float:
    start = time.perf_counter()
    for w in ws:
        k = w.shape[1] if w.dim() == 3 else w.shape[1] * w.shape[3]  # panels [N/B, K, B]; VNNI [N/32, K/2, 32, 2]
        torch.ops.minisgl_kernel.weight_packed_linear(xs[k], w, None)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=30)
    args = parser.parse_args()
    if not is_available():
        raise SystemExit("minisgl's CPU kernels are not built: python -m minisgl.kernels.cpu")
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} threads; one pass = every weight of SmolLM2-135M once, one row")
    for dtype in (torch.float32, torch.bfloat16):
        plain = weights(dtype)
        holder = nn.Module()
        holder.ws = weights(dtype)
        huge_before = smaps_rollup_bytes("AnonHugePages")
        moved = move_to_huge_pages(holder)
        backed = smaps_rollup_bytes("AnonHugePages") - huge_before
        xs = {k: torch.randn(1, k).to(dtype) for k in (576, 1536)}
        times = {"4 KiB pages": [], "huge pages": []}
        for i in range(args.passes + 3):
            for name in list(times) if i % 2 else list(times)[::-1]:
                t = one_pass(plain if name == "4 KiB pages" else holder.ws, xs)
                if i >= 3:  # the first passes warm up
                    times[name].append(t)
        nbytes = sum(w.nbytes for w in plain)
        print(f"== {str(dtype).removeprefix('torch.')}: {nbytes / 1e6:.0f} MB of weights")
        for name, ts in times.items():
            ms = statistics.median(ts) * 1e3
            note = f"  (2 MiB pages: {backed >> 20} MiB, for {moved >> 20} MiB moved)" if name == "huge pages" else ""
            print(f"   {name:<12} {ms:7.2f} ms  {nbytes / ms / 1e6:5.1f} GB/s{note}")
        ratio = statistics.median(times["4 KiB pages"]) / statistics.median(times["huge pages"])
        print(f"   4 KiB pages / huge pages: {ratio:.2f}x")
        del plain, holder


if __name__ == "__main__":
    main()
