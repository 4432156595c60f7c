// The bf16 tile of the VNNI GEMM, shared by the dense GEMM (gemm_vnni.cpp) and the fused MoE
// (moe.cpp), as sgl-kernel's gemm.h shares tinygemm_kernel and the block sizes with its moe.cpp.
//
// A weight packed for the matrix engines is [N / 32][K / 2][32][2]: per panel of 32 output columns,
// one k-pair of every column sits in 32 bits, which is what both engines read:
//   - AVX512-BF16: vdpbf16ps multiplies 16 such pairs by one broadcast pair of x and adds both
//     products into 16 float32 lanes (tile_dpbf16; sgl-kernel's tinygemm_kernel_nn);
//   - AMX: at::native::cpublas::brgemm hands a block of rows and a panel to oneDNN's brgemm
//     ukernel, which multiplies them with tile instructions into a float32 scratch (sgl-kernel's
//     brgemm<>). As in sgl-kernel, brgemm takes M > 4 rows for bf16 (below that, setting up the
//     tiles costs more than vdpbf16ps) and every M for fp16 (AMX-FP16 only); minisgl's own tile
//     loop, which has no such setup, takes 4 rows too (gemm_amx.h's AMX_TILES_MIN_ROWS).
#pragma once

#include <ATen/native/CPUBlas.h>

#include <cstring>

#include "common.h"

namespace minisgl {

constexpr int64_t VNNI_BLOCK_N = 32;  // columns per panel: two zmm registers of float32 results
constexpr int64_t VNNI_BLOCK_M = 32;  // rows per brgemm call (two AMX tiles of 16 rows)
// Rows per vdpbf16ps tile: 16 accumulators. sgl-kernel tiles 1-4 rows (8 accumulators); on an AVX-512
// AMD EPYC (Zen 5 flags) 8 rows took the 64-row GEMMs of SmolLM2's layers from about 600 to 850 GFLOP/s,
// since 8 chains of dependent vdpbf16ps leave the two pipes waiting on the instruction's latency.
constexpr int DPBF16_ROWS = 8;
// Up to this many rows a block of rows is one tile (24 accumulators, 27 of the 32 zmm registers), so a
// verify of 9-12 rows (an EAGLE tree of 10 nodes) reads each panel once, as 8 rows do, where 8 + the
// rest read it twice. On a 2-core Zen 4 EPYC, SmolLM2's 120 layer GEMMs and LM head from DRAM (huge
// pages), one tile against 8 + the rest alternated 7-9 times in one process, median of the paired ratios:
// 9 rows 0.83-0.92, 10 rows 0.86-0.89, 12 rows 0.84-0.89 (two prefetch rules, within 4% of each other).
// Above 12 rows the 8-row tiles stay: 12-row tiles everywhere took 1.02-1.07 of the time from 16 to
// 128 rows, where the GEMM is bound by vdpbf16ps rather than by memory.
constexpr int DPBF16_ONE_TILE_ROWS = 12;
// Whether a block of `rows` that is one tile (rows <= DPBF16_ONE_TILE_ROWS) prefetches the weights ahead of
// itself, chosen by vendor at run time as gemm.h's prefetch_rows() is for the FMA panels; a block of more rows
// than one tile takes prefetches the next panel (gemm_vnni.cpp).
// - On a 2-core Xeon with AMX (Emerald Rapids), SmolLM2's 30 layers from DRAM (bench_gguf_gemm.py),
//   prefetching the next panel: 1 row about level with the FMA panels with it (11.9 against 12.1 ms;
//   without, 12.0 against 9.6), and 3 and 4 rows 15.6 and 16.5 ms against 20.5 and 20.4 without; above 4 rows
//   that CPU uses its AMX tiles.
// - On a 2-core Zen 4 EPYC (no AMX), SmolLM2's 120 layer GEMMs and LM head, every tile of a multi-tile
//   block's first rows prefetching the next panel against none, alternated nine times in one process, took
//   this share of the time (median of the paired ratios): 12 rows 0.88 (two tiles then), 16 rows 0.86, 32
//   rows 0.93, 64 rows 0.95, 128 rows 0.99. With the weights on huge pages (huge_pages.py), the 120 layer
//   GEMMs of a bfloat16 engine's decode steps, timed inside it with a 4 KB prefetch switched per call by a
//   temporary environment variable, alternated 5-9 times in one process, took without it this share of the
//   time with it: 1 row 1.04; 2 rows 0.90 and 0.98, 3 rows 1.00, 4 rows 0.83, 0.92 and 0.99, 5 rows 0.96 and
//   0.96; 6 rows 1.06, 7 rows 1.07, 8 rows 1.04 and 1.04 (an EAGLE verify's rows), 10 rows 1.11. A scratch
//   loop over the same shapes on huge pages gave 1.05, 0.96 and 0.97 at 1, 2 and 4 rows, on 4 KiB pages
//   1.21, 1.06 and 1.01 (the likely reason, not checked with counters: on 4 KiB pages the hardware
//   prefetcher's stream stops at every page, and the software prefetch carries it over).
inline bool dpbf16_prefetch_ahead(int64_t rows) {
  static const bool intel = __builtin_cpu_is("intel");
  if (intel) return rows <= 4 || rows > DPBF16_ROWS;  // 5-8 rows: the Xeon's AMX tiles, not measured
  return rows == 1 || rows >= 6;
}

// 16 bf16 values widened to float32 (exact): a bias, as the accumulators' starting value.
MINISGL_AVX512_BF16 inline __m512 bf16_to_f32(const at::BFloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// Rows [0, ROWS) of A[ROWS, K] times one panel, by vdpbf16ps, starting from (init0, init1) in every row; then
// store(r, lo, hi) for each row with its 32 float32 results (columns 0-15 and 16-31). Every k-step loads one
// 32-bit pair of A per row (broadcast to all lanes) and the panel's 64 values for that pair. The store is
// inlined after the loop, so the accumulators stay in registers. Unless `next` is null, each k-step also
// prefetches the 128 bytes at `next` plus the k-step's own offset in the panel: the caller points `next` at
// the next panel, or STREAM_PREFETCH_BYTES past this one (gemm.h's tile prefetches too, and for the same
// reason: one or two rows wait on the weights alone).
template <int ROWS, typename Store>
MINISGL_AVX512_BF16 inline void tile_dpbf16(const at::BFloat16* A, int64_t lda, const at::BFloat16* panel, int64_t K,
                                            __m512 init0, __m512 init1, Store&& store, const char* next = nullptr) {
  __m512 c0[ROWS], c1[ROWS];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    c0[r] = init0;
    c1[r] = init1;
  }
  for (int64_t k2 = 0; k2 < K / 2; ++k2) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + k2 * 2 * VNNI_BLOCK_N);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + k2 * 2 * VNNI_BLOCK_N + VNNI_BLOCK_N);
    if (next) {  // into L2 (T1), 128 bytes: the k-pair's 64 values
      _mm_prefetch(next + k2 * 4 * VNNI_BLOCK_N, _MM_HINT_T1);
      _mm_prefetch(next + k2 * 4 * VNNI_BLOCK_N + 64, _MM_HINT_T1);
    }
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      int32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * k2, sizeof(pair));  // x[r, 2 k2] and x[r, 2 k2 + 1]
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      c0[r] = _mm512_dpbf16_ps(c0[r], a, w0);
      c1[r] = _mm512_dpbf16_ps(c1[r], a, w1);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) store(r, c0[r], c1[r]);
}

// scratch[r, 0:32] = rows [0, rows) of A times one panel, in float32, on whichever engine this CPU
// has for bf16 (brgemm with AMX from 5 rows, else vdpbf16ps): for callers with their own epilogue.
// rows <= VNNI_BLOCK_M; a thread that used brgemm calls at::native::cpublas::brgemm_release() when done.
MINISGL_AVX512_BF16 inline void panel_to_scratch(const at::BFloat16* A, int64_t lda, const at::BFloat16* panel,
                                                 int64_t rows, int64_t K, bool use_brgemm, float* scratch) {
  if (use_brgemm) {
    at::native::cpublas::brgemm(rows, VNNI_BLOCK_N, K, lda, VNNI_BLOCK_N, VNNI_BLOCK_N, /*add_C=*/false, A, panel,
                                scratch);
    return;
  }
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r0 = 0; r0 < rows; r0 += DPBF16_ROWS) {
    float* out = scratch + r0 * VNNI_BLOCK_N;
    with_rows<DPBF16_ROWS>(std::min<int64_t>(DPBF16_ROWS, rows - r0), [&]<int R>() MINISGL_AVX512_BF16 {
      tile_dpbf16<R>(A + r0 * lda, lda, panel, K, zero, zero, [&](int r, __m512 lo, __m512 hi) MINISGL_AVX512_BF16 {
        _mm512_storeu_ps(out + r * VNNI_BLOCK_N, lo);
        _mm512_storeu_ps(out + r * VNNI_BLOCK_N + 16, hi);
      });
    });
  }
}

}  // namespace minisgl
