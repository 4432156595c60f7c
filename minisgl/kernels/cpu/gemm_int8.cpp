// W8A8-int8 GEMM: int8 weights per output channel, int8 activations per token, int32 sums (mirrors
// sgl-kernel/csrc/cpu/gemm_int8.cpp: per_token_quant_int8_cpu, int8_scaled_mm_with_quant, and the
// int8 branch of convert_weight_packed).
//
//   y[m, n] = (sum_k xq[m, k] wq[n, k]) * x_scale[m] * w_scale[n] + bias[n]
//
// xq = round(x / x_scale) with x_scale = max|x[m, :]| / 127 (symmetric, one scale per token, found
// at run time); wq and w_scale come from the checkpoint (or from quantizing a float one at load).
// The sums are exact integers, so the only rounding is the float32 epilogue and the activations'
// quantization, the same as SGLang's.
//
// The multiply: AVX2's _mm256_madd_epi16 on int16 values sign-extended from int8. It multiplies
// 16 pairs of int16 and adds each pair into one int32 lane: lane c gets w[c][k] a[k] + w[c][k+1] a[k+1].
// So the weight is packed with pairs of k side by side, [N / 16][K / 2][16 columns][2], and a row of
// activations is broadcast one pair (one int32) at a time. The faster _mm256_maddubs_epi16
// (u8 x s8 -> saturating int16 pairs) is what sgl-kernel uses with a +128 offset on the
// activations, but 255 x 127 x 2 = 64,770 overflows int16; the instruction it stands in for, VNNI's
// vpdpbusd, accumulates in int32 and does not saturate. llama.cpp's AVX2 dot products stay exact
// without the offset, multiplying |a| by w carrying a's sign (_mm256_sign_epi8), but each product
// then needs a second multiply, by ones, to reach int32: on a Zen 3 core that sequence retires 1.29
// times the multiply-adds of float32 FMAs, this one 1.50-1.54 (benchmarks/isa_peaks.py).
// This is the path of CPUs without AVX512-VNNI; with it, gemm_int8_vnni.cpp multiplies a weight
// packed in k-quads (the layout tells the two apart), and on AMX-int8 hands larger blocks to oneDNN.
// The tile and the quantization sit in gemm_int8.h, which the fused MoE for W8A8 experts shares.
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "gemm_int8.h"

namespace minisgl {
namespace {

// The work is split as the other packed GEMMs split it (for_each_gemm_run): GEMM_CHUNK_M rows by a
// run of consecutive panels per unit, or up to STREAM_ROWS rows one run per thread; the first tile of
// each panel prefetches the next panel of the run, and the later tiles read this one from cache.
// Before, each panel met all M rows, and a prefill's int16 activations (2.4 MB at 2,048 x 576)
// streamed from L3 once per panel.
template <typename out_t>
void int8_gemm(const int16_t* a, const float* a_scale, int64_t M, int64_t K2, const int8_t* packed,
               const float* w_scale, const out_t* bias, out_t* out, int64_t N) {
  const int64_t panels = (N + QBLOCK_N - 1) / QBLOCK_N, panel_bytes = K2 * 2 * QBLOCK_N;
  for_each_gemm_run(M, panels, GEMM_CHUNK_M, [&](int64_t m_begin, int64_t m_end, int64_t p_begin, int64_t p_end) {
    int32_t acc[QMAX_ROWS][QBLOCK_N];
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int8_t* panel = packed + p * panel_bytes;
      const int64_t n0 = p * QBLOCK_N, cols = std::min(QBLOCK_N, N - n0);
      for (int64_t m0 = m_begin; m0 < m_end; m0 += QMAX_ROWS) {
        const int64_t rows = std::min<int64_t>(QMAX_ROWS, m_end - m0);
        const int8_t* next = m0 == m_begin && p + 1 < p_end ? panel + panel_bytes : nullptr;
        with_rows<QMAX_ROWS>(rows, [&]<int R>() { tile<R>(a + m0 * 2 * K2, 2 * K2, panel, K2, acc, next); });
        for (int64_t r = 0; r < rows; ++r) {  // the fused epilogue: both scales, the bias, the dtype
          out_t* y = out + (m0 + r) * N + n0;
          for (int64_t c = 0; c < cols; ++c) {
            float v = static_cast<float>(acc[r][c]) * a_scale[m0 + r] * w_scale[n0 + c];
            y[c] = static_cast<out_t>(bias ? v + static_cast<float>(bias[n0 + c]) : v);
          }
        }
      }
    }
  });
}

}  // namespace

// [N, K] int8 -> [ceil(N / 16), ceil(K / 2), 32] int8, zero-padded (padding columns are never stored).
at::Tensor convert_weight_packed_int8(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar,
              "convert_weight_packed_int8: expected a 2-D int8 weight, got ", weight.dim(), "-D ",
              weight.scalar_type());
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t panels = (N + QBLOCK_N - 1) / QBLOCK_N, K2 = (K + 1) / 2;
  auto w = weight.contiguous();
  auto packed = at::zeros({panels, K2, 2 * QBLOCK_N}, weight.options());
  const int8_t* src = w.data_ptr<int8_t>();
  int8_t* dst = packed.data_ptr<int8_t>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      dst[((n / QBLOCK_N) * K2 + k / 2) * 2 * QBLOCK_N + (n % QBLOCK_N) * 2 + k % 2] = src[n * K + k];
    }
  }
  return packed;
}

// x [M, K] float -> (int8 [M, K], float32 scales [M, 1]), as SGLang's per_token_quant_int8.
std::tuple<at::Tensor, at::Tensor> per_token_quant_int8(const at::Tensor& x) {
  CHECK_INPUT(x);
  TORCH_CHECK(x.dim() == 2, "per_token_quant_int8: expected a 2-D input, got ", x.dim(), "-D");
  const int64_t M = x.size(0), K = x.size(1);
  auto q = at::empty({M, K}, x.options().dtype(at::kChar));
  auto scales = at::empty({M, 1}, x.options().dtype(at::kFloat));
  MINISGL_DISPATCH_FLOATING_TYPES(x.scalar_type(), "per_token_quant_int8", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    int8_t* dst = q.data_ptr<int8_t>();
    float* scale = scales.data_ptr<float>();
    at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
      std::vector<int16_t> row(K + 1);
      for (int64_t m = begin; m < end; ++m) {
        scale[m] = quantize_row(src + m * K, K, row.data());
        std::copy_n(row.begin(), K, dst + m * K);  // narrowing: the values are in [-127, 127]
      }
    });
  });
  return {q, scales};
}

at::Tensor int8_scaled_mm_vnni(const at::Tensor& mat1, const at::Tensor& packed, const at::Tensor& scales2,
                               const std::optional<at::Tensor>& bias);  // gemm_int8_vnni.cpp

// y = quantize(mat1) @ mat2^T, rescaled, + bias, in out_dtype (mat1's dtype in every caller here).
// mat2 is convert_weight_packed_int8's (or _vnni's) output when is_vnni, else a plain [N, K] int8 weight.
at::Tensor int8_scaled_mm_with_quant(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& scales2,
                                     const std::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                                     bool is_vnni) {
  CHECK_INPUT(mat1);
  TORCH_CHECK(mat1.dim() == 2, "int8_scaled_mm_with_quant: mat1 must be 2-D, got ", mat1.dim(), "-D");
  TORCH_CHECK(out_dtype == mat1.scalar_type(), "int8_scaled_mm_with_quant: out_dtype ", out_dtype,
              " differs from mat1's ", mat1.scalar_type());
  const at::Tensor packed = is_vnni ? mat2 : convert_weight_packed_int8(mat2);
  CHECK_INPUT(packed);
  const int64_t M = mat1.size(0), K = mat1.size(1), K2 = (K + 1) / 2;
  const int64_t N = scales2.numel();
  // The last dimension tells the layouts apart: 32 bytes of k-pairs here, 64 of k-quads for VNNI.
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kChar &&
                  (packed.size(2) == 2 * QBLOCK_N || packed.size(2) == 4 * QBLOCK_N),
              "int8_scaled_mm_with_quant: mat2 is not a packed int8 weight");
  const bool vnni = packed.size(2) == 4 * QBLOCK_N;
  const int64_t group = vnni ? 4 : 2, groups = vnni ? packed.size(1) - 1 : packed.size(1);  // + compensation row
  TORCH_CHECK(groups == (K + group - 1) / group, "int8_scaled_mm_with_quant: mat1 has K=", K,
              ", mat2 was packed for K=", group * groups, " (or up to ", group - 1, " less)");
  TORCH_CHECK(packed.size(0) == (N + QBLOCK_N - 1) / QBLOCK_N, "int8_scaled_mm_with_quant: ", N,
              " scales for a weight packed with ", packed.size(0), " panels of ", QBLOCK_N);
  TORCH_CHECK(scales2.scalar_type() == at::kFloat && scales2.is_contiguous(),
              "int8_scaled_mm_with_quant: scales2 must be contiguous float32");
  if (bias) {
    TORCH_CHECK(bias->numel() == N && bias->scalar_type() == mat1.scalar_type() && bias->is_contiguous(),
                "int8_scaled_mm_with_quant: bias must be ", N, " contiguous values of mat1's dtype");
  }
  if (vnni) return int8_scaled_mm_vnni(mat1, packed, scales2, bias);
  auto a = at::empty({M, 2 * K2}, mat1.options().dtype(at::kShort));
  auto a_scale = at::empty({M}, mat1.options().dtype(at::kFloat));
  auto out = at::empty({M, N}, mat1.options());
  MINISGL_DISPATCH_FLOATING_TYPES(mat1.scalar_type(), "int8_scaled_mm_with_quant", [&] {
    at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        a_scale.data_ptr<float>()[m] =
            quantize_row(mat1.data_ptr<scalar_t>() + m * K, K, a.data_ptr<int16_t>() + m * 2 * K2);
      }
    });
    int8_gemm<scalar_t>(a.data_ptr<int16_t>(), a_scale.data_ptr<float>(), M, K2, packed.data_ptr<int8_t>(),
                        scales2.data_ptr<float>(), bias ? bias->data_ptr<scalar_t>() : nullptr,
                        out.data_ptr<scalar_t>(), N);
  });
  return out;
}

}  // namespace minisgl
