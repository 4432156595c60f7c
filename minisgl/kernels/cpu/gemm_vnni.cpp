// 16-bit GEMM on the CPU's matrix engines, for weights packed in the VNNI layout (mirrors
// sgl-kernel/csrc/cpu/gemm.cpp: convert_weight_packed, tinygemm_kernel_nn, brgemm, can_use_brgemm).
//
// y[M, N] = x[M, K] W[N, K]^T + bias with x, W, y and bias all bf16 (or all fp16). The weight is packed
// once as [N / 32][K / 2][32][2]: per panel of 32 output columns, one k-pair of every column sits in
// 32 bits, which is what both engines read:
//   - AVX512-BF16: vdpbf16ps multiplies 16 such pairs by one broadcast pair of x and adds both
//     products into 16 float32 lanes (tile_dpbf16; sgl-kernel's tinygemm_kernel_nn);
//   - AMX: at::native::cpublas::brgemm hands a block of rows and a panel to oneDNN's brgemm
//     ukernel, which multiplies them with tile instructions into a float32 scratch (sgl-kernel's
//     brgemm<>), and the scratch is rounded to the output dtype with the bias added.
// As in sgl-kernel, brgemm takes M > 4 rows for bf16 (below that, setting up the tiles costs more
// than vdpbf16ps) and every M for fp16 (which has no vdpbf16ps counterpart; AMX-FP16 only).
//
// Which engine runs is decided per call from the CPU's features (at::cpu::get_cpu_capabilities,
// the same table torch._C._cpu._get_cpu_capability() shows). The AVX-512 functions carry their ISA
// in a target attribute instead of the file's flags, so this file is compiled into every build,
// AVX2 included, and its code is only executed where the CPU has the feature.
#include <ATen/cpu/Utils.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "common.h"

namespace minisgl {
namespace {

constexpr int64_t VNNI_BLOCK_N = 32;  // columns per panel: two zmm registers of float32 results
constexpr int64_t VNNI_BLOCK_M = 32;  // rows per brgemm call (two AMX tiles of 16 rows)
// Rows per vdpbf16ps tile: 16 accumulators. sgl-kernel tiles 1-4 rows (8 accumulators); on an AVX-512
// AMD EPYC (Zen 5 flags) 8 rows took the 64-row GEMMs of SmolLM2's layers from about 600 to 850 GFLOP/s,
// since 8 chains of dependent vdpbf16ps leave the two pipes waiting on the instruction's latency.
constexpr int DPBF16_ROWS = 8;

struct Engines {
  bool avx512_bf16, amx_bf16, amx_fp16;
};

// Asked once: the answer cannot change while the process runs.
const Engines& engines() {
  static const Engines e = [] {
    // AMX also needs the kernel's permission to use the tile registers; init_amx asks for it.
    const bool amx = cpu_has("amx_tile") && at::cpu::init_amx();
    return Engines{cpu_has_avx512_bf16(), amx && cpu_has("amx_bf16"), amx && cpu_has("amx_fp16")};
  }();
  return e;
}

// 16 bf16 values widened to float32 (exact): the bias, as the accumulators' starting value.
MINISGL_AVX512_BF16 inline __m512 bf16_to_f32(const at::BFloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// C[ROWS, 32] = A[ROWS, K] panel + bias, by vdpbf16ps. Every k-step loads one 32-bit pair of A per
// row (broadcast to all lanes) and the panel's 64 values for that pair; rounding to bf16 happens once,
// at the store (vcvtne2ps2bf16 rounds to nearest even, as .to(torch.bfloat16) does).
template <int ROWS>
MINISGL_AVX512_BF16 void tile_dpbf16(const at::BFloat16* A, int64_t lda, const at::BFloat16* panel, int64_t K,
                                     at::BFloat16* C, int64_t ldc, const at::BFloat16* bias) {
  __m512 c0[ROWS], c1[ROWS];
  const __m512 b0 = bias ? bf16_to_f32(bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? bf16_to_f32(bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) {
    c0[r] = b0;
    c1[r] = b1;
  }
  for (int64_t k2 = 0; k2 < K / 2; ++k2) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + k2 * 2 * VNNI_BLOCK_N);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + k2 * 2 * VNNI_BLOCK_N + VNNI_BLOCK_N);
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      int32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * k2, sizeof(pair));  // x[r, 2 k2] and x[r, 2 k2 + 1]
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      c0[r] = _mm512_dpbf16_ps(c0[r], a, w0);
      c1[r] = _mm512_dpbf16_ps(c1[r], a, w1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) _mm512_storeu_si512(C + r * ldc, (__m512i)_mm512_cvtne2ps_pbh(c1[r], c0[r]));
}

// out[m, 0:32] = scratch[m, 0:32] + bias, rounded to bf16 or fp16, for the brgemm path.
MINISGL_AVX512_BF16 void store_scratch(const float* scratch, int64_t rows, at::BFloat16* C, int64_t ldc,
                                       const at::BFloat16* bias) {
  const __m512 b0 = bias ? bf16_to_f32(bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? bf16_to_f32(bias + 16) : _mm512_setzero_ps();
  for (int64_t m = 0; m < rows; ++m) {
    const __m512 lo = _mm512_add_ps(_mm512_loadu_ps(scratch + m * VNNI_BLOCK_N), b0);
    const __m512 hi = _mm512_add_ps(_mm512_loadu_ps(scratch + m * VNNI_BLOCK_N + 16), b1);
    _mm512_storeu_si512(C + m * ldc, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

MINISGL_AVX512_BF16 void store_scratch(const float* scratch, int64_t rows, at::Half* C, int64_t ldc,
                                       const at::Half* bias) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t h = 0; h < VNNI_BLOCK_N; h += 16) {
      __m512 v = _mm512_loadu_ps(scratch + m * VNNI_BLOCK_N + h);
      if (bias) v = _mm512_add_ps(v, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(bias + h))));
      _mm256_storeu_si256((__m256i*)(C + m * ldc + h), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
  }
}

// Every (row block, panel) pair is one unit of work; a thread's units share its scratch and its
// AMX tile configuration, which it releases when done (sgl-kernel does the same per parallel_2d range).
template <typename scalar_t>
void vnni_gemm(const scalar_t* A, int64_t lda, const scalar_t* B, scalar_t* C, const scalar_t* bias, int64_t M,
               int64_t N, int64_t K, bool use_brgemm) {
  const int64_t NB = N / VNNI_BLOCK_N, MB = (M + VNNI_BLOCK_M - 1) / VNNI_BLOCK_M;
  at::parallel_for(0, MB * NB, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float scratch[VNNI_BLOCK_M * VNNI_BLOCK_N];
    for (int64_t u = begin; u < end; ++u) {
      const int64_t m0 = u / NB * VNNI_BLOCK_M, nb = u % NB, rows = std::min(VNNI_BLOCK_M, M - m0);
      const scalar_t* panel = B + nb * K * VNNI_BLOCK_N;
      scalar_t* out = C + m0 * N + nb * VNNI_BLOCK_N;
      const scalar_t* panel_bias = bias ? bias + nb * VNNI_BLOCK_N : nullptr;
      if (use_brgemm) {
        at::native::cpublas::brgemm(rows, VNNI_BLOCK_N, K, lda, VNNI_BLOCK_N, VNNI_BLOCK_N, /*add_C=*/false,
                                    A + m0 * lda, panel, scratch);
        store_scratch(scratch, rows, out, N, panel_bias);
      } else if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
        for (int64_t r = 0; r < rows; r += DPBF16_ROWS) {
          with_rows<DPBF16_ROWS>(std::min<int64_t>(DPBF16_ROWS, rows - r), [&]<int R>() {
            tile_dpbf16<R>(A + (m0 + r) * lda, lda, panel, K, out + r * N, N, panel_bias);
          });
        }
      }
    }
    if (use_brgemm) at::native::cpublas::brgemm_release();
  });
}

}  // namespace

// W [N, K] -> [N / 32, K / 2, 32, 2]: pure layout, runs on any CPU. The 4-D shape is how
// weight_packed_linear (and apply_linear) tell this layout from the float32-panel one.
at::Tensor convert_weight_packed_vnni(const at::Tensor& weight) {
  CHECK_CPU(weight);
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kHalf,
              "convert_weight_packed_vnni: expects a bfloat16 or float16 weight, got ", weight.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % VNNI_BLOCK_N == 0 && weight.size(1) % 2 == 0,
              "convert_weight_packed_vnni: expects [N, K] with N a multiple of ", VNNI_BLOCK_N,
              " and K even, got ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  return weight.reshape({N / VNNI_BLOCK_N, VNNI_BLOCK_N, K / 2, 2}).transpose(1, 2).contiguous();
}

at::Tensor weight_packed_linear_vnni(const at::Tensor& mat1, const at::Tensor& mat2,
                                     const std::optional<at::Tensor>& bias) {
  CHECK_CPU(mat1);
  CHECK_INPUT(mat2);
  const auto dtype = mat2.scalar_type();
  TORCH_CHECK(mat1.dim() == 2 && mat2.dim() == 4 && mat2.size(2) == VNNI_BLOCK_N && mat2.size(3) == 2,
              "weight_packed_linear: expects mat1 [M, K] and mat2 from convert_weight_packed_vnni");
  TORCH_CHECK(mat1.scalar_type() == dtype, "weight_packed_linear: a VNNI-packed ", dtype, " weight multiplies ",
              dtype, " activations, got ", mat1.scalar_type());
  TORCH_CHECK(mat1.size(1) == 2 * mat2.size(1), "weight_packed_linear: mat1 has K=", mat1.size(1), ", mat2 has K=",
              2 * mat2.size(1));
  const int64_t M = mat1.size(0), K = mat1.size(1), N = mat2.size(0) * VNNI_BLOCK_N;
  if (bias.has_value()) {
    CHECK_INPUT(*bias);
    TORCH_CHECK(bias->numel() == N, "weight_packed_linear: bias has ", bias->numel(), " values for N=", N);
    TORCH_CHECK(bias->scalar_type() == dtype, "weight_packed_linear: bias is ", bias->scalar_type(),
                ", activations are ", dtype);
  }
  const Engines& e = engines();
  // sgl-kernel's can_use_brgemm: bf16 from 5 rows, fp16 always.
  // vdpbf16ps's ISA also rounds brgemm's float32 results to bf16, so bf16 needs it either way.
  const bool runs = dtype == at::kBFloat16 ? e.avx512_bf16 : e.amx_fp16;
  TORCH_CHECK(runs, "weight_packed_linear: a VNNI-packed ", dtype, " weight needs ",
              dtype == at::kBFloat16 ? "avx512_bf16" : "amx_fp16",
              ", which this CPU lacks (pack it with convert_weight_packed instead)");
  const bool use_brgemm = dtype == at::kBFloat16 ? e.amx_bf16 && M > 4 : true;
  const at::Tensor a = mat1.stride(1) == 1 ? mat1 : mat1.contiguous();
  at::Tensor out = at::empty({M, N}, mat1.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(dtype, "weight_packed_linear_vnni", [&] {
    vnni_gemm<scalar_t>(a.data_ptr<scalar_t>(), a.stride(0), mat2.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                        bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr, M, N, K, use_brgemm);
  });
  return out;
}

}  // namespace minisgl
