// The AVX512-VNNI int8 tile, its activation quantization and its epilogue, shared by the W8A8 GEMM
// (gemm_int8_vnni.cpp, where the layout and the +128 shift are explained) and the fused MoE for
// W8A8 experts (moe_int8.cpp), as sgl-kernel's gemm.h shares its int8 tinygemm with its moe_int8.cpp.
#pragma once

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstring>

#include "common.h"

namespace minisgl {

constexpr int64_t INT8_PANEL_N = 16;   // columns per panel: one zmm of int32 sums
constexpr int64_t INT8_ROW_BYTES = 64;  // one k-quad of a panel
constexpr int INT8_TILE_ROWS = 8;       // 8 rows x 2 panels = 16 zmm accumulators, of 32
constexpr int64_t INT8_PREFETCH_ROWS = 4;  // tiles this short prefetch the next pair anywhere in a unit

#define MINISGL_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

// 16 values of a row as float32 (bf16 and fp16 widen exactly); lanes outside `mask` read nothing and are 0.
template <typename scalar_t>
MINISGL_AVX512_VNNI inline __m512 load16(const scalar_t* x, __mmask16 mask) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return _mm512_maskz_loadu_ps(mask, x);
  } else if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, x));
    return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, x));
  }
}

// Activations, quantized per row as gemm_int8.cpp's quantize_row does, 16 values at a time: the same
// scale, the same IEEE division and ties-to-even rounding of x / scale (what torch.round does), so the
// same integers; stored as q + 128 and padded with 128 (a zero) to K4 * 4. Scalar, this took as long
// as the GEMM itself at 64 rows.
template <typename scalar_t>
MINISGL_AVX512_VNNI float quantize_row_u8(const scalar_t* x, int64_t K, int64_t K4, uint8_t* q) {
  const auto mask_at = [K](int64_t k) { return K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1); };
  __m512 amax = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load16(x + k, mask_at(k))));
  const float scale = std::max(_mm512_reduce_max_ps(amax), 1e-10f) / 127.f;
  const __m512 vscale = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(load16(x + k, mask_at(k)), vscale),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi)),
                                       _mm512_set1_epi32(128));
    _mm512_mask_cvtepi32_storeu_epi8(q + k, mask_at(k), v);
  }
  std::memset(q + K, 128, K4 * 4 - K);
  return scale;
}

// sums[r][0:16 * PANELS] = sum_k a[r][k] w[c][k] (with the +128 shift) for ROWS rows against PANELS
// (1 or 2) consecutive panels, panel_bytes apart. Two 1-D arrays of accumulators, fully unrolled,
// and nothing else live: with a 2-D array, or with the epilogue in the same function, GCC copied
// every accumulator to another register and back on each k-step, two instructions per vpdpbusd.
// Unless `next` is null, each k-step also prefetches the same k-quad of the PANELS panels that
// start at `next` (the next pair), as the bf16 tile does (gemm_vnni.h): a tile of few rows, or the
// first block of many, waits on the weights alone.
template <int ROWS, int PANELS>
MINISGL_AVX512_VNNI void tile_int8(const uint8_t* a, int64_t lda, const int8_t* panel, int64_t panel_bytes,
                                   int64_t K4, int32_t* sums, const int8_t* next = nullptr) {
  static_assert(PANELS == 1 || PANELS == 2);
  __m512i c0[ROWS], c1[ROWS];
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) c0[r] = c1[r] = _mm512_setzero_si512();
  const int8_t* panel1 = panel + (PANELS == 2 ? panel_bytes : 0);
  for (int64_t k4 = 0; k4 < K4; ++k4) {
    const __m512i w0 = _mm512_loadu_si512(panel + k4 * INT8_ROW_BYTES);
    const __m512i w1 = PANELS == 2 ? _mm512_loadu_si512(panel1 + k4 * INT8_ROW_BYTES) : w0;
    if (next) {  // into L2 (T1)
      _mm_prefetch(reinterpret_cast<const char*>(next + k4 * INT8_ROW_BYTES), _MM_HINT_T1);
      if constexpr (PANELS == 2) {
        _mm_prefetch(reinterpret_cast<const char*>(next + panel_bytes + k4 * INT8_ROW_BYTES), _MM_HINT_T1);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      int32_t quad;  // a[r][4 k4 .. 4 k4 + 3]
      std::memcpy(&quad, a + r * lda + 4 * k4, sizeof(quad));
      const __m512i b = _mm512_set1_epi32(quad);
      c0[r] = _mm512_dpbusd_epi32(c0[r], b, w0);
      if constexpr (PANELS == 2) c1[r] = _mm512_dpbusd_epi32(c1[r], b, w1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) {
    _mm512_storeu_si512(sums + r * 2 * INT8_PANEL_N, c0[r]);
    _mm512_storeu_si512(sums + r * 2 * INT8_PANEL_N + INT8_PANEL_N, c1[r]);
  }
}

constexpr int64_t INT8_BRGEMM_ROWS = 32;  // rows per brgemm call (two AMX tiles of 16 rows)

// sums[r][0:16 * panels] (rows 32 int32 apart) = rows [0, rows) of a against `panels` (1 or 2)
// consecutive panels, panel_bytes apart: exact int32 sums, the +128 shift still in. With `brgemm`,
// at::native::cpublas::brgemm takes each panel whole in one call (u8 x s8 -> s32, which AMX-int8's
// tdpbusd computes; a panel's K / 4 rows of 16 columns by 4 bytes are the VNNI layout it reads), rows
// <= INT8_BRGEMM_ROWS, and the calling thread releases the tiles when done; else vpdpbusd tiles of 8,
// which prefetch `next`, the following pair, unless it is null (the caller decides: gemm_chunk).
MINISGL_AVX512_VNNI inline void sums_int8(const uint8_t* a, int64_t lda, const int8_t* panel, int64_t panel_bytes,
                                          int64_t K4, int64_t rows, int64_t panels, bool brgemm, int32_t* sums,
                                          const int8_t* next = nullptr) {
  if (brgemm) {
    for (int64_t j = 0; j < panels; ++j) {
      at::native::cpublas::brgemm(rows, INT8_PANEL_N, K4 * 4, lda, INT8_PANEL_N, 2 * INT8_PANEL_N, /*add_C=*/false, a,
                                  panel + j * panel_bytes, sums + j * INT8_PANEL_N);
    }
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += INT8_TILE_ROWS) {
    with_rows<INT8_TILE_ROWS>(std::min<int64_t>(INT8_TILE_ROWS, rows - r0), [&]<int R>() MINISGL_AVX512_VNNI {
      int32_t* out = sums + r0 * 2 * INT8_PANEL_N;
      panels == 2 ? tile_int8<R, 2>(a + r0 * lda, lda, panel, panel_bytes, K4, out, next)
                  : tile_int8<R, 1>(a + r0 * lda, lda, panel, panel_bytes, K4, out, next);
    });
  }
}

// out[r][c] = float(sums[r][c] - comp[c]) * a_scale[r] * w_scale[c] + bias[c] for one panel's `cols`
// real columns of 16 (comp sits after the panel's K4 rows); the integer subtraction first, so it is
// exact. The scales and the bias are read in place, masked to the real columns.
template <typename scalar_t>
MINISGL_AVX512_VNNI void epilogue_int8(const int32_t* sums, int64_t rows, const int8_t* comp_row,
                                       const float* a_scale, const float* w_scale, const scalar_t* bias, int64_t cols,
                                       float* out) {
  const __mmask16 mask = cols >= INT8_PANEL_N ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __m512i comp = _mm512_loadu_si512(comp_row);
  const __m512 ws = _mm512_maskz_loadu_ps(mask, w_scale), b = bias ? load16(bias, mask) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(sums + r * 2 * INT8_PANEL_N), comp));
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(s, _mm512_set1_ps(a_scale[r])), ws);
    _mm512_storeu_ps(out + r * 2 * INT8_PANEL_N, _mm512_add_ps(y, b));
  }
}

}  // namespace minisgl
