"""One MoE layer's experts on CPU: what the engine runs against the loop over experts it replaced.

    python benchmarks/bench_moe.py                       # a Qwen3-MoE-shaped layer, scaled to fit a laptop
    python benchmarks/bench_moe.py --experts 128 --hidden 2048 --intermediate 768 --top-k 8   # Qwen3-30B-A3B's

UnquantizedFusedMoEMethod packs the experts once after loading, each stack whole: in the VNNI
layout for a bf16 layer where the CPU has vdpbf16ps (or AMX), else in float panels, and
fused_experts_cpu (kernels/cpu/moe.cpp) runs the layer in one C++ call. Where the sizes do not fit
its panels, each expert gets the layout a dense layer of its shape gets (layers/linear.py
pack_linear_weight) and fused_experts_native loops over the chosen experts in Python. This times,
alternated in one process:

- engine: UnquantizedFusedMoEMethod.apply, the fused kernel or the loop, whichever this CPU and dtype get;
- loop, packed: fused_experts_native over the same packed matrices (a stack's experts are each one's
  own layout), expert by expert;
- loop, oneDNN: the expert matrices left as loaded, through apply_linear (oneDNN re-derives its
  layout on every call) — what the engine ran before the experts were packed;
- loop, F.linear: ATen's own linear (MKL's sgemm in float32).

Then, for each --w8a8-dtype, the same layer quantized to W8A8-int8 (W8A8Int8MoEMethod): the
engine (fused_experts_int8_cpu) against the loop over experts through the int8 GEMM, on the same
packed int8 matrices, in the layout this CPU's int8 GEMM takes (k-quads for vpdpbusd with
AVX512-VNNI, else k-pairs for AVX2's vpmaddwd) or the one --w8a8-layout names, as on a CPU whose
best int8 engine that is.

With --gguf-type, the same layer's experts in GGUF blocks (GGUFMoEMethod, what a qwen3moe file
served with --quantization gguf holds): the loop over experts through fused_mul_mat_gguf, against
the float32 engine above on the same (unquantized) experts.

Each --tokens count routes that many tokens by random router logits (top --top-k of --experts),
so a decode batch touches few experts and a prefill chunk all of them. The weights are one layer's
(--experts x 3 x hidden x intermediate), small enough that a large L3 may hold much of them: this
measures the kernels on one layer, not a forward streaming many layers from DRAM.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from roofline import cpu_name, timings  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from torch import nn

from minisgl.kernels.cpu.features import cpu_features
from minisgl.layers.linear import apply_linear
from minisgl.layers.moe.fused_moe_native import fused_experts_native
from minisgl.layers.quantization import int8_kernel
from minisgl.layers.quantization.gguf import GGUFMoEMethod
from minisgl.layers.quantization.int8_kernel import int8_scaled_mm_with_quant
from minisgl.layers.quantization.unquant import UnquantizedFusedMoEMethod
from minisgl.layers.quantization.w8a8_int8 import W8A8Int8Config, W8A8Int8MoEMethod


def make_layer(experts: int, hidden: int, inter: int, dtype: torch.dtype, method=None) -> tuple[nn.Module, list, list]:
    """The engine's packed layer (UnquantizedFusedMoEMethod's, or ``method``'s), and the same
    experts' plain matrices."""
    layer, method = nn.Module(), method or UnquantizedFusedMoEMethod()
    method.create_weights(layer, experts, hidden, inter, dtype, weight_loader=None)
    layer.w13_weight.data.copy_(torch.randn(experts, 2 * inter, hidden) * hidden**-0.5)
    layer.w2_weight.data.copy_(torch.randn(experts, hidden, inter) * inter**-0.5)
    plain = (list(layer.w13_weight.data.clone()), list(layer.w2_weight.data.clone()))
    method.process_weights_after_loading(layer)
    return layer, *plain


def median_ms(runs: dict, reps: int) -> dict[str, float]:
    """Each run's median time in ms, the runs alternated so that a slow phase of the host hits all."""
    ms = {k: [] for k in runs}
    for _ in range(3):
        for k, fn in runs.items():
            ms[k] += [t * 1e3 for t in timings(fn, reps)]
    return {k: statistics.median(v) for k, v in ms.items()}


def routed(tokens: int, args, dtype: torch.dtype):
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, args.hidden, generator=g).to(dtype)
    return x, *torch.randn(tokens, args.experts, generator=g).softmax(-1).topk(args.top_k, dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--dtype", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--w8a8-dtype", nargs="*", default=["bfloat16"], help="activation dtypes of a W8A8 layer")
    parser.add_argument("--w8a8-layout", choices=["avx2", "avx512_vnni"], help="default: this CPU's int8 engine")
    parser.add_argument("--gguf-type", nargs="*", default=[], choices=["Q8_0", "Q4_0", "Q4_1"], help="GGUF experts")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    if args.w8a8_layout:  # what pack_int8_weight asks, answered as on a CPU whose best int8 engine this is
        int8_kernel.int8_gemm_engine = lambda: args.w8a8_layout
    print(f"CPU: {cpu_name()}; features: {', '.join(sorted(cpu_features()))}; {torch.get_num_threads()} threads")
    print(f"{args.experts} experts, top {args.top_k}, hidden {args.hidden}, intermediate {args.intermediate}")
    print(
        "dtype    | tokens | engine   | engine ms | loop packed ms | loop oneDNN ms | loop F.linear ms | "
        "loop packed/engine | oneDNN/engine | F.linear/engine"
    )
    for name in args.dtype:
        dtype = getattr(torch, name)
        layer, w13, w2 = make_layer(args.experts, args.hidden, args.intermediate, dtype)
        method, fused = UnquantizedFusedMoEMethod(), isinstance(layer.w13_packed, torch.Tensor)
        packed = (list(layer.w13_packed), list(layer.w2_packed))  # a stack's experts are each one's layout
        for tokens in args.tokens:
            x, weights, ids = routed(tokens, args, dtype)
            best = median_ms(
                {
                    "engine": lambda: method.apply(layer, x, weights, ids),
                    "packed": lambda: fused_experts_native(x, *packed, weights, ids, apply_linear),
                    "onednn": lambda: fused_experts_native(x, w13, w2, weights, ids, apply_linear),
                    "linear": lambda: fused_experts_native(x, w13, w2, weights, ids, F.linear),
                },
                args.reps,
            )
            print(
                f"{name:8} | {tokens:6} | {'fused' if fused else 'loop':8} | {best['engine']:9.3f} | "
                f"{best['packed']:14.3f} | {best['onednn']:14.3f} | {best['linear']:16.3f} | "
                f"{best['packed'] / best['engine']:17.2f}x | {best['onednn'] / best['engine']:12.2f}x | "
                f"{best['linear'] / best['engine']:14.2f}x"
            )
    # W8A8: the engine's method (fused_experts_int8_cpu) against its loop over experts through the
    # int8 GEMM, on the same quantized experts.
    if args.w8a8_dtype:
        print(f"\nW8A8-int8, {int8_kernel.int8_gemm_engine()} layout")
        print("W8A8-int8 | tokens | engine | engine ms | loop int8 ms | loop/engine")
    for name in args.w8a8_dtype:
        dtype, method = getattr(torch, name), W8A8Int8MoEMethod(W8A8Int8Config(is_checkpoint_int8_serialized=False))
        layer = make_layer(args.experts, args.hidden, args.intermediate, dtype, method)[0]
        fused = isinstance(layer.w13_int8, tuple)
        experts = [
            list(zip(*getattr(layer, f"{n}_int8"))) if fused else getattr(layer, f"{n}_int8") for n in ("w13", "w2")
        ]
        for tokens in args.tokens:
            x, weights, ids = routed(tokens, args, dtype)
            best = median_ms(
                {
                    "engine": lambda: method.apply(layer, x, weights, ids),
                    "loop": lambda: fused_experts_native(x, *experts, weights, ids, int8_expert),
                },
                args.reps,
            )
            print(
                f"{name:9} | {tokens:6} | {'fused' if fused else 'loop':6} | {best['engine']:9.3f} | "
                f"{best['loop']:12.3f} | {best['loop'] / best['engine']:10.2f}x"
            )
    if args.gguf_type:
        print("\nGGUF experts, float32 activations | tokens | loop over experts ms | float32 engine ms | loop/engine")
        float_layer, w13, w2 = make_layer(args.experts, args.hidden, args.intermediate, torch.float32)
    for name in args.gguf_type:
        layer = gguf_layer(w13, w2, GGMLQuantizationType[name], args.hidden, args.intermediate)
        for tokens in args.tokens:
            x, weights, ids = routed(tokens, args, torch.float32)
            best = median_ms(
                {
                    "gguf": lambda: layer.quant_method.apply(layer, x, weights, ids),
                    "float": lambda: UnquantizedFusedMoEMethod().apply(float_layer, x, weights, ids),
                },
                args.reps,
            )
            ratio = best["gguf"] / best["float"]
            print(f"{name:33} | {tokens:6} | {best['gguf']:20.3f} | {best['float']:17.3f} | {ratio:10.2f}x")


def gguf_layer(w13: list, w2: list, weight_type, hidden: int, inter: int) -> nn.Module:
    """The experts quantized to weight_type's blocks (gguf-py's quantize, llama.cpp's rounding) and
    loaded as a qwen3moe file's are: a type id, then each expert's blocks."""
    layer, method = nn.Module(), GGUFMoEMethod(None)
    layer.quant_method = method
    method.create_weights(layer, len(w13), hidden, inter, torch.float32, weight_loader=None)
    for name, experts in (("w13", w13), ("w2", w2)):
        qweight, qweight_type = getattr(layer, f"{name}_qweight"), getattr(layer, f"{name}_qweight_type")
        qweight_type.weight_loader(qweight_type, torch.tensor(int(weight_type)))
        for e, w in enumerate(experts):
            qweight.data[e].copy_(torch.from_numpy(quantize(w.float().numpy(), weight_type)))
    method.process_weights_after_loading(layer)
    return layer


def int8_expert(h: torch.Tensor, expert: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return int8_scaled_mm_with_quant(h, *expert)


if __name__ == "__main__":
    main()
