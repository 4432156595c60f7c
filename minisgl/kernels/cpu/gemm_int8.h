// The AVX2 int8 tile and its activation quantization (gemm_int8.cpp, where the layout and the
// choice of vpmaddwd are explained), shared by the W8A8 GEMM and the fused MoE for W8A8 experts on
// CPUs without AVX512-VNNI (moe_int8.cpp), as gemm_int8_vnni.h shares the VNNI ones.
#pragma once

#include <cstring>

#include "common.h"

namespace minisgl {

constexpr int64_t QBLOCK_N = 16;  // columns per panel: two ymm registers of int32 sums
// 2 x 4 accumulators + 2 weight registers + 1 broadcast of 16 ymm. Six rows would fit in 15, but
// measured slower on a Zen 3 EPYC: the W8A8 op took 1.04-1.14 of the 4-row time at 16 to 256 rows
// (two builds alternated in one process), perhaps because _mm256_madd_epi16's products then have
// no register to land in before their add (the generated code was not inspected).
constexpr int QMAX_ROWS = 4;

// One row of x quantized to int16 (values in [-127, 127]), padded with a zero to an even length.
// Division, not a multiply by 1 / scale, and rounding ties to even: what torch.round(x / scale) does.
// A vector at a time (at::vec's round() is _mm*_round_ps to nearest even): element by element this
// took 150 us on 64 x 576 bfloat16 values, as long as the int8 GEMM after it.
template <typename scalar_t>
inline float quantize_row(const scalar_t* x, int64_t K, int16_t* q) {
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t W = Vec::size();
  Vec vmax(0.f);
  int64_t k = 0;
  for (; k + W <= K; k += W) vmax = at::vec::maximum(vmax, load_float(x + k).abs());
  float amax = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, vmax);
  for (; k < K; ++k) amax = std::max(amax, std::abs(static_cast<float>(x[k])));
  const float scale = std::max(amax, 1e-10f) / 127.f;
  const Vec vscale(scale), lo(-127.f), hi(127.f);
  float buf[W];
  for (k = 0; k + W <= K; k += W) {
    at::vec::clamp(load_float(x + k) / vscale, lo, hi).round().store(buf);
    for (int64_t i = 0; i < W; ++i) q[k + i] = static_cast<int16_t>(buf[i]);
  }
  for (; k < K; ++k) {
    q[k] = static_cast<int16_t>(std::clamp(std::nearbyint(static_cast<float>(x[k]) / scale), -127.f, 127.f));
  }
  if (K % 2) q[K] = 0;
  return scale;
}

// acc[r][c] = sum_k a[r][k] panel[c][k] for ROWS rows and the 16 columns of one panel. Unless `next`
// is null, the tile also requests the panel that comes after this one into L2 (next's line for every
// other k-pair, one 64-byte line per two k-pairs), so that it arrives while this one is multiplied.
template <int ROWS>
inline void tile(const int16_t* a, int64_t lda, const int8_t* panel, int64_t K2, int32_t (*acc)[QBLOCK_N],
                 const int8_t* next = nullptr) {
#if defined(__AVX2__)
  __m256i c0[ROWS], c1[ROWS];
  for (int r = 0; r < ROWS; ++r) c0[r] = c1[r] = _mm256_setzero_si256();
  for (int64_t kk = 0; kk < K2; ++kk) {
    const int8_t* w = panel + kk * 2 * QBLOCK_N;
    if (next && kk % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + kk * 2 * QBLOCK_N), _MM_HINT_T1);
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
    for (int r = 0; r < ROWS; ++r) {
      int32_t pair;  // a[r][2 kk] in the low half, a[r][2 kk + 1] in the high half
      std::memcpy(&pair, a + r * lda + 2 * kk, sizeof(pair));
      const __m256i b = _mm256_set1_epi32(pair);
      c0[r] = _mm256_add_epi32(c0[r], _mm256_madd_epi16(w0, b));
      c1[r] = _mm256_add_epi32(c1[r], _mm256_madd_epi16(w1, b));
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc[r]), c0[r]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc[r] + 8), c1[r]);
  }
#else  // a build without AVX2 (ATen's DEFAULT capability): the same sums, one at a time
  for (int r = 0; r < ROWS; ++r) {
    for (int64_t c = 0; c < QBLOCK_N; ++c) {
      int32_t s = 0;
      for (int64_t kk = 0; kk < K2; ++kk) {
        const int8_t* w = panel + kk * 2 * QBLOCK_N + 2 * c;
        s += int32_t(w[0]) * a[r * lda + 2 * kk] + int32_t(w[1]) * a[r * lda + 2 * kk + 1];
      }
      acc[r][c] = s;
    }
  }
#endif
}

}  // namespace minisgl
