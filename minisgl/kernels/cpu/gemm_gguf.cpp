// GGUF weight-only GEMM: weights stay in llama.cpp's blocks, activations stay float (the CPU counterpart
// of sgl-kernel's CUDA ggml_mul_mat_vec_a8 / ggml_mul_mat_a8 used by SGLang's layers/quantization/gguf.py,
// which quantize the activations to int8 first; here they are not quantized at all).
//
//   y[m, n] = sum_k x[m, k] w[n, k] + bias[n],   w[n, :] = dequantize(qweight[n, :])
//
// A row of qweight is K / 32 blocks of 32 weights each (ggml-common.h):
//   Q8_0: fp16 d, int8 qs[32]                w = qs[j] d
//   Q4_0: fp16 d, uint8 qs[16]               w = (nibble - 8) d
//   Q4_1: fp16 d, fp16 m, uint8 qs[16]       w = nibble d + m
// where byte j of qs holds weight j in its low nibble and weight j + 16 in its high nibble.
//
// The loop: each thread takes TILE_N output rows at a time and walks K in chunks of TILE_K. A chunk of
// its rows is dequantized into a small float buffer (TILE_N x TILE_K floats, 16 KB, held in the L1
// cache) and then multiplied against every activation row, so a weight is read from memory, and
// dequantized, once per call whatever M is. No float copy of the weight exists beyond that buffer.
//
// Two versions of the inner loops: AVX2 + FMA + F16C, compiled through a target attribute so that every
// x86 build contains them, and portable scalar C++. The caller picks one per call (use_avx2, decided
// in Python from kernels/cpu/features.py), so the tests can run both on an AVX2 machine.
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MINISGL_AVX2_FMA __attribute__((target("avx2,fma,f16c")))
#endif

namespace minisgl {
namespace {

// ggml's type ids (gguf.GGMLQuantizationType): the ones this kernel multiplies.
constexpr int64_t GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8;
constexpr int64_t QK = 32;        // weights per block, for all three types
constexpr int64_t TILE_N = 8;     // weight rows dequantized together
constexpr int64_t TILE_K = 512;   // weights per row and chunk: TILE_N x TILE_K floats = 16 KB

int64_t block_bytes(int64_t type) {
  switch (type) {
    case GGML_Q4_0: return 18;
    case GGML_Q4_1: return 20;
    case GGML_Q8_0: return 34;
    default: return 0;
  }
}

inline float fp16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

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
  for (int64_t n = 0; n < n_rows; ++n) {
    const uint8_t* row = rows + n * row_bytes + b0 * bb;
    for (int64_t i = 0; i < nb; ++i) dequant_block_avx2(row + i * bb, type, buf + n * TILE_K + i * QK);
  }
}

MINISGL_AVX2_FMA inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// kc is a multiple of 32. Four weight rows at a time share each load of x.
MINISGL_AVX2_FMA void dot_tile_avx2(const float* x, int64_t ldx, int64_t M, const float* buf, int64_t rows,
                                    int64_t kc, float* acc) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * ldx;
    int64_t n = 0;
    for (; n + 4 <= rows; n += 4) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      const float* w = buf + n * TILE_K;
      for (int64_t k = 0; k < kc; k += 8) {
        const __m256 xv = _mm256_loadu_ps(xm + k);
        s0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + k), s0);
        s1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + TILE_K + k), s1);
        s2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + 2 * TILE_K + k), s2);
        s3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + 3 * TILE_K + k), s3);
      }
      acc[m * TILE_N + n] += hsum(s0);
      acc[m * TILE_N + n + 1] += hsum(s1);
      acc[m * TILE_N + n + 2] += hsum(s2);
      acc[m * TILE_N + n + 3] += hsum(s3);
    }
    for (; n < rows; ++n) {
      __m256 s = _mm256_setzero_ps();
      for (int64_t k = 0; k < kc; k += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(xm + k), _mm256_loadu_ps(buf + n * TILE_K + k), s);
      acc[m * TILE_N + n] += hsum(s);
    }
  }
}
#endif

void gguf_gemm(const float* x, int64_t M, int64_t K, const uint8_t* qweight, int64_t N, int64_t type,
               const float* bias, float* out, bool use_avx2) {
  const int64_t bb = block_bytes(type), row_bytes = K / QK * bb;
  const int64_t tiles = (N + TILE_N - 1) / TILE_N;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(TILE_N * TILE_K), acc(M * TILE_N);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * TILE_N, rows = std::min(TILE_N, N - n0);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t k0 = 0; k0 < K; k0 += TILE_K) {
        const int64_t kc = std::min(TILE_K, K - k0), b0 = k0 / QK, nb = kc / QK;
        const uint8_t* tile = qweight + n0 * row_bytes;
#if defined(__x86_64__)
        if (use_avx2) {
          dequant_tile_avx2(tile, row_bytes, rows, b0, nb, type, bb, buf.data());
          dot_tile_avx2(x + k0, K, M, buf.data(), rows, kc, acc.data());
          continue;
        }
#endif
        for (int64_t n = 0; n < rows; ++n) {
          for (int64_t i = 0; i < nb; ++i) {
            dequant_block_scalar(tile + n * row_bytes + (b0 + i) * bb, type, buf.data() + n * TILE_K + i * QK);
          }
        }
        dot_tile_scalar(x + k0, K, M, buf.data(), rows, kc, acc.data());
      }
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < rows; ++n) {
          out[m * N + n0 + n] = acc[m * TILE_N + n] + (bias ? bias[n0 + n] : 0.f);
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
  CHECK_INPUT(x);
  CHECK_INPUT(qweight);
  const int64_t bb = block_bytes(weight_type);
  TORCH_CHECK(bb > 0, "gguf_mul_mat: ggml type ", weight_type, " is not one of Q4_0 (2), Q4_1 (3), Q8_0 (8)");
  TORCH_CHECK(x.dim() == 2, "gguf_mul_mat: x must be 2-D [M, K], got ", x.dim(), "-D");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte,
              "gguf_mul_mat: qweight must be 2-D uint8 [N, bytes per row], got ", qweight.dim(), "-D ",
              qweight.scalar_type());
  TORCH_CHECK(qweight.size(1) % bb == 0, "gguf_mul_mat: a row of ", qweight.size(1),
              " bytes is not a whole number of ", bb, "-byte blocks");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(K == qweight.size(1) / bb * QK, "gguf_mul_mat: x has K=", K, ", qweight rows hold ",
              qweight.size(1) / bb * QK, " weights");
  const at::Tensor xf = x.to(at::kFloat);
  std::optional<at::Tensor> bf;
  if (bias) {
    TORCH_CHECK(bias->numel() == N, "gguf_mul_mat: bias has ", bias->numel(), " values for N=", N);
    bf = bias->to(at::kFloat).contiguous();
  }
  auto out = at::empty({M, N}, x.options().dtype(at::kFloat));
#if !defined(__x86_64__)
  use_avx2 = false;
#endif
  gguf_gemm(xf.data_ptr<float>(), M, K, qweight.data_ptr<uint8_t>(), N, weight_type,
            bf ? bf->data_ptr<float>() : nullptr, out.data_ptr<float>(), use_avx2);
  return out.to(x.scalar_type());
}

}  // namespace minisgl
