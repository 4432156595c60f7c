// The float panels of the dense GEMM and their tile, shared by gemm.cpp (weight_packed_linear) and
// moe.cpp (fused_experts_cpu for experts packed this way), as sgl-kernel's gemm.h shares its tiles.
//
// convert_weight_packed lays W [N, K] out as [N / BLOCK_N][K][BLOCK_N]: panel j holds output columns
// BLOCK_N j .. BLOCK_N j + BLOCK_N - 1, and one k-step of it is two vector registers of float32
// (BLOCK_N = 32 with AVX-512, 16 with AVX2). The code is the same at both widths:
// at::vec::Vectorized<float> is one zmm register with AVX-512 and one ymm with AVX2.
#pragma once

#include <limits>

#include "common.h"

namespace minisgl {

using fVec = at::vec::Vectorized<float>;
constexpr int64_t VLEN = fVec::size();  // 16 floats with AVX-512, 8 with AVX2
constexpr int64_t BLOCK_N = 2 * VLEN;   // columns per panel: two registers
// Rows per tile: 2 x MAX_ROWS accumulators, 2 weight registers and 1 broadcast fit in the 32 zmm
// registers of AVX-512 (12 rows: 27) or the 16 ymm of AVX2 (6 rows: 15).
constexpr int MAX_ROWS = VLEN == 16 ? 12 : 6;
// A bf16 panel on AVX2 is widened in pairs: one load of a k-step's 16 columns, then the odd columns
// are the 32-bit lanes with their low half cleared (vpand) and the even ones the lanes shifted up 16
// (vpslld), so the accumulators hold the even and the odd columns, and the tile puts them back in
// order once, as it stores. Widening each half alone (vpmovzxwd + vpslld per 8 columns) is four
// shuffle-or-shift uops a k-step, where this is one shift and one and. On a Zen 3 EPYC the bf16 GEMM
// ran at 0.73 of float32's rate at 64 rows (88 against 121 GFLOP/s, bench_gguf_gemm.py), and this
// took 0.84 of its time there (0.88 at 256 rows, 0.96-0.99 at 1-16); likely the extra uops competed
// with the FMAs for the FP pipes (not checked with counters).
// AVX-512 keeps the halves (vpmovzxwd + vpslld): the reordering would need cross-lane permutes there,
// and no CPU with AVX-512 and without AVX512-BF16 was at hand to measure it on.
#if defined(CPU_CAPABILITY_AVX2)
template <typename w_t>
constexpr bool kPairedColumns = std::is_same_v<w_t, c10::BFloat16>;
#else
template <typename w_t>
constexpr bool kPairedColumns = false;
#endif

// One k-step of a panel (BLOCK_N weights) as two float32 registers: columns 0..VLEN-1 and VLEN..BLOCK_N-1,
// or the even and the odd ones where kPairedColumns. A 16-bit half is widened as it is loaded
// (vpmovzxwd + a shift for bf16, vcvtph2ps for fp16, both reading memory directly): loading the whole
// register and splitting it first cost an extra shuffle per k-step.
template <typename w_t>
inline std::pair<fVec, fVec> load_panel_row(const w_t* p) {
#if defined(CPU_CAPABILITY_AVX2)
  if constexpr (kPairedColumns<w_t>) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {fVec(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16))),
            fVec(_mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))))};
  }
#endif
  return {load_float(p), load_float(p + VLEN)};
}

// The even and odd columns of a paired panel back in order: columns 0..7 and 8..15.
inline std::pair<fVec, fVec> unpair_columns(Reg even, Reg odd) {
#if defined(CPU_CAPABILITY_AVX2)
  const __m256 lo = _mm256_unpacklo_ps(even, odd);  // columns 0-3 | 8-11
  const __m256 hi = _mm256_unpackhi_ps(even, odd);  // columns 4-7 | 12-15
  return {fVec(_mm256_permute2f128_ps(lo, hi, 0x20)), fVec(_mm256_permute2f128_ps(lo, hi, 0x31))};
#else
  return {fVec(even), fVec(odd)};
#endif
}

// C[ROWS, BLOCK_N] = A[ROWS, K] B[K, BLOCK_N] + bias. ROWS is a template parameter so the accumulators are
// registers. Meanwhile, unless `next` is null, k-step k prefetches the 128 bytes at `next` plus the k-step's
// own offset in the panel (gemm_panel says where `next` points). Kept out of line: inlined into gemm_rows,
// all heights at once, it measured about 5% slower.
template <int ROWS, typename w_t, typename out_t>
__attribute__((noinline)) void tile(const float* __restrict A, int64_t lda, const w_t* __restrict B, int64_t K,
                                    out_t* __restrict C, int64_t ldc, const out_t* __restrict bias, const char* next) {
  constexpr bool paired = kPairedColumns<w_t>;
  Reg c0[ROWS], c1[ROWS];
  const Reg b_lo = bias ? load_float(bias) : fVec(0.f);
  const Reg b_hi = bias ? load_float(bias + VLEN) : fVec(0.f);
#pragma GCC unroll 12
  for (int i = 0; i < ROWS; ++i) {  // a paired panel's bias is added once its columns are in order
    c0[i] = paired ? Reg(fVec(0.f)) : b_lo;
    c1[i] = paired ? Reg(fVec(0.f)) : b_hi;
  }
  for (int64_t k = 0; k < K; ++k) {
    const auto [b0, b1] = load_panel_row(B + k * BLOCK_N);
    if (next) {  // into L2 (T1): L1 is too small to hold it until its turn
      const char* line = next + k * static_cast<int64_t>(BLOCK_N * sizeof(w_t));
      _mm_prefetch(line, _MM_HINT_T1);
      _mm_prefetch(line + 64, _MM_HINT_T1);
    }
#pragma GCC unroll 12
    for (int i = 0; i < ROWS; ++i) {
      const fVec a(A[i * lda + k]);
      c0[i] = at::vec::fmadd(a, b0, fVec(c0[i]));
      c1[i] = at::vec::fmadd(a, b1, fVec(c1[i]));
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < ROWS; ++i) {
    if constexpr (paired) {
      const auto [lo, hi] = unpair_columns(c0[i], c1[i]);
      store_float2(C + i * ldc, lo + fVec(b_lo), hi + fVec(b_hi));
    } else {
      store_float2(C + i * ldc, fVec(c0[i]), fVec(c1[i]));
    }
  }
}

// Up to this many rows a panel prefetches the next one. One or two rows wait on the weights alone,
// and the prefetch hides the next panel's DRAM latency. With more, it depends on the CPU, so the
// number is chosen at run time by vendor. SmolLM2's 120 float32 GEMMs, weights from DRAM, with and
// without, alternated in one process:
// - on an AVX-512 AMD EPYC: 1 row 6-10% faster with it, 2 rows from 2% slower to 4% faster; without
//   it, 3 rows 8% faster, 4 rows 0-9%, 6 and 8 rows 9-20%, 12 rows 11%, 32 and 128 rows within 1%
//   (the likely reason, not checked with counters: the FMAs leave its hardware prefetcher time to
//   keep up on its own);
// - on a 2-core Intel Xeon with AMX (Emerald Rapids) it paid at every height: 3 rows 25.7 -> 19.9 ms,
//   4 rows 29.4 -> 20.3, 8 rows 38.1 -> 28.5, 16 rows 46.2 -> 36.6, 64 rows 83.7 -> 70.5, 256 rows
//   321 -> 298 (1 and 2 rows 18-20 either way), so on Intel CPUs every panel prefetches.
inline int64_t prefetch_rows() {
  static const int64_t rows = __builtin_cpu_is("intel") ? std::numeric_limits<int64_t>::max() : 2;
  return rows;
}

// C[rows, BLOCK_N] = A[rows, K] times one panel + bias, in tiles of nearly equal height (64 rows
// with AVX-512: 11, 11, 11, 11, 10, 10). With rows <= prefetch_rows(), the first tile prefetches:
// up to stream_rows rows, STREAM_PREFETCH_BYTES ahead of itself in the thread's run of consecutive
// panels (common.h; past the last panel too, as a prefetch never faults); with more, `next`, the
// panel to be multiplied after this one (none if null), so that it is in L2 once this one is done.
// The other tiles read this panel from L2, and a second prefetch of the same lines measured 1-10%
// slower on the Xeon above (32 rows: 51.0 against 46.4 ms).
//
// The dense GEMM streams every height (stream_rows = its chunk, gemm.cpp). On a 2-core Xeon with AMX
// (family 6 model 167), SmolLM2's 120 float32 layer GEMMs on huge pages, the two rules alternated in
// one process (three rounds, median of the paired ratios): the fixed distance took 0.95, 0.97, 0.95,
// 0.95, 0.96, 0.98, 0.98 and 0.97 of the time of prefetching the next panel at 6, 8, 12, 16, 32, 64,
// 128 and 256 rows. The experts' panels (moe.cpp) keep STREAM_ROWS: a block's gate and up panels lie
// far apart, and bench_moe's float32 layer measured the same within its noise either way.
template <typename w_t, typename out_t>
void gemm_panel(const float* A, int64_t lda, const w_t* panel, int64_t K, out_t* C, int64_t ldc, const out_t* bias,
                int64_t rows, const w_t* next, int64_t stream_rows = STREAM_ROWS) {
  const int64_t tiles = (rows + MAX_ROWS - 1) / MAX_ROWS;
  const char* ahead = nullptr;
  if (rows <= prefetch_rows()) {
    ahead = rows <= stream_rows ? reinterpret_cast<const char*>(panel) + STREAM_PREFETCH_BYTES
                                : reinterpret_cast<const char*>(next);
  }
  int64_t m = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t height = (rows - m + (tiles - t) - 1) / (tiles - t);
    const char* pf = t == 0 ? ahead : nullptr;
    with_rows<MAX_ROWS>(height, [&]<int R>() { tile<R>(A + m * lda, lda, panel, K, C + m * ldc, ldc, bias, pf); });
    m += height;
  }
}

}  // namespace minisgl
