// Attention's two products on AVX512-BF16 (vdpbf16ps), for a bf16 model over a bf16 or an fp8 (e5m2,
// e4m3) KV pool: the matrix-engine counterparts of score_tile and value_tile (attention.h), which
// widen every key and value to float32 and multiply with FMAs. An fp8 row is widened to bf16 first
// (bf16_row), exactly: every e5m2 and e4m3 value is a bf16 value.
//
// vdpbf16ps multiplies 16 pairs of bf16 values by 16 other pairs and adds both products of each
// pair into a float32 lane: 32 multiply-adds per instruction, on operands read as they are stored,
// where an FMA does 16 on values widened beforehand. The products of two bf16 values are exact in
// float32 (and vdpbf16ps flushes denormal inputs to zero).
// - Q . K^T (extend's many rows per key, scores_by_tile): the queries stay unscaled bf16, as the
//   model produced them, and the scale multiplies the float32 scores, so only the summation order
//   differs from the FMA path. Decode's scores (scores_by_key, a GQA group of rows per key) stay on
//   FMAs: on vdpbf16ps they were no faster at 64 requests on an AVX-512 EPYC, neither called per 4
//   keys (7-8% slower) nor as one call per item with the tiles inlined (0% and 39% slower); each score
//   still ends in a cross-lane sum, and the key rows come from scattered pool slots.
// - P . V (decode and extend; a call covers all of a row tile's keys): the probabilities are
//   rounded to bf16, as sgl-kernel's brgemm takes them, and divided by their float32 sum.
//
// Like gemm_vnni.cpp, the functions carry their ISA in a target attribute, so every build compiles
// them and only a CPU with avx512_bf16 (cpu_has_avx512_bf16, common.h) runs them.
#pragma once

#include "attention_brgemm.h"

#include <cstring>

namespace minisgl {

// A block of kBlock keys as 32-bit words, for score_tile_dpbf16: kw[c2 * kBlock + t] holds values
// 2 c2 and 2 c2 + 1 of key t, which is word c2 of the key's row as a bf16 pool stores it, so the
// transposition moves words and converts nothing (an fp8 row is widened first). Keys n..kBlock-1
// are zeros (never read back).
template <int kDim, int kBlock, typename kv_t>
inline void transpose_key_words(const kv_t* const* keys, int64_t n, uint32_t* kw) {
  at::BFloat16 buf[kDim];
  for (int64_t t = 0; t < kBlock; ++t) {
    if (t < n) {
      const at::BFloat16* k = bf16_row(keys[t], buf, kDim);
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
MINISGL_AVX512_BF16 void score_tile_dpbf16(const at::BFloat16* q, const uint32_t* kw, float* scores, int64_t ld,
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

// acc[i][q] += p_t * v_t + p_u * v_u over 64 values of a head, for each of ROWS rows: x holds the two
// value rows interleaved in 16-bit pairs (unpacklo/unpackhi of v_t and v_u), words[i] row i's pair
// (p_t, p_u).
template <int ROWS>
MINISGL_AVX512_BF16 inline void add_value_pair(__m512 (&acc)[ROWS][4], const __m512bh (&x)[4], const uint32_t* words) {
#pragma GCC unroll 8
  for (int i = 0; i < ROWS; ++i) {
    const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(words[i]));
    for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_dpbf16_ps(acc[i][q], p, x[q]);
  }
}

// out[i * d + c] = sum_t p[i][t] * v_t[c] for c in [0, 64) of the piece v_piece, over keys [0, n), for
// ROWS rows whose probabilities p are bf16 (rows ld apart): value_tile's vdpbf16ps counterpart. Keys
// go two at a time: unpacking their two value rows pairs v_t[c] with v_u[c] in one 32-bit word, so
// one instruction adds p_t v_t[c] + p_u v_u[c] for 16 values c. The unpacks pair values within each
// 128-bit lane, so the accumulators hold the values in the order (0-3, 8-11, ...) and (4-7, 12-15,
// ...); two two-source permutes put them back in order at the store. An odd last key pairs with zeros.
template <int ROWS, typename kv_t>
MINISGL_AVX512_BF16 void value_tile_dpbf16(const at::BFloat16* p, int64_t ld, int64_t n, const kv_t* v_piece,
                                           int64_t v_stride, const int32_t* token_slots, float* out, int64_t d) {
  at::BFloat16 t_buf[64], u_buf[64];  // an fp8 pool's two value pieces, widened
  __m512 acc[ROWS][4];
#pragma GCC unroll 8
  for (int i = 0; i < ROWS; ++i) {
    for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_setzero_ps();
  }
  uint32_t words[ROWS];
  int64_t t = 0;
  for (; t + 1 < n; t += 2) {
    const at::BFloat16* vt = bf16_row(v_piece + token_slots[t] * v_stride, t_buf, 64);
    const at::BFloat16* vu = bf16_row(v_piece + token_slots[t + 1] * v_stride, u_buf, 64);
    const __m512i t0 = _mm512_loadu_si512(vt), t1 = _mm512_loadu_si512(vt + 32);
    const __m512i u0 = _mm512_loadu_si512(vu), u1 = _mm512_loadu_si512(vu + 32);
    const __m512bh x[4] = {(__m512bh)_mm512_unpacklo_epi16(t0, u0), (__m512bh)_mm512_unpackhi_epi16(t0, u0),
                           (__m512bh)_mm512_unpacklo_epi16(t1, u1), (__m512bh)_mm512_unpackhi_epi16(t1, u1)};
    for (int i = 0; i < ROWS; ++i) std::memcpy(&words[i], p + i * ld + t, sizeof(uint32_t));  // (p_t, p_u)
    add_value_pair<ROWS>(acc, x, words);
  }
  if (t < n) {  // the last key alone: (v_t, 0) against (p_t, 0)
    const at::BFloat16* vt = bf16_row(v_piece + token_slots[t] * v_stride, t_buf, 64);
    const __m512i t0 = _mm512_loadu_si512(vt), t1 = _mm512_loadu_si512(vt + 32), zero = _mm512_setzero_si512();
    const __m512bh x[4] = {(__m512bh)_mm512_unpacklo_epi16(t0, zero), (__m512bh)_mm512_unpackhi_epi16(t0, zero),
                           (__m512bh)_mm512_unpacklo_epi16(t1, zero), (__m512bh)_mm512_unpackhi_epi16(t1, zero)};
    for (int i = 0; i < ROWS; ++i) {
      uint16_t bits;
      std::memcpy(&bits, p + i * ld + t, sizeof(bits));
      words[i] = bits;
    }
    add_value_pair<ROWS>(acc, x, words);
  }
  // lo lane j holds value 8 (j / 4) + j % 4 of its 32, hi lane j value 8 (j / 4) + 4 + j % 4.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 8
  for (int i = 0; i < ROWS; ++i) {
    for (int h = 0; h < 2; ++h) {
      const __m512 lo = acc[i][2 * h], hi = acc[i][2 * h + 1];
      _mm512_storeu_ps(out + i * d + 32 * h, _mm512_permutex2var_ps(lo, first, hi));
      _mm512_storeu_ps(out + i * d + 32 * h + 16, _mm512_permutex2var_ps(lo, second, hi));
    }
  }
}

// KV head h's values of keys [0, n) from an fp8 pool, widened to bf16 once into sc.values_bf16 and
// read through sc.iota as slots 0, 1, 2, ...: extend's many row tiles of a head then share one
// widening, where each tile widening every value again made an e5m2 pool's extend attention 1.4x
// slower than a bf16 pool's.
template <typename kv_t>
void widen_values(const PagedAttentionArgs& a, Scratch& sc, const kv_t* v_head, const int32_t* token_slots, int64_t n,
                  int64_t d) {
  Scratch::grow(sc.values_bf16, n * d);
  for (int64_t t = static_cast<int64_t>(sc.iota.size()); t < n; ++t) sc.iota.push_back(static_cast<int32_t>(t));
  for (int64_t t = 0; t < n; ++t) bf16_row(v_head + token_slots[t] * a.v_slot_stride, sc.values_bf16.data() + t * d, d);
}

}  // namespace minisgl
