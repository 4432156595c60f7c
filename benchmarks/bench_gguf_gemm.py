"""The two GGUF GEMMs alone against the float32, bfloat16 and W8A8-int8 GEMMs, in one run.

    python benchmarks/bench_gguf_gemm.py                       # M = 1, 4, 16, 64; Q4_1 and Q8_0
    python benchmarks/bench_gguf_gemm.py --m 1,64 --types Q4_1 --layers 1    # weights in cache

The shapes are SmolLM2-135M's linear layers (qkv_proj, o_proj, gate_up_proj, down_proj), with a
random weight quantized by the `gguf` package as llama.cpp would, and copied into --layers
layers (30, the model's): one pass multiplies every layer's four weights in turn, as a forward
does, so the weights come from memory, not from a cache that holds one layer. With --layers 1
they stay in cache and only the arithmetic is compared. For each batch size M the GEMMs take
turns, pass after pass, so drift on a shared machine spreads over all of them; a row's time is its
median pass. The float rows are what the float32 and bfloat16 models use (weight_packed_linear on
weights packed by convert_weight_packed, gemm.cpp); where the CPU has AVX512-BF16, a "bf16 vnni"
row multiplies the VNNI-packed weight the bfloat16 model then uses instead (vdpbf16ps,
gemm_vnni.cpp). The "int8" rows are W8A8-int8 with bfloat16 activations, as
--quantization w8a8_int8 runs in a bfloat16 model: "int8 avx2" on k-pairs with vpmaddwd
(gemm_int8.cpp), and where the CPU has AVX512-VNNI "int8 vnni" on k-quads with vpdpbusd
(gemm_int8_vnni.cpp), the one such a CPU uses. The "brgemm" rows multiply the same VNNI weights
with MINISGL_BRGEMM=1, blocks over 4 rows through oneDNN's brgemm (AMX tiles on an AMX CPU, oneDNN's
AVX-512 code elsewhere), the "vnni" rows with MINISGL_BRGEMM=0, on minisgl's register tiles
(vdpbf16ps, vpdpbusd) whatever the CPU, and where the CPU has AMX the "amx" rows with it unset,
blocks over 4 rows on minisgl's own AMX tile loop (gemm_amx.h): the engines side by side, on the
same weights. Each block type has two rows: "gguf Q4_1" is
the weight-only GEMM with float activations (gguf_mul_mat, gemm_gguf.cpp), "Q4_1 a8" the integer
one that rounds the activations to int8 per block (gguf_mul_mat_vec_a8, gemm_gguf_vec.cpp);
layers/quantization/gguf_kernel.py takes the second up to MMVQ_MAX_ROWS rows. The last column is
float32 time / this row's time (above 1: faster than float32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from minisgl.kernels.cpu import is_available
from minisgl.kernels.cpu.features import cpu_features, gguf_gemm_uses_avx2
from minisgl.layers.quantization.int8_kernel import int8_scaled_mm_with_quant, pack_int8_weight, quantize_weight_int8

# (N, K) of SmolLM2-135M: hidden 576, 9 query and 3 key/value heads of 64, intermediate 1536.
SHAPES = {"qkv_proj": (960, 576), "o_proj": (576, 576), "gate_up_proj": (3072, 576), "down_proj": (576, 1536)}


def layer_gemms(layers: int, types: list[str]) -> dict[str, list]:
    """kind -> [(K, fn on x [M, K])] over every layer's shapes: `layers` copies of one random weight each."""
    ops = torch.ops.minisgl_kernel
    kinds: dict[str, list] = {"float32": [], "bfloat16": []}
    engines = {"bf16 vnni": "avx512_bf16", "int8 avx2": None, "int8 vnni": "avx512_vnni"}
    engines.update({"bf16 brgemm": "avx512_bf16", "int8 brgemm": "avx512_vnni"})
    engines.update({"bf16 amx": "amx_bf16", "int8 amx": "amx_int8"})
    engines = {kind: feature for kind, feature in engines.items() if feature is None or feature in cpu_features()}
    kinds.update({kind: [] for kind in engines})
    for t in types:
        kinds[f"gguf {t}"], kinds[f"{t} a8"] = [], []
    for n, k in SHAPES.values():
        w = torch.from_numpy(np.random.default_rng(n * k).standard_normal((n, k)).astype(np.float32) * 0.02)
        packed32, packed16 = ops.convert_weight_packed(w), ops.convert_weight_packed(w.bfloat16())
        quantized = {t: torch.from_numpy(quantize(w.numpy(), GGMLQuantizationType[t])) for t in types}
        w_q, w_scale = quantize_weight_int8(w)
        for _ in range(layers):  # copies: each layer's weights in memory of its own
            p32, p16 = packed32.clone(), packed16.clone()
            kinds["float32"].append((k, lambda x, p=p32: ops.weight_packed_linear(x, p, None)))
            kinds["bfloat16"].append((k, lambda x, p=p16: ops.weight_packed_linear(x.bfloat16(), p, None)))
            if "bf16 vnni" in engines:
                pv = ops.convert_weight_packed_vnni(w.bfloat16())
                for kind in ("bf16 vnni", "bf16 brgemm", "bf16 amx"):
                    if kind in engines:
                        kinds[kind].append((k, lambda x, p=pv: ops.weight_packed_linear(x.bfloat16(), p, None)))
            for kind in ("int8 avx2", "int8 vnni", "int8 brgemm", "int8 amx"):
                if kind in engines:
                    pq = pack_int8_weight(w_q, "avx2" if kind == "int8 avx2" else "avx512_vnni")
                    kinds[kind].append(
                        (k, lambda x, p=pq, s=w_scale: int8_scaled_mm_with_quant(x.bfloat16(), p, s, None))
                    )
            for t, q in quantized.items():
                qc, wt, avx2 = q.clone(), int(GGMLQuantizationType[t]), gguf_gemm_uses_avx2()
                kinds[f"gguf {t}"].append((k, lambda x, q=qc, wt=wt: ops.gguf_mul_mat(x, q, wt, None, avx2)))
                kinds[f"{t} a8"].append((k, lambda x, q=qc, wt=wt: ops.gguf_mul_mat_vec_a8(x, q, wt, None, avx2)))
    return kinds


def measure(m: int, kinds: dict[str, list], rounds: int) -> dict[str, float]:
    """Median seconds of one pass over all the layers, per kind, at batch size m."""
    x = {k: torch.randn(m, k) for _, k in SHAPES.values()}
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(rounds + 1):  # round 0 warms up
        for kind, gemms in kinds.items():
            # read by every call: 1 for brgemm, unset for the AMX tile loop, 0 (register tiles) otherwise
            if kind.endswith("amx"):
                os.environ.pop("MINISGL_BRGEMM", None)
            else:
                os.environ["MINISGL_BRGEMM"] = "1" if kind.endswith("brgemm") else "0"
            start = time.perf_counter()
            for k, fn in gemms:
                fn(x[k])
            if r:
                samples[kind].append(time.perf_counter() - start)
    os.environ.pop("MINISGL_BRGEMM", None)
    return {kind: statistics.median(times) for kind, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", default="1,4,16,64", help="batch sizes, comma-separated")
    parser.add_argument("--types", default="Q4_1,Q8_0", help="GGUF block types, comma-separated")
    parser.add_argument("--layers", type=int, default=30, help="copies of each weight (SmolLM2-135M has 30 layers)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if not is_available():
        raise SystemExit("the CPU kernels did not build here: nothing to measure")
    kinds = layer_gemms(args.layers, args.types.split(","))
    features = ", ".join(sorted(cpu_features()))
    print(f"threads {torch.get_num_threads()}, CPU features {features}, GGUF AVX2 path {gguf_gemm_uses_avx2()}")
    print(f"{args.layers} layers")
    print(f"{'M':>4} {'GEMM':>11} {'ms/pass':>9} {'GFLOP/s':>8} {'float32/this':>13}")
    for m in (int(v) for v in args.m.split(",")):
        rows = measure(m, kinds, args.rounds)
        flops = args.layers * sum(2 * m * n * k for n, k in SHAPES.values())
        for kind, seconds in rows.items():
            ratio = rows["float32"] / seconds
            print(f"{m:>4} {kind:>11} {seconds * 1e3:>9.2f} {flops / seconds / 1e9:>8.2f} {ratio:>13.2f}")


if __name__ == "__main__":
    main()
