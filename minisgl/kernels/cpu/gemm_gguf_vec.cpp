// GGUF GEMM for a few activation rows, on integers: the CPU counterpart of sgl-kernel's CUDA
// ggml_mul_mat_vec_a8, which SGLang's layers/quantization/gguf.py calls for batches of up to 6 rows
// ("MMVQ"), and of what llama.cpp's CPU backend does for every batch (ggml_vec_dot_q4_1_q8_1 and kin).
//
// Each row of x is quantized per block of 32, as the weights are (Q8_1 in ggml's terms):
//   xq[j] = round(x[j] / dx),  dx = max|x[block]| / 127,  sx = sum_j xq[j]
// and a weight block against an activation block becomes one integer dot product and two scalings:
//   Q8_0:  dw dx sum(qs xq)
//   Q4_0:  dw dx (sum(nibble xq) - 8 sx)
//   Q4_1:  dw dx sum(nibble xq) + m dx sx
// The sums are exact; what changes from gemm_gguf.cpp's float path is the activations' rounding to
// 8 bits, the error llama.cpp and SGLang's GPU kernels accept on every GGUF GEMM. dx stays float32
// where ggml stores it as fp16.
//
// Why: with float activations each weight is dequantized to a float and met by a float FMA, 8 per
// instruction, and at one row the dequantization is most of the cost (a Q4_1 pass ran only 2x
// faster than float32 on 6.4x fewer bytes). Here a block of 32 nibbles is unpacked into one
// register and meets 32 activations in one _mm256_maddubs_epi16 (unsigned x signed bytes, adjacent
// products added into int16: 15 x 127 x 2 fits), then _mm256_madd_epi16 against ones (int16 pairs
// into int32) and one float FMA for the block's scale. Q8_0's weights are signed: maddubs takes
// |qs| and xq with qs's sign (_mm256_sign_epi8), llama.cpp's trick; 128 x 127 x 2 still fits.
//
// Each weight row is read once per call and met by RM (up to 4) activation rows at a time; a row is
// a few hundred contiguous bytes, the next one right after it. At one activation row (a decode step
// at batch 1) Q4 rows go two at a time instead, for two independent FMA chains, and on a CPU with
// AVX512-VNNI two blocks at a time as well (gemm_gguf_vnni.cpp).
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "gguf_blocks.h"

namespace minisgl {
namespace {

using namespace gguf;

constexpr int MAX_RM = 4;  // activation rows met by one unpacked weight block
constexpr int64_t PREFETCH_BYTES = 4096;

// x [M, K] quantized per block: q [M][K] int8, and per block the pair (dx, dx sx) in ds [M][K / 32][2],
// side by side so that one multiply by a weight block's (d, m) gives both of its scalings.
// Division, not a multiply by 1 / dx, and nearbyint (ties to even): torch.round(x / dx) in the tests.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> ds;
};

// One block of 32 values: q[j] = round(xb[j] / d) with d = max|xb| / 127 (*d); returns sum_j q[j].
int quantize_block(const float* xb, int8_t* q, float* d) {
  float amax = 0.f;
  for (int j = 0; j < QK; ++j) amax = std::max(amax, std::abs(xb[j]));
  *d = std::max(amax, 1e-10f) / 127.f;
  int sum = 0;
  for (int j = 0; j < QK; ++j) {
    q[j] = static_cast<int8_t>(std::clamp(std::nearbyint(xb[j] / *d), -127.f, 127.f));
    sum += q[j];
  }
  return sum;
}

#if defined(__x86_64__)
// The same, eight lanes at a time, bit for bit: the scalar d, an IEEE division, round to nearest even.
MINISGL_AVX2_FMA int quantize_block_avx2(const float* xb, int8_t* q, float* d) {
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_loadu_ps(xb + 8 * j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.f), v[j]));  // |x|: the sign bit cleared
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  *d = std::max(_mm_cvtss_f32(m), 1e-10f) / 127.f;
  const __m256 dv = _mm256_set1_ps(*d), lim = _mm256_set1_ps(127.f);
  __m256i qi[4];
  for (int j = 0; j < 4; ++j) {
    const __m256 r = _mm256_round_ps(_mm256_div_ps(v[j], dv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    qi[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.f)), lim));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
  // int32 -> int8: the two packs work within 128-bit lanes and leave 4-byte groups in the order
  // 0, 2, 4, 6, 1, 3, 5, 7 of the 8 groups; one permute puts them back (llama.cpp's quantize_row_q8_1).
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return _mm_cvtsi128_si32(s4);
}
#endif

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K, bool use_avx2) {
  const int64_t blocks = M * K / QK;
  QuantizedRows r{std::vector<int8_t>(M * K), std::vector<float>(2 * blocks)};
  for (int64_t i = 0; i < blocks; ++i) {
    float* d = r.ds.data() + 2 * i;
#if defined(__x86_64__)
    const int sum = use_avx2 ? quantize_block_avx2(x + i * QK, r.q.data() + i * QK, d)
                             : quantize_block(x + i * QK, r.q.data() + i * QK, d);
#else
    const int sum = quantize_block(x + i * QK, r.q.data() + i * QK, d);
#endif
    d[1] = d[0] * static_cast<float>(sum);
  }
  return r;
}

// ---- portable scalar path: the same integer sums, one at a time ----

template <int64_t TYPE>
void row_scalar(const uint8_t* row, const QuantizedRows& xq, int64_t m, int64_t nb, float* out) {
  const int8_t* q = xq.q.data() + m * nb * QK;
  const float* ds = xq.ds.data() + 2 * m * nb;
  float sum = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * block_bytes(TYPE);
    const int8_t* qb = q + b * QK;
    int dot = 0;
    if (TYPE == GGML_Q8_0) {
      const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
      for (int j = 0; j < QK; ++j) dot += qs[j] * qb[j];
    } else {
      const uint8_t* qs = blk + (TYPE == GGML_Q4_1 ? 4 : 2);
      for (int j = 0; j < QK / 2; ++j) dot += (qs[j] & 15) * qb[j] + (qs[j] >> 4) * qb[j + QK / 2];
    }
    const float dw = fp16_at(blk);
    sum += dw * ds[2 * b] * static_cast<float>(dot);
    if (TYPE == GGML_Q4_1) sum += fp16_at(blk + 2) * ds[2 * b + 1];
    if (TYPE == GGML_Q4_0) sum -= 8.f * dw * ds[2 * b + 1];
  }
  *out = sum;
}

// ---- AVX2 path ----
#if defined(__x86_64__)

// A weight block's two scalings as a pair: (d, m) for Q4_1, (d, -8 d) for Q4_0; Q8_0 uses only d.
// One vcvtph2ps converts Q4_1's d and m together (in a Q4_0 block the second half-word is not m).
template <int64_t TYPE>
MINISGL_AVX2_FMA inline __m128 block_scales(const uint8_t* blk) {
  int32_t bits;
  std::memcpy(&bits, blk, sizeof(bits));
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
  if (TYPE == GGML_Q4_0) return _mm_mul_ps(_mm_moveldup_ps(dm), _mm_setr_ps(1.f, -8.f, 0.f, 0.f));
  return dm;
}

// A weight block in registers: its 32 weights as unsigned bytes (Q8_0: |qs|, with w keeping the signs)
// and its two scalings (d, m).
struct WeightBlock {
  __m256i w, wabs;
  __m128 dm;
};

template <int64_t TYPE>
MINISGL_AVX2_FMA inline WeightBlock load_block(const uint8_t* blk) {
  // 4 KB ahead (about ten rows of SmolLM2's Q4_1): at one x row this made a pass over the model's
  // GEMMs 10-15% faster on AMD EPYC (Zen 3); the hardware prefetcher alone lags. Prefetching past
  // the weight's end is harmless: a prefetch never faults.
  _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH_BYTES), _MM_HINT_T0);
  WeightBlock wb;
  wb.dm = block_scales<TYPE>(blk);
  if (TYPE == GGML_Q8_0) {
    wb.w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    wb.wabs = _mm256_sign_epi8(wb.w, wb.w);
  } else {  // the 16 bytes in both halves; the upper half shifted by 4: weights 0-15, then 16-31
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (TYPE == GGML_Q4_1 ? 4 : 2)));
    const __m256i shift = _mm256_setr_epi64x(0, 0, 4, 4);  // a byte's high nibble down to its low bits
    wb.w = wb.wabs = _mm256_and_si256(_mm256_srlv_epi64(_mm256_broadcastsi128_si256(qs), shift),
                                      _mm256_set1_epi8(0x0F));
  }
  return wb;
}

// One weight block against one x block (32 int8 values a, and the pair dsx = (dx, dx sx)):
// sc = (d, m) * (dx, dx sx); lane 0 scales the integer dot product (8 partial sums in acc), lane 1 is
// the block's constant term, summed in ext.
template <int64_t TYPE>
MINISGL_AVX2_FMA inline void block_dot(const WeightBlock& wb, __m256i a, __m128 dsx, __m256& acc, __m128& ext) {
  if (TYPE == GGML_Q8_0) a = _mm256_sign_epi8(a, wb.w);
  const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wb.wabs, a), _mm256_set1_epi16(1));
  const __m128 sc = _mm_mul_ps(wb.dm, dsx);
  acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(sc), _mm256_cvtepi32_ps(dot), acc);
  if (TYPE != GGML_Q8_0) ext = _mm_add_ps(ext, sc);
}

MINISGL_AVX2_FMA inline __m256i x_block(const QuantizedRows& xq, int64_t m, int64_t K, int64_t b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q.data() + m * K + b * QK));
}

MINISGL_AVX2_FMA inline __m128 x_scales(const QuantizedRows& xq, int64_t m, int64_t nb, int64_t b) {
  return _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xq.ds.data() + 2 * (m * nb + b))));
}

template <int64_t TYPE>
MINISGL_AVX2_FMA inline float finish(__m256 acc, __m128 ext) {
  return hsum(acc) + (TYPE != GGML_Q8_0 ? _mm_cvtss_f32(_mm_movehdup_ps(ext)) : 0.f);
}

// One weight row against x rows m0 .. m0 + RM - 1: y[i] for x row m0 + i, ldy apart. (Four weight
// rows at a time against one x row, sharing its loads, measured slower: 16 live registers and more
// spill.)
template <int64_t TYPE, int RM>
MINISGL_AVX2_FMA void row_avx2(const uint8_t* row, const QuantizedRows& xq, int64_t m0, int64_t nb, float* y,
                               int64_t ldy) {
  __m256 acc[RM];
  __m128 ext[RM];
#pragma GCC unroll 4
  for (int i = 0; i < RM; ++i) acc[i] = _mm256_setzero_ps(), ext[i] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const WeightBlock wb = load_block<TYPE>(row + b * block_bytes(TYPE));
#pragma GCC unroll 4
    for (int i = 0; i < RM; ++i) {
      block_dot<TYPE>(wb, x_block(xq, m0 + i, nb * QK, b), x_scales(xq, m0 + i, nb, b), acc[i], ext[i]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < RM; ++i) y[i * ldy] = finish<TYPE>(acc[i], ext[i]);
}

// Two weight rows (row, row + row_bytes) against the one x row: y[0], y[1]. At one row the FMA into
// acc waits on the previous block's; two rows give the core two independent chains and load each x
// block once. For Q4_0 and Q4_1 only: Q8_0 ran slower this way from memory (faster from cache).
template <int64_t TYPE>
MINISGL_AVX2_FMA void row_pair_avx2(const uint8_t* row, int64_t row_bytes, const QuantizedRows& xq, int64_t nb,
                                    float* y) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m128 ext[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i a = x_block(xq, 0, nb * QK, b);
    const __m128 dsx = x_scales(xq, 0, nb, b);
#pragma GCC unroll 2
    for (int r = 0; r < 2; ++r) {
      block_dot<TYPE>(load_block<TYPE>(row + r * row_bytes + b * block_bytes(TYPE)), a, dsx, acc[r], ext[r]);
    }
  }
  y[0] = finish<TYPE>(acc[0], ext[0]);
  y[1] = finish<TYPE>(acc[1], ext[1]);
}

// One weight row against every x row, MAX_RM at a time: y [M] with stride ldy.
template <int64_t TYPE>
MINISGL_AVX2_FMA void rows_avx2(const uint8_t* row, const QuantizedRows& xq, int64_t M, int64_t nb, float* y,
                                int64_t ldy) {
  int64_t m = 0;
  for (; m + MAX_RM <= M; m += MAX_RM) row_avx2<TYPE, MAX_RM>(row, xq, m, nb, y + m * ldy, ldy);
  switch (M - m) {
    case 3: row_avx2<TYPE, 3>(row, xq, m, nb, y + m * ldy, ldy); break;
    case 2: row_avx2<TYPE, 2>(row, xq, m, nb, y + m * ldy, ldy); break;
    case 1: row_avx2<TYPE, 1>(row, xq, m, nb, y + m * ldy, ldy); break;
    default: break;
  }
}
#endif

template <int64_t TYPE>
void gemm_vec(const QuantizedRows& xq, int64_t M, int64_t K, const uint8_t* qweight, int64_t N, const float* bias,
              float* out, bool use_avx2) {
  const int64_t nb = K / QK, row_bytes = nb * block_bytes(TYPE);
  // One row on a CPU with AVX512-VNNI: gemm_gguf_vnni.cpp, on the activations permuted once here.
  const bool vnni = use_avx2 && M == 1 && gemv_pairs_vnni_runs(TYPE, nb);
  std::vector<int8_t> xp(vnni ? K : 0);
  if (vnni) permute_pairs(xq.q.data(), nb, xp.data());
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    int64_t n = begin;
    if (vnni) {
      const int64_t pairs_end = begin + (end - begin) / 2 * 2;
      gemv_pairs_vnni(TYPE, qweight, row_bytes, xp.data(), xq.ds.data(), nb, begin, pairs_end, out);
      for (; n < pairs_end; ++n) {
        if (bias) out[n] += bias[n];
      }
    }
#if defined(__x86_64__)
    if (use_avx2 && M == 1 && TYPE != GGML_Q8_0) {
      for (; n + 2 <= end; n += 2) {
        row_pair_avx2<TYPE>(qweight + n * row_bytes, row_bytes, xq, nb, out + n);
        if (bias) out[n] += bias[n], out[n + 1] += bias[n + 1];
      }
    }
#endif
    for (; n < end; ++n) {
      const uint8_t* row = qweight + n * row_bytes;
#if defined(__x86_64__)
      if (use_avx2) {
        rows_avx2<TYPE>(row, xq, M, nb, out + n, N);
      } else
#endif
      {
        for (int64_t m = 0; m < M; ++m) row_scalar<TYPE>(row, xq, m, nb, out + m * N + n);
      }
      if (bias) {
        for (int64_t m = 0; m < M; ++m) out[m * N + n] += bias[n];
      }
    }
  });
}

}  // namespace

// y = x W^T + bias with x quantized to int8 per 32-block first: arguments and result as gguf_mul_mat's
// (gemm_gguf.cpp). Meant for a few rows: layers/quantization/gguf_kernel.py picks one of the two by M.
at::Tensor gguf_mul_mat_vec_a8(const at::Tensor& x, const at::Tensor& qweight, int64_t weight_type,
                               const std::optional<at::Tensor>& bias, bool use_avx2) {
  return gguf::run_op("gguf_mul_mat_vec_a8", x, qweight, weight_type, bias, use_avx2,
                      [&](const float* xf, int64_t M, int64_t K, const uint8_t* w, int64_t N, const float* b, float* y,
                          bool avx2) {
                        const QuantizedRows xq = quantize_rows(xf, M, K, avx2);
                        switch (weight_type) {
                          case GGML_Q4_0: gemm_vec<GGML_Q4_0>(xq, M, K, w, N, b, y, avx2); break;
                          case GGML_Q4_1: gemm_vec<GGML_Q4_1>(xq, M, K, w, N, b, y, avx2); break;
                          default: gemm_vec<GGML_Q8_0>(xq, M, K, w, N, b, y, avx2); break;
                        }
                      });
}

}  // namespace minisgl
