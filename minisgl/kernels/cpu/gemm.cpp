// Dense GEMM for linear layers, on a weight packed once into column panels (mirrors
// sgl-kernel/csrc/cpu/gemm.cpp: convert_weight_packed and weight_packed_linear).
//
// y[M, N] = x[M, K] W[N, K]^T + bias. convert_weight_packed lays W out as [N / 32][K][32]: panel j
// holds output columns 32j..32j+31, and one k-step of it is 32 consecutive floats, two AVX-512
// registers. A tile of up to 12 rows of x keeps 12 x 2 accumulators in registers (24 of the 32)
// while it walks one panel front to back; the other tiles of the same rows walk it again from cache.
//
// Why not oneDNN, which minisgl used before: in decode a GEMM has few rows (one per running
// request) and its weights come from DRAM, not cache. oneDNN ran those at 150-200 GFLOP/s on a
// 2-core Xeon whose float32 peak is about 310, leaving the FMA units idle while weights arrived.
// Here, while the tiles multiply panel j, they prefetch panel j + 1 into L2, spread evenly over
// their k-steps, so loading the next panel overlaps computing this one. That lifted decode-sized
// GEMMs to 1.3-1.7x oneDNN's rate, within reach of the peak at 64 rows (benchmarks/roofline.py
// prints both). At prefill sizes, where the weights stay in cache, oneDNN is still 4-6% faster.
//
// What SGLang's version has and this one omits: bf16/fp16 weights in the VNNI layout multiplied
// by AMX tiles (brgemm), and int8/fp8 weights. Here weights are float32 (16-bit ones are upcast
// when packed; exact, since every bf16 value is a float32 value) and 16-bit activations are
// upcast per call. AVX-512 only: elsewhere minisgl keeps oneDNN.
#include "common.h"

#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>

#include <optional>

namespace minisgl {
namespace {

// Columns per panel: two 16-float registers. (48-column panels with 8-row tiles measured about 4%
// faster on prefill-sized GEMMs, the same on decode-sized ones, but would need N % 48 == 0, which
// Qwen's vocabulary of 151,936 is not; 32 divides every N of SmolLM2, Qwen2.5-0.5B and Qwen3-0.6B.)
constexpr int64_t BLOCK_N = 32;
constexpr int MAX_ROWS = 12;  // rows per tile: 12 x 2 accumulators + 2 weight registers + 1 broadcast
// Large M (prefill) goes in chunks of 128 rows: all tiles of a chunk re-read a panel while it is
// still in L2 (a 576-deep panel is 72 KiB), and the chunk's rows stay there too. On 2,048 rows,
// whole-M passes or 256-row chunks measured 5-10% slower; blocking K as well gained nothing.
constexpr int64_t CHUNK_M = 128;

// Stores 32 float32 results as out_t: a 16-bit output is rounded (to nearest even, as .to() does)
// straight from the registers instead of in a second pass over a float32 copy.
template <typename out_t>
inline void store_32(out_t* dst, __m512 lo, __m512 hi) {
  if constexpr (std::is_same_v<out_t, float>) {
    _mm512_storeu_ps(dst, lo);
    _mm512_storeu_ps(dst + 16, hi);
  } else {  // the same conversion store_row (common.h) uses
    at::vec::convert_from_float<out_t>(at::vec::Vectorized<float>(lo), at::vec::Vectorized<float>(hi)).store(dst);
  }
}

// C[ROWS, 32] = A[ROWS, K] B[K, 32] + bias. ROWS is a template parameter so the accumulators are
// registers. Meanwhile, k-step k prefetches the line at `next + (k * next_step >> 16)` and the one
// after it (16.16 fixed point: a tile shares its panel's prefetch work with the others, see gemm_rows).
// Kept out of line: inlined into gemm_rows, all twelve heights at once, it measured about 5% slower.
template <int ROWS, typename out_t>
__attribute__((noinline)) void tile(const float* __restrict A, int64_t lda, const float* __restrict B, int64_t K,
                                    out_t* __restrict C, int64_t ldc, const float* __restrict bias, const float* next,
                                    int64_t next_step) {
  __m512 c0[ROWS], c1[ROWS];
#pragma GCC unroll 12
  for (int i = 0; i < ROWS; ++i) {
    c0[i] = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    c1[i] = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_loadu_ps(B + k * BLOCK_N);
    const __m512 b1 = _mm512_loadu_ps(B + k * BLOCK_N + 16);
    if (next) {  // into L2 (T1): L1 is too small to hold it until its turn
      const float* line = next + ((k * next_step) >> 16);
      _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(line + 16), _MM_HINT_T1);
    }
#pragma GCC unroll 12
    for (int i = 0; i < ROWS; ++i) {
      const __m512 a = _mm512_set1_ps(A[i * lda + k]);
      c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < ROWS; ++i) store_32(C + i * ldc, c0[i], c1[i]);
}

// Rows [m_begin, m_end) against panels [nb_begin, nb_end) of NB. Within a panel the rows go in tiles
// of nearly equal height (64 rows: 11, 11, 11, 11, 10, 10). Tile t of T prefetches the t-th T-th
// of the next panel, 32 / T floats per k-step, so the next panel is in L2 once this one is done.
template <typename out_t>
void gemm_rows(const float* A, int64_t lda, const float* B, out_t* C, int64_t N, int64_t K, const float* bias,
               int64_t m_begin, int64_t m_end, int64_t nb_begin, int64_t nb_end, int64_t NB) {
  const int64_t tiles = (m_end - m_begin + MAX_ROWS - 1) / MAX_ROWS;
  const int64_t panel_size = K * BLOCK_N;
  for (int64_t nb = nb_begin; nb < nb_end; ++nb) {
    const float* panel = B + nb * panel_size;
    const float* panel_bias = bias ? bias + nb * BLOCK_N : nullptr;
    int64_t m = m_begin;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t height = (m_end - m + (tiles - t) - 1) / (tiles - t);
      const float* next = nb + 1 < NB ? panel + panel_size + t * panel_size / tiles : nullptr;
      with_rows<MAX_ROWS>(height, [&]<int R>() {
        tile<R>(A + m * lda, lda, panel, K, C + m * N + nb * BLOCK_N, N, panel_bias, next, (BLOCK_N << 16) / tiles);
      });
      m += height;
    }
  }
}

}  // namespace

// W [N, K] in any float dtype -> float32 panels [N / 32, K, 32]. The 3-D shape is how apply_linear
// tells a packed weight from a plain one.
at::Tensor convert_weight_packed(const at::Tensor& weight) {
  CHECK_CPU(weight);
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % BLOCK_N == 0,
              "convert_weight_packed: expects [N, K] with N a multiple of ", BLOCK_N, ", got ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  return weight.to(at::kFloat).reshape({N / BLOCK_N, BLOCK_N, K}).transpose(1, 2).contiguous();
}

at::Tensor weight_packed_linear(const at::Tensor& mat1, const at::Tensor& mat2, const std::optional<at::Tensor>& bias) {
  CHECK_CPU(mat1);
  CHECK_INPUT(mat2);
  TORCH_CHECK(mat1.dim() == 2 && mat2.dim() == 3 && mat2.size(2) == BLOCK_N && mat2.scalar_type() == at::kFloat,
              "weight_packed_linear: expects mat1 [M, K] and mat2 from convert_weight_packed");
  TORCH_CHECK(mat1.size(1) == mat2.size(1), "weight_packed_linear: mat1 has K=", mat1.size(1), ", mat2 has K=",
              mat2.size(1));
  // 16-bit activations are upcast here and the result rounded back as it is stored: the same as
  // multiplying the float32 copy of their weights, which is what the packed panels are.
  const at::Tensor a = mat1.scalar_type() == at::kFloat && mat1.stride(1) == 1 ? mat1 : mat1.to(at::kFloat).contiguous();
  const int64_t M = a.size(0), K = a.size(1), NB = mat2.size(0), N = NB * BLOCK_N;
  at::Tensor b_float;
  if (bias.has_value()) {
    CHECK_CPU(*bias);
    TORCH_CHECK(bias->numel() == N, "weight_packed_linear: bias has ", bias->numel(), " values for N=", N);
    b_float = bias->to(at::kFloat).contiguous();
  }
  at::Tensor out = at::empty({M, N}, mat1.options());
  const float* A = a.data_ptr<float>();
  const float* B = mat2.data_ptr<float>();
  const float* bias_ptr = b_float.defined() ? b_float.data_ptr<float>() : nullptr;
  MINISGL_DISPATCH_FLOATING_TYPES(out.scalar_type(), "weight_packed_linear", [&] {
    scalar_t* C = out.data_ptr<scalar_t>();
    // Threads split the panels, so each streams its own share of the weight.
    for (int64_t m0 = 0; m0 < M; m0 += CHUNK_M) {
      const int64_t m1 = std::min(M, m0 + CHUNK_M);
      at::parallel_for(0, NB, 1, [&](int64_t nb_begin, int64_t nb_end) {
        gemm_rows(A, a.stride(0), B, C, N, K, bias_ptr, m0, m1, nb_begin, nb_end, NB);
      });
    }
  });
  return out;
}

}  // namespace minisgl

#endif  // CPU_CAPABILITY_AVX512
