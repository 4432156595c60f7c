// GGUF weight-only GEMM: weights stay in llama.cpp's blocks, activations stay float. It stands where
// SGLang's layers/quantization/gguf.py calls sgl-kernel's CUDA ggml_mul_mat_a8 for batches, which
// quantizes the activations to int8 first; here they are not quantized at all. Batches of up to
// MMVQ_MAX_ROWS rows (layers/quantization/gguf_kernel.py) take gemm_gguf_vec.cpp's integer path
// instead, faster at those sizes; from there on this one is.
//
//   y[m, n] = sum_k x[m, k] w[n, k] + bias[n],   w[n, :] = dequantize(qweight[n, :])
//
// The blocks' layout is in gguf_blocks.h.
//
// The loop: each thread takes TILE_N output rows at a time and walks K in chunks of TILE_K. A chunk of
// its rows is dequantized into a small float buffer (TILE_N x TILE_K floats, 12 KB, held in the L1
// cache) and then multiplied against every activation row, so a weight is read from memory, and
// dequantized, once per call whatever M is. No float copy of the weight exists beyond that buffer.
// The buffer meets the activations register-blocked both ways: a few rows of x by dot products
// (dot_block_avx2), a batch of BATCH_ROWS or more through x transposed, by broadcasts, as the float32
// GEMM does (outer_block_avx2); the first version used each x load for 4 FMAs and ran a batch of 64
// at half the float32 GEMM's speed.
//
// Two versions of the inner loops: AVX2 + FMA + F16C, compiled through a target attribute so that every
// x86 build contains them (MINISGL_AVX2_FMA, gguf_blocks.h), and portable scalar C++. The caller picks one per call (use_avx2, decided
// in Python from kernels/cpu/features.py), so the tests can run both on an AVX2 machine.
#include <algorithm>
#include <optional>
#include <vector>

#include "gguf_blocks.h"

namespace minisgl {
namespace {

using namespace gguf;

constexpr int64_t TILE_N = 12;    // weight rows dequantized together: two blocks of 6 (outer_rows_avx2)
constexpr int64_t TILE_K = 256;   // weights per row and chunk: TILE_N x TILE_K floats = 12 KB
constexpr int64_t BATCH_ROWS = 16;  // from this many activation rows on, the AVX2 path goes through x^T

// ---- portable scalar path ----

void dequant_block_scalar(const uint8_t* b, int64_t type, float* out) {
  const float d = fp16_at(b);
  if (type == GGML_Q8_0) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < QK; ++j) out[j] = static_cast<float>(qs[j]) * d;
    return;
  }
  if (type == GGML_Q4_0) {
    const uint8_t* qs = b + 2;
    for (int j = 0; j < QK / 2; ++j) {
      out[j] = static_cast<float>((qs[j] & 15) - 8) * d;
      out[j + QK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
    return;
  }
  const float m = fp16_at(b + 2);  // Q4_1
  const uint8_t* qs = b + 4;
  for (int j = 0; j < QK / 2; ++j) {
    out[j] = static_cast<float>(qs[j] & 15) * d + m;
    out[j + QK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void dot_tile_scalar(const float* x, int64_t ldx, int64_t M, const float* buf, int64_t rows, int64_t kc,
                     float* acc) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < rows; ++n) {
      float s = 0.f;
      for (int64_t k = 0; k < kc; ++k) s += x[m * ldx + k] * buf[n * TILE_K + k];
      acc[m * TILE_N + n] += s;
    }
  }
}

// ---- AVX2 + FMA path ----
#if defined(__x86_64__)

MINISGL_AVX2_FMA inline void dequant_block_avx2(const uint8_t* b, int64_t type, float* out) {
  uint16_t bits[2];  // d (and m): fp16, converted by F16C
  std::memcpy(bits, b, sizeof(bits));
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(bits[0]));
  if (type == GGML_Q8_0) {
    for (int j = 0; j < QK; j += 8) {
      const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + j)));
      _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
    }
    return;
  }
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (type == GGML_Q4_1 ? 4 : 2)));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(qs, low4), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low4);
  // Weights 0-7, 8-15 (low nibbles of bytes 0-7, 8-15), then 16-23, 24-31 (the high nibbles).
  const __m128i eights[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  if (type == GGML_Q4_1) {
    const __m256 m = _mm256_set1_ps(_cvtsh_ss(bits[1]));
    for (int i = 0; i < 4; ++i) {
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eights[i]));
      _mm256_storeu_ps(out + 8 * i, _mm256_fmadd_ps(q, d, m));
    }
  } else {  // Q4_0: (nibble - 8) exactly, then one rounding, as the scalar path
    const __m256i eight = _mm256_set1_epi32(8);
    for (int i = 0; i < 4; ++i) {
      const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(eights[i]), eight);
      _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
    }
  }
}

MINISGL_AVX2_FMA void dequant_tile_avx2(const uint8_t* rows, int64_t row_bytes, int64_t n_rows, int64_t b0,
                                        int64_t nb, int64_t type, int64_t bb, float* buf) {
  // Each row's next chunk (or, after the last, the next tile's first) is prefetched while this one
  // is dequantized: a chunk of a row is only 144 to 272 bytes and then the walk jumps to the next
  // row, too short a run for the hardware prefetcher. At one activation row it saved 10-15%.
  const int64_t span = nb * bb;
  for (int64_t n = 0; n < n_rows; ++n) {
    const uint8_t* row = rows + n * row_bytes + b0 * bb;
    const uint8_t* ahead = b0 * bb + span < row_bytes ? row + span : rows + (n + TILE_N) * row_bytes;
    for (int64_t off = 0; off < span; off += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
    for (int64_t i = 0; i < nb; ++i) dequant_block_avx2(row + i * bb, type, buf + n * TILE_K + i * QK);
  }
}

// A block of RM activation rows against RN weight rows of the tile, over kc weights (a multiple of
// 32): RM x RN accumulators of 8 floats stay in registers, and each k-step loads RM vectors of x and
// RN of the buffer for RM x RN FMAs. Blocking both ways is what makes a batch cheap: one activation
// row against four weight rows (the kernel's first version) loads 5 vectors per 4 FMAs and is bound by
// the loads; 4 x 2 loads 6 per 8, as the float32 GEMM's 6-row tiles load 8 per 12 (gemm.cpp), and 8
// independent sums cover the FMA latency. At most RM x RN + RM + 1 = 13 of the 16 ymm registers.
template <int RM, int RN>
MINISGL_AVX2_FMA void dot_block_avx2(const float* x, int64_t ldx, const float* w, int64_t kc, float* acc) {
  __m256 s[RM][RN];
#pragma GCC unroll 4
  for (int i = 0; i < RM; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < RN; ++j) s[i][j] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kc; k += 8) {
    __m256 xv[RM];
#pragma GCC unroll 4
    for (int i = 0; i < RM; ++i) xv[i] = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 4
    for (int j = 0; j < RN; ++j) {
      __m256 wv = _mm256_loadu_ps(w + j * TILE_K + k);
      // Held in a register: else GCC folds the load into each of the RM FMAs (vfmadd231ps m256), and
      // the loop issues RM x RN + RM loads per RM x RN FMAs, bound by the loads again.
      __asm__("" : "+x"(wv));
#pragma GCC unroll 4
      for (int i = 0; i < RM; ++i) s[i][j] = _mm256_fmadd_ps(xv[i], wv, s[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < RM; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < RN; ++j) acc[i * TILE_N + j] += hsum(s[i][j]);
  }
}

// RM activation rows against all `rows` weight rows of the tile: RN at a time, then one by one.
// One or two activation rows take four weight rows (four or eight sums), three or four take two.
template <int RM>
MINISGL_AVX2_FMA void dot_rows_avx2(const float* x, int64_t ldx, const float* buf, int64_t rows, int64_t kc,
                                    float* acc) {
  constexpr int RN = RM <= 2 ? 4 : 2;
  int64_t n = 0;
  for (; n + RN <= rows; n += RN) dot_block_avx2<RM, RN>(x, ldx, buf + n * TILE_K, kc, acc + n);
  for (; n < rows; ++n) dot_block_avx2<RM, 1>(x, ldx, buf + n * TILE_K, kc, acc + n);
}

// The tile's buffer (in L1) against every activation row, four rows at a time: the four rows' kc
// floats (4 KB at kc = 256) stay in L1 too while they meet each pair of weight rows.
MINISGL_AVX2_FMA void dot_tile_avx2(const float* x, int64_t ldx, int64_t M, const float* buf, int64_t rows,
                                    int64_t kc, float* acc) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) dot_rows_avx2<4>(x + m * ldx, ldx, buf, rows, kc, acc + m * TILE_N);
  const float* xm = x + m * ldx;
  float* am = acc + m * TILE_N;
  switch (M - m) {
    case 3: dot_rows_avx2<3>(xm, ldx, buf, rows, kc, am); break;
    case 2: dot_rows_avx2<2>(xm, ldx, buf, rows, kc, am); break;
    case 1: dot_rows_avx2<1>(xm, ldx, buf, rows, kc, am); break;
    default: break;
  }
}

// From BATCH_ROWS rows on, the other way round, as the float32 GEMM's tiles (gemm.cpp) do: x is
// transposed once per call into xt, panels of 16 rows [K][16] one after the other (the last [K][8]
// where M, rounded up to mp, a multiple of 8, leaves 8; the pad rows zero). A panel is contiguous:
// with one [K][mp] matrix a k-step would jump mp floats, and at mp = 64 (256 bytes) the rows of
// one kc chunk fall into a quarter of L1's sets and evict each other. A k-step
// loads RV vectors of 8 activation rows from its panel and broadcasts one weight of each of RN buffer rows,
// and the RN x RV sums add up along k in registers: no horizontal sum, 2 + 6 loads per 12 FMAs at
// RV = 2, RN = 6 (15 of the 16 ymm registers). At the chunk's end they are added to acct
// [TILE_N][mp], the tile's sums transposed. The dot product above stays for a few rows, where
// padding to 8 would multiply zeros.
template <int RV, int RN>
MINISGL_AVX2_FMA void outer_block_avx2(const float* xt, int64_t mp, const float* w, int64_t kc, float* acct) {
  __m256 s[RN][RV];
#pragma GCC unroll 6
  for (int j = 0; j < RN; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < RV; ++v) s[j][v] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    __m256 xv[RV];
#pragma GCC unroll 2
    for (int v = 0; v < RV; ++v) {
      xv[v] = _mm256_loadu_ps(xt + k * 8 * RV + 8 * v);
      __asm__("" : "+x"(xv[v]));  // one load, not one per FMA (see dot_block_avx2)
    }
#pragma GCC unroll 6
    for (int j = 0; j < RN; ++j) {
      const __m256 wb = _mm256_broadcast_ss(w + j * TILE_K + k);
#pragma GCC unroll 2
      for (int v = 0; v < RV; ++v) s[j][v] = _mm256_fmadd_ps(xv[v], wb, s[j][v]);
    }
  }
#pragma GCC unroll 6
  for (int j = 0; j < RN; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < RV; ++v) {
      float* a = acct + j * mp + 8 * v;
      _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), s[j][v]));
    }
  }
}

template <int RV>
MINISGL_AVX2_FMA void outer_rows_avx2(const float* xt, int64_t mp, const float* buf, int64_t rows, int64_t kc,
                                      float* acct) {
  int64_t n = 0;
  for (; n + 6 <= rows; n += 6) outer_block_avx2<RV, 6>(xt, mp, buf + n * TILE_K, kc, acct + n * mp);
  for (; n < rows; ++n) outer_block_avx2<RV, 1>(xt, mp, buf + n * TILE_K, kc, acct + n * mp);
}

// 16 activation rows at a time (their kc x 16 floats of xt, 16 KB at kc = 256, stay in L1 beside
// the buffer), then the last 8 if mp leaves them. k0: where the chunk starts in each panel.
MINISGL_AVX2_FMA void outer_tile_avx2(const float* xt, int64_t K, int64_t k0, int64_t mp, const float* buf,
                                      int64_t rows, int64_t kc, float* acct) {
  int64_t m = 0;
  for (; m + 16 <= mp; m += 16) outer_rows_avx2<2>(xt + m * K + k0 * 16, mp, buf, rows, kc, acct + m);
  if (m < mp) outer_rows_avx2<1>(xt + m * K + k0 * 8, mp, buf, rows, kc, acct + m);
}
#endif

void gguf_gemm(const float* x, int64_t M, int64_t K, const uint8_t* qweight, int64_t N, int64_t type,
               const float* bias, float* out, bool use_avx2) {
  const int64_t bb = block_bytes(type), row_bytes = K / QK * bb;
  const int64_t tiles = (N + TILE_N - 1) / TILE_N;
  // A batch on the AVX2 path: x^T, shared by every thread (outer_block_avx2).
  const bool batched = use_avx2 && M >= BATCH_ROWS;
  const int64_t mp = batched ? (M + 7) / 8 * 8 : M;
  std::vector<float> xt(batched ? K * mp : 0, 0.f);
  if (batched) {
    at::parallel_for(0, K, 64, [&](int64_t k0, int64_t k1) {
      for (int64_t m = 0; m < M; ++m) {  // row m in the panel at m - m % 16, of width 16 or 8
        const int64_t m0 = m / 16 * 16, width = std::min<int64_t>(16, mp - m0);
        for (int64_t k = k0; k < k1; ++k) xt[m0 * K + k * width + m - m0] = x[m * K + k];
      }
    });
  }
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float buf[TILE_N * TILE_K];  // 64-byte aligned: no load of it splits a cache line
    std::vector<float> acc(mp * TILE_N);     // [M][TILE_N], or [TILE_N][mp] when batched
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * TILE_N, rows = std::min(TILE_N, N - n0);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t k0 = 0; k0 < K; k0 += TILE_K) {
        const int64_t kc = std::min(TILE_K, K - k0), b0 = k0 / QK, nb = kc / QK;
        const uint8_t* tile = qweight + n0 * row_bytes;
#if defined(__x86_64__)
        if (use_avx2) {
          dequant_tile_avx2(tile, row_bytes, rows, b0, nb, type, bb, buf);
          if (batched) {
            outer_tile_avx2(xt.data(), K, k0, mp, buf, rows, kc, acc.data());
          } else {
            dot_tile_avx2(x + k0, K, M, buf, rows, kc, acc.data());
          }
          continue;
        }
#endif
        for (int64_t n = 0; n < rows; ++n) {
          for (int64_t i = 0; i < nb; ++i) {
            dequant_block_scalar(tile + n * row_bytes + (b0 + i) * bb, type, buf + n * TILE_K + i * QK);
          }
        }
        dot_tile_scalar(x + k0, K, M, buf, rows, kc, acc.data());
      }
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < rows; ++n) {
          const float sum = batched ? acc[n * mp + m] : acc[m * TILE_N + n];
          out[m * N + n0 + n] = sum + (bias ? bias[n0 + n] : 0.f);
        }
      }
    }
  });
}

}  // namespace

// y = x W^T + bias for W given as GGUF blocks: x [M, K] float32 / bfloat16 / float16, qweight [N, K / 32 *
// block bytes] uint8, weight_type a ggml type id (Q8_0, Q4_0 or Q4_1). y has x's dtype; a 16-bit x is
// widened to float32 first (weight-only quantization: the activations keep their precision).
at::Tensor gguf_mul_mat(const at::Tensor& x, const at::Tensor& qweight, int64_t weight_type,
                        const std::optional<at::Tensor>& bias, bool use_avx2) {
  return gguf::run_op("gguf_mul_mat", x, qweight, weight_type, bias, use_avx2,
                      [&](const float* xf, int64_t M, int64_t K, const uint8_t* w, int64_t N, const float* b, float* y,
                          bool avx2) { gguf_gemm(xf, M, K, w, N, weight_type, b, y, avx2); });
}

}  // namespace minisgl
