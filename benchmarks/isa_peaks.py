"""How many multiply-adds a core retires per nanosecond with each AVX2 instruction the GEMMs use.

    python benchmarks/isa_peaks.py [--seconds 0.5] [--rounds 3]

The compute roof of each GEMM path on this CPU, in multiply-adds (MACs), measured: a tight loop of
one instruction sequence over 8 independent accumulators in registers, the data in registers too,
so that nothing but the instructions' throughput bounds it. The sequences are the inner steps of
the AVX2 tiles:

- ``f32 fma``: vfmadd231ps, 8 MACs; the float32 GEMM, and the bfloat16 one after widening.
- ``int16 madd``: vpmaddwd + vpaddd, 16 MACs; the W8A8-int8 tile on AVX2 (gemm_int8.h), whose
  int8 weights and activations are widened to int16 pairs.
- ``u8s8 maddubs``: vpsignb + vpmaddubsw + vpmaddwd by ones + vpaddd, 32 MACs; llama.cpp's exact
  AVX2 int8 dot product (|a| times w carrying a's sign, then the int16 pairs summed into int32).

It needs a C compiler (the one that builds minisgl's kernels) and AVX2 with FMA; it prints the
rates of one core and their ratios to ``f32 fma``. A ratio is the most an int8 GEMM can gain over
a float32 (or widened bfloat16) one where both are bound by arithmetic, as a batch of 64 decode
rows or a prefill is on two cores; weight bytes matter only where the GEMM waits on memory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from roofline import cpu_name

from minisgl.kernels.cpu.features import cpu_features

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Each loop body issues one sequence per accumulator; the empty asm makes the compiler treat the
   shared operand as changed, so that it cannot hoist the products out of the loop. */
#define RUN(name, macs, setup, body, fold)                                        \
  {                                                                               \
    setup;                                                                        \
    double t = now();                                                             \
    for (long i = 0; i < iters; ++i) {                                            \
      __asm__ volatile("" : "+x"(w));                                             \
      for (int j = 0; j < 8; ++j) { body; }                                       \
    }                                                                             \
    double dt = now() - t;                                                        \
    fold;                                                                         \
    printf("%s %.4f %d\n", name, (double)(macs) * 8 * iters / dt / 1e9, sink);    \
  }

int main(int argc, char** argv) {
  const long iters = atol(argv[1]);
  int sink = 0;
  RUN("f32 fma", 8, __m256 acc[8]; __m256 x[8]; __m256 w = _mm256_set1_ps(1.0001f);
      for (int j = 0; j < 8; ++j) { acc[j] = _mm256_setzero_ps(); x[j] = _mm256_set1_ps(0.5f + j); },
      acc[j] = _mm256_fmadd_ps(w, x[j], acc[j]),
      for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
      sink = (int)_mm256_cvtss_f32(acc[0]))
  RUN("int16 madd", 16, __m256i acc[8]; __m256i x[8]; __m256i w = _mm256_set1_epi16(3);
      for (int j = 0; j < 8; ++j) { acc[j] = _mm256_setzero_si256(); x[j] = _mm256_set1_epi16(j + 1); },
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(w, x[j])),
      for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_epi32(acc[0], acc[j]);
      sink = _mm256_extract_epi32(acc[0], 0))
  RUN("u8s8 maddubs", 32, __m256i acc[8]; __m256i x[8]; __m256i w = _mm256_set1_epi8(3);
      const __m256i ones = _mm256_set1_epi16(1);
      for (int j = 0; j < 8; ++j) { acc[j] = _mm256_setzero_si256(); x[j] = _mm256_set1_epi8(j - 4); },
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(x[j]),
                                                                              _mm256_sign_epi8(w, x[j])),
                                                          ones)),
      for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_epi32(acc[0], acc[j]);
      sink = _mm256_extract_epi32(acc[0], 0))
  return 0;
}
"""


def build(workdir: Path) -> Path:
    src, exe = workdir / "isa_peaks.c", workdir / "isa_peaks"
    src.write_text(SOURCE)
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    subprocess.run([cc, "-O3", "-funroll-loops", "-mavx2", "-mfma", str(src), "-o", str(exe)], check=True)
    return exe


def rates(exe: Path, iters: int) -> dict[str, float]:
    """MACs per ns of each sequence, over `iters` iterations of 8 sequences each."""
    out = subprocess.run([str(exe), str(iters)], check=True, capture_output=True, text=True).stdout
    return {" ".join(line.split()[:-2]): float(line.split()[-2]) for line in out.splitlines()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=0.5, help="about how long each sequence runs per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each row keeps its best")
    args = parser.parse_args()
    features = cpu_features()
    if not {"avx2", "fma"} <= features:
        sys.exit(f"needs AVX2 and FMA; this CPU has {sorted(features)}")

    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        probe = 1_000_000  # a few ms per sequence; then a loop count for --seconds of FMAs
        iters = max(probe, int(args.seconds * 1e9 * rates(exe, probe)["f32 fma"] / 64))
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, rate in rates(exe, iters).items():
                best[name] = max(best.get(name, 0.0), rate)
    print(f"{cpu_name()}, one core, features {', '.join(sorted(features))}; best of {args.rounds} rounds")
    print(f"{'sequence':>14} {'MACs/ns':>8} {'/ f32 fma':>10}")
    for name, rate in best.items():
        print(f"{name:>14} {rate:8.2f} {rate / best['f32 fma']:10.2f}")


if __name__ == "__main__":
    main()
