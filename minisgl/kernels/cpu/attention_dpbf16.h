// Attention's scores q . k on AVX512-BF16 (vdpbf16ps), for a bf16 model over a bf16 KV pool: the
// matrix-engine counterpart of score_tile (attention.h), which widens every key to float32 and
// multiplies with FMAs.
//
// vdpbf16ps multiplies 16 pairs of bf16 values by 16 other pairs and adds both products of each
// pair into a float32 lane: 32 multiply-adds per instruction, on operands read as they are stored,
// where an FMA does 16 on keys widened beforehand. The products of two bf16 values are exact in
// float32, so the scores differ from the FMA path only in summation order (and vdpbf16ps flushes
// denormal inputs to zero). The queries stay unscaled bf16, as the model produced them, and the
// scale multiplies the float32 scores: scaling first would round q * scale to bf16.
//
// Only extend's many-rows-per-key pass takes it (scores_by_tile). Decode's (scores_by_key, a GQA
// group of rows per key) measured 7-8% slower with vdpbf16ps at 64 requests on an AVX-512 EPYC:
// each call covers only 4 keys, and a call into a function of another ISA cannot be inlined. The
// probabilities and the values stay on the FMA path (value_tile): a probability rounded to bf16 for
// vdpbf16ps would lose precision that a float32 one keeps.
//
// Like gemm_vnni.cpp, the functions carry their ISA in a target attribute, so every build compiles
// them and only a CPU with avx512_bf16 (asked by cpu_has_avx512_bf16) runs them.
#pragma once

#include "attention_args.h"

#include <cstring>

namespace minisgl {

#define MINISGL_ATTN_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

inline bool cpu_has_avx512_bf16() {
  static const bool has = cpu_has("avx512_bf16") && cpu_has("avx512_bw") && cpu_has("avx512_vl");
  return has;
}

// A block of kBlock keys as 32-bit words, for score_tile_dpbf16: kw[c2 * kBlock + t] holds values
// 2 c2 and 2 c2 + 1 of key t, which is word c2 of the key's row as the pool stores it, so the
// transposition moves words and converts nothing. Keys n..kBlock-1 are zeros (never read back).
template <int kDim, int kBlock>
inline void transpose_key_words(const at::BFloat16* const* keys, int64_t n, uint32_t* kw) {
  for (int64_t t = 0; t < kBlock; ++t) {
    if (t < n) {
      const at::BFloat16* k = keys[t];
      for (int64_t c2 = 0; c2 < kDim / 2; ++c2) std::memcpy(kw + c2 * kBlock + t, k + 2 * c2, sizeof(uint32_t));
    } else {
      for (int64_t c2 = 0; c2 < kDim / 2; ++c2) kw[c2 * kBlock + t] = 0;
    }
  }
}

// scores[i][0, kBlock) = scale * q_i . keys of one transposed block, for ROWS query rows (extend:
// many rows per key): each step broadcasts one pair of q_i and multiplies it by that pair of every
// key in the block, a small GEMM with no horizontal sums.
template <int ROWS, int kDim, int kBlock>
MINISGL_ATTN_BF16 void score_tile_dpbf16(const at::BFloat16* q, const uint32_t* kw, float* scores, int64_t ld,
                                         float scale) {
  constexpr int NV = kBlock / 16;  // vectors of 16 keys
  __m512 acc[ROWS][NV];
#pragma GCC unroll 12
  for (int i = 0; i < ROWS; ++i) {
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (int c2 = 0; c2 < kDim / 2; ++c2) {
    __m512bh k[NV];
    for (int v = 0; v < NV; ++v) k[v] = (__m512bh)_mm512_loadu_si512(kw + c2 * kBlock + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < ROWS; ++i) {
      int32_t pair;
      std::memcpy(&pair, q + i * kDim + 2 * c2, sizeof(pair));
      const __m512bh qi = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], qi, k[v]);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 12
  for (int i = 0; i < ROWS; ++i) {
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(scores + i * ld + 16 * v, _mm512_mul_ps(acc[i][v], s));
  }
}

}  // namespace minisgl
