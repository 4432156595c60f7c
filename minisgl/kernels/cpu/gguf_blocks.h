// llama.cpp's block types as minisgl's two GGUF GEMMs read them: gemm_gguf.cpp (weight-only, float
// activations) and gemm_gguf_vec.cpp (activations quantized to int8 per block, integer dot products).
//
// A row of qweight is K / 32 blocks of 32 weights each (ggml-common.h):
//   Q8_0: fp16 d, int8 qs[32]                w = qs[j] d
//   Q4_0: fp16 d, uint8 qs[16]               w = (nibble - 8) d
//   Q4_1: fp16 d, fp16 m, uint8 qs[16]       w = nibble d + m
// where byte j of qs holds weight j in its low nibble and weight j + 16 in its high nibble.
#pragma once

#include <c10/util/Half.h>

#include <cstring>
#include <optional>

#include "common.h"

#if defined(__x86_64__)
// The vector paths are compiled through a target attribute, so that every x86 build contains them;
// the caller decides per call (use_avx2, from kernels/cpu/features.py) whether this CPU may run them.
#define MINISGL_AVX2_FMA __attribute__((target("avx2,fma,f16c")))
#endif

namespace minisgl::gguf {

// ggml's type ids (gguf.GGMLQuantizationType): the ones the kernels multiply.
constexpr int64_t GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8;
constexpr int64_t QK = 32;  // weights per block, for all three types

constexpr int64_t block_bytes(int64_t type) {
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

// What both ops check of their arguments (op: the name errors start with). Returns the bias widened
// to float32 and made contiguous, when there is one.
inline std::optional<at::Tensor> check_args(const char* op, const at::Tensor& x, const at::Tensor& qweight,
                                            int64_t weight_type, const std::optional<at::Tensor>& bias) {
  CHECK_INPUT(x);
  CHECK_INPUT(qweight);
  const int64_t bb = block_bytes(weight_type);
  TORCH_CHECK(bb > 0, op, ": ggml type ", weight_type, " is not one of Q4_0 (2), Q4_1 (3), Q8_0 (8)");
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got ", x.dim(), "-D");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte, op,
              ": qweight must be 2-D uint8 [N, bytes per row], got ", qweight.dim(), "-D ", qweight.scalar_type());
  TORCH_CHECK(qweight.size(1) % bb == 0, op, ": a row of ", qweight.size(1), " bytes is not a whole number of ", bb,
              "-byte blocks");
  TORCH_CHECK(x.size(1) == qweight.size(1) / bb * QK, op, ": x has K=", x.size(1), ", qweight rows hold ",
              qweight.size(1) / bb * QK, " weights");
  if (!bias) return std::nullopt;
  TORCH_CHECK(bias->numel() == qweight.size(0), op, ": bias has ", bias->numel(), " values for N=", qweight.size(0));
  return bias->to(at::kFloat).contiguous();
}

// The shell both GGUF ops share: check the arguments, widen x to float32, run
// gemm(x, M, K, qweight, N, bias, y, use_avx2) into a float32 y [M, N], return y in x's dtype.
template <typename Gemm>
at::Tensor run_op(const char* op, const at::Tensor& x, const at::Tensor& qweight, int64_t weight_type,
                  const std::optional<at::Tensor>& bias, bool use_avx2, Gemm gemm) {
  const std::optional<at::Tensor> bf = check_args(op, x, qweight, weight_type, bias);
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  const at::Tensor xf = x.to(at::kFloat);
  auto out = at::empty({M, N}, x.options().dtype(at::kFloat));
#if !defined(__x86_64__)
  use_avx2 = false;
#endif
  gemm(xf.data_ptr<float>(), M, K, qweight.data_ptr<uint8_t>(), N, bf ? bf->data_ptr<float>() : nullptr,
       out.data_ptr<float>(), use_avx2);
  return out.to(x.scalar_type());
}

// gemm_gguf_vnni.cpp: the one-row Q4_0 / Q4_1 dot products on AVX512-VNNI, two blocks per vpdpbusd.
// Whether they run here for this type and this many blocks per row (an even number);
bool gemv_pairs_vnni_runs(int64_t type, int64_t nb);
// the one activation row's int8 blocks q, copied into the order the weights' nibbles unpack to;
void permute_pairs(const int8_t* q, int64_t nb, int8_t* xp);
// out[n] for the rows n in [n0, n1), two at a time (n1 - n0 even), ds the blocks' (dx, dx sx).
void gemv_pairs_vnni(int64_t type, const uint8_t* qweight, int64_t row_bytes, const int8_t* xp, const float* ds,
                     int64_t nb, int64_t n0, int64_t n1, float* out);

#if defined(__x86_64__)
// The sum of a vector's 8 floats.
MINISGL_AVX2_FMA inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace minisgl::gguf
