// W8A8-int8 GEMM on AVX512-VNNI (mirrors sgl-kernel/csrc/cpu/gemm_int8.cpp: the VNNI packing of
// convert_weight_packed with its compensation, and tinygemm_kernel_nn's int8 branch).
//
// vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes, adds each group of four products
// together and into one of 16 int32 lanes, without saturating: four k-steps of 16 output columns
// per instruction, 64 products against the 16 of AVX2's _mm256_madd_epi16 (gemm_int8.cpp).
// Its first operand is unsigned, so the activations go in shifted by 128, a + 128 in [1, 255], and
// the shift comes back out exactly: sum_k (a + 128) w = sum_k a w + 128 sum_k w, and 128 sum_k w
// per column (the "compensation") is computed once when the weight is packed. The sums stay
// exact int32, so the result equals the AVX2 path's bit for bit.
//
// Layout, per panel of 16 columns: [K / 4] rows of 64 bytes, row r holding w[c][4r .. 4r + 3] for
// columns c = 0..15 in turn, then one more row holding the 16 int32 compensations; K and N are
// zero-padded to multiples of 4 and 16. The functions carry their ISA in a target attribute (as
// gemm_vnni.cpp does), so the file builds everywhere and runs only where the CPU has the feature.
// What sgl-kernel has and this omits: the AMX-int8 (tdpbusd) path and the fused MoE kernel.
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "common.h"

namespace minisgl {
namespace {

constexpr int64_t PANEL_N = 16;   // columns per panel: one zmm of int32 sums
constexpr int64_t ROW_BYTES = 64;  // one k-quad of a panel
constexpr int TILE_ROWS = 8;       // 8 rows x 2 panels = 16 zmm accumulators, of 32
constexpr int64_t CHUNK_M = 128;   // rows whose activations stay in L2 while every panel passes

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
template <int ROWS, int PANELS>
MINISGL_AVX512_VNNI void tile(const uint8_t* a, int64_t lda, const int8_t* panel, int64_t panel_bytes, int64_t K4,
                              int32_t* sums) {
  static_assert(PANELS == 1 || PANELS == 2);
  __m512i c0[ROWS], c1[ROWS];
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) c0[r] = c1[r] = _mm512_setzero_si512();
  const int8_t* panel1 = panel + (PANELS == 2 ? panel_bytes : 0);
  for (int64_t k4 = 0; k4 < K4; ++k4) {
    const __m512i w0 = _mm512_loadu_si512(panel + k4 * ROW_BYTES);
    const __m512i w1 = PANELS == 2 ? _mm512_loadu_si512(panel1 + k4 * ROW_BYTES) : w0;
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
    _mm512_storeu_si512(sums + r * 2 * PANEL_N, c0[r]);
    _mm512_storeu_si512(sums + r * 2 * PANEL_N + PANEL_N, c1[r]);
  }
}

// out[r][c] = float(sums[r][c] - comp[c]) * a_scale[r] * w_scale[c] + bias[c] for one panel's `cols`
// real columns of 16 (comp sits after the panel's K4 rows); the integer subtraction first, so it is
// exact. The scales and the bias are read in place, masked to the real columns.
template <typename scalar_t>
MINISGL_AVX512_VNNI void epilogue(const int32_t* sums, int64_t rows, const int8_t* comp_row, const float* a_scale,
                                  const float* w_scale, const scalar_t* bias, int64_t cols, float* out) {
  const __mmask16 mask = cols >= PANEL_N ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __m512i comp = _mm512_loadu_si512(comp_row);
  const __m512 ws = _mm512_maskz_loadu_ps(mask, w_scale), b = bias ? load16(bias, mask) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(sums + r * 2 * PANEL_N), comp));
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(s, _mm512_set1_ps(a_scale[r])), ws);
    _mm512_storeu_ps(out + r * 2 * PANEL_N, _mm512_add_ps(y, b));
  }
}

// Rows [m0, m1) against panels [p0, p1), written to y (float32 results go to buf first when the
// output is 16-bit, and to padding columns never).
template <typename out_t>
void gemm_chunk(const uint8_t* a, int64_t lda, const float* a_scale, const int8_t* packed, int64_t panel_bytes,
                int64_t K4, const float* w_scale, const out_t* bias, out_t* y, int64_t N, int64_t m0, int64_t m1,
                int64_t p0, int64_t p1) {
  alignas(64) int32_t sums[TILE_ROWS * 2 * PANEL_N];
  alignas(64) float buf[TILE_ROWS * 2 * PANEL_N];
  for (int64_t p = p0; p < p1; p += 2) {
    const int64_t n0 = p * PANEL_N, panels = p + 2 <= p1 ? 2 : 1, cols = std::min(N - n0, panels * PANEL_N);
    const int8_t* panel = packed + p * panel_bytes;
    for (int64_t m = m0; m < m1; m += TILE_ROWS) {
      const int64_t rows = std::min<int64_t>(TILE_ROWS, m1 - m);
      with_rows<TILE_ROWS>(rows, [&]<int R>() {
        panels == 2 ? tile<R, 2>(a + m * lda, lda, panel, panel_bytes, K4, sums)
                    : tile<R, 1>(a + m * lda, lda, panel, panel_bytes, K4, sums);
      });
      for (int64_t j = 0; j < panels; ++j) {
        const int64_t nj = n0 + j * PANEL_N;
        epilogue(sums + j * PANEL_N, rows, panel + j * panel_bytes + K4 * ROW_BYTES, a_scale + m, w_scale + nj,
                 bias ? bias + nj : nullptr, N - nj, buf + j * PANEL_N);
      }
      for (int64_t r = 0; r < rows; ++r) {
        if constexpr (std::is_same_v<out_t, float>) {
          std::memcpy(y + (m + r) * N + n0, buf + r * 2 * PANEL_N, cols * sizeof(float));
        } else {
          store_row(buf + r * 2 * PANEL_N, y + (m + r) * N + n0, cols);
        }
      }
    }
  }
}

}  // namespace

// [N, K] int8 -> [ceil(N / 16), ceil(K / 4) + 1, 64] int8: pure layout and integer sums, any CPU.
at::Tensor convert_weight_packed_int8_vnni(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar,
              "convert_weight_packed_int8_vnni: expected a 2-D int8 weight, got ", weight.dim(), "-D ",
              weight.scalar_type());
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t panels = (N + PANEL_N - 1) / PANEL_N, K4 = (K + 3) / 4;
  auto w = weight.contiguous();
  auto packed = at::zeros({panels, K4 + 1, ROW_BYTES}, weight.options());
  const int8_t* src = w.data_ptr<int8_t>();
  int8_t* dst = packed.data_ptr<int8_t>();
  for (int64_t n = 0; n < N; ++n) {
    int8_t* panel = dst + (n / PANEL_N) * (K4 + 1) * ROW_BYTES;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      panel[(k / 4) * ROW_BYTES + (n % PANEL_N) * 4 + k % 4] = src[n * K + k];
      sum += src[n * K + k];
    }
    const int32_t comp = 128 * sum;
    std::memcpy(panel + K4 * ROW_BYTES + (n % PANEL_N) * sizeof(int32_t), &comp, sizeof(comp));
  }
  return packed;
}

// int8_scaled_mm_with_quant for a weight from convert_weight_packed_int8_vnni (shapes checked by the caller).
at::Tensor int8_scaled_mm_vnni(const at::Tensor& mat1, const at::Tensor& packed, const at::Tensor& scales2,
                               const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(cpu_has_avx512_vnni(), "int8_scaled_mm_with_quant: a weight packed for VNNI needs avx512_vnni, ",
              "which this CPU lacks (pack it with convert_weight_packed_int8 instead)");
  const int64_t M = mat1.size(0), K = mat1.size(1), N = scales2.numel();
  const int64_t panels = packed.size(0), K4 = packed.size(1) - 1, panel_bytes = (K4 + 1) * ROW_BYTES;
  auto a = at::empty({M, K4 * 4}, mat1.options().dtype(at::kByte));
  auto a_scale = at::empty({M}, mat1.options().dtype(at::kFloat));
  auto out = at::empty({M, N}, mat1.options());
  MINISGL_DISPATCH_FLOATING_TYPES(mat1.scalar_type(), "int8_scaled_mm_vnni", [&] {
    // A decode batch's few rows are quantized on this thread: a parallel region costs more than they do.
    at::parallel_for(0, M, std::max<int64_t>(1, 16384 / K), [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        a_scale.data_ptr<float>()[m] =
            quantize_row_u8(mat1.data_ptr<scalar_t>() + m * K, K, K4, a.data_ptr<uint8_t>() + m * K4 * 4);
      }
    });
    // Units of CHUNK_M rows by a run of panel pairs (a tile takes two panels at a time).
    const int64_t pairs = (panels + 1) / 2;
    for_each_unit(M, pairs, CHUNK_M, [&](int64_t m0, int64_t m1, int64_t pair0, int64_t pair1) {
      gemm_chunk<scalar_t>(a.data_ptr<uint8_t>(), K4 * 4, a_scale.data_ptr<float>(), packed.data_ptr<int8_t>(),
                           panel_bytes, K4, scales2.data_ptr<float>(), bias ? bias->data_ptr<scalar_t>() : nullptr,
                           out.data_ptr<scalar_t>(), N, m0, m1, 2 * pair0, std::min(panels, 2 * pair1));
    });
  });
  return out;
}

}  // namespace minisgl
