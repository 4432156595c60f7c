// The one-row Q4_0 / Q4_1 dot products of gemm_gguf_vec.cpp on AVX512-VNNI: two blocks per
// instruction (what llama.cpp's CPU backend does with vpdpbusd where the CPU has it).
//
// At one activation row (a decode step at batch 1) the AVX2 path meets one 32-weight block at a
// time with _mm256_maddubs_epi16 + _mm256_madd_epi16. Here one 512-bit vpdpbusd multiplies two
// blocks' 64 nibbles (unsigned, 0-15) by 64 int8 activations and sums them four at a time into
// 16 int32 lanes, with no int16 step to saturate. The nibbles of two consecutive blocks, split the
// way they sit in memory, come out as [block 0 weights 0-15, block 1 weights 0-15, block 0 weights
// 16-31, block 1 weights 16-31]; the activations are copied once per call into the same order
// (permute_pairs), so each row costs no shuffle. Lanes 0-3 and 8-11 then belong to the first block,
// 4-7 and 12-15 to the second, and one vector of the two blocks' scales, spread to match, turns the
// integer sums into floats with one FMA. The integer sums are exact, so the result differs from
// the AVX2 path's only in the order the floats are added.
#include "gguf_blocks.h"

namespace minisgl::gguf {
#if defined(__x86_64__)
namespace {

#define MINISGL_AVX512_VNNI_GGUF __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))

// Two weight rows (row, row + row_bytes) against the permuted activation row xp, with its per-block
// pairs ds = (dx, dx sx): y[0], y[1]. nb is even.
template <int64_t TYPE>
MINISGL_AVX512_VNNI_GGUF void row_pair(const uint8_t* row, int64_t row_bytes, const int8_t* xp, const float* ds,
                                       int64_t nb, float* y) {
  constexpr int64_t BB = block_bytes(TYPE), QS = TYPE == GGML_Q4_1 ? 4 : 2;  // block size, offset of qs
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  __m128 ext[2] = {_mm_setzero_ps(), _mm_setzero_ps()};  // lanes 1 and 3: the blocks' constant terms
  for (int64_t b = 0; b < nb; b += 2) {
    const __m512i a = _mm512_loadu_si512(xp + b * QK);
    const __m128 dsx = _mm_loadu_ps(ds + 2 * b);  // (dx, dx sx) of blocks b and b + 1
#pragma GCC unroll 2
    for (int r = 0; r < 2; ++r) {
      const uint8_t* blk = row + r * row_bytes + b * BB;
      _mm_prefetch(reinterpret_cast<const char*>(blk + 4096), _MM_HINT_T0);  // as gemm_gguf_vec.cpp
      const __m256i q = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(blk + BB + QS),
                                            reinterpret_cast<const __m128i*>(blk + QS));
      const __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
      int32_t bits0, bits1;  // d and m (Q4_1), or d and two bytes of qs (Q4_0), as fp16 pairs
      std::memcpy(&bits0, blk, sizeof(bits0));
      std::memcpy(&bits1, blk + BB, sizeof(bits1));
      __m128 dm = _mm_cvtph_ps(_mm_setr_epi32(bits0, bits1, 0, 0));  // (d0, m0, d1, m1)
      if (TYPE == GGML_Q4_0) dm = _mm_mul_ps(_mm_moveldup_ps(dm), _mm_setr_ps(1.f, -8.f, 1.f, -8.f));
      const __m128 sc = _mm_mul_ps(dm, dsx);  // (d0 dx0, m0 dx0 sx0, d1 dx1, m1 dx1 sx1)
      const __m512 scale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(sc));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
      ext[r] = _mm_add_ps(ext[r], sc);
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r) {
    const __m128 e = _mm_add_ps(ext[r], _mm_movehl_ps(ext[r], ext[r]));  // lane 1: m0 terms + m1 terms
    y[r] = _mm512_reduce_add_ps(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(e));
  }
}

}  // namespace
#endif

bool gemv_pairs_vnni_runs(int64_t type, int64_t nb) {
  return cpu_has_avx512_vnni() && (type == GGML_Q4_0 || type == GGML_Q4_1) && nb % 2 == 0;
}

void permute_pairs(const int8_t* q, int64_t nb, int8_t* xp) {
  for (int64_t b = 0; b < nb; b += 2) {
    const int8_t* b0 = q + b * QK;
    int8_t* dst = xp + b * QK;
    std::memcpy(dst, b0, 16);                // block b, values 0-15
    std::memcpy(dst + 16, b0 + QK, 16);      // block b + 1, values 0-15
    std::memcpy(dst + 32, b0 + 16, 16);      // block b, values 16-31
    std::memcpy(dst + 48, b0 + QK + 16, 16);  // block b + 1, values 16-31
  }
}

void gemv_pairs_vnni(int64_t type, const uint8_t* qweight, int64_t row_bytes, const int8_t* xp, const float* ds,
                     int64_t nb, int64_t n0, int64_t n1, float* out) {
#if defined(__x86_64__)
  for (int64_t n = n0; n + 2 <= n1; n += 2) {
    const uint8_t* row = qweight + n * row_bytes;
    if (type == GGML_Q4_1) {
      row_pair<GGML_Q4_1>(row, row_bytes, xp, ds, nb, out + n);
    } else {
      row_pair<GGML_Q4_0>(row, row_bytes, xp, ds, nb, out + n);
    }
  }
#endif
}

}  // namespace minisgl::gguf
