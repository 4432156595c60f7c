// 16-bit GEMM on the CPU's matrix engines, for weights packed in the VNNI layout (mirrors
// sgl-kernel/csrc/cpu/gemm.cpp: convert_weight_packed, tinygemm_kernel_nn, brgemm, can_use_brgemm).
//
// y[M, N] = x[M, K] W[N, K]^T + bias with x, W, y and bias all bf16 (or all fp16). The layout, the
// vdpbf16ps tile and the choice between it and AMX's brgemm are gemm_vnni.h's (shared with moe.cpp).
// Rounding to bf16 happens once, at the store (vcvtne2ps2bf16 rounds to nearest even, as
// .to(torch.bfloat16) does).
//
// Which engine runs is decided per call from the CPU's features (at::cpu::get_cpu_capabilities,
// the same table torch._C._cpu._get_cpu_capability() shows). The AVX-512 functions carry their ISA
// in a target attribute instead of the file's flags, so this file is compiled into every build,
// AVX2 included, and its code is only executed where the CPU has the feature.
#include <algorithm>
#include <optional>

#include "gemm_amx.h"
#include "gemm_vnni.h"

namespace minisgl {
namespace {

// out[r, 0:32] = rows [0, ROWS) of A times one panel + bias, rounded to bf16.
template <int ROWS>
MINISGL_AVX512_BF16 void tile_dpbf16_store(const at::BFloat16* A, int64_t lda, const at::BFloat16* panel, int64_t K,
                                           at::BFloat16* C, int64_t ldc, const at::BFloat16* bias, const char* next) {
  const __m512 b0 = bias ? bf16_to_f32(bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? bf16_to_f32(bias + 16) : _mm512_setzero_ps();
  tile_dpbf16<ROWS>(
      A, lda, panel, K, b0, b1,
      [&](int r, __m512 lo, __m512 hi) MINISGL_AVX512_BF16 {
        _mm512_storeu_si512(C + r * ldc, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
      },
      next);
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

// Units of GEMM_CHUNK_M rows by a run of panels, taken from a shared counter (for_each_unit, as the float32 and
// int8 GEMMs do), or up to STREAM_ROWS rows one run of panels per thread (for_each_gemm_run), and on
// vdpbf16ps up to one tile's DPBF16_ONE_TILE_ROWS: there too each panel is read once, by one tile, so the weights are
// one stream per thread. On a 2-core Zen 4 EPYC, SmolLM2's 120 layer GEMMs and LM head at 8 rows (an EAGLE
// tree of 8 nodes), weights from DRAM, units and runs alternated in one process (12 rounds a run, median of
// the paired ratios): runs took 0.89, 0.93 and 0.95 of the time in three runs, 0.95 at 6 rows. Within a unit
// each panel meets all of the chunk's rows, 32 at a time, before the next panel, so a weight is read from
// memory once per chunk: with row blocks outermost (each thread its own rows, every panel) both threads
// streamed the whole weight, and SmolLM2's 30 layers at 64 rows took 48 ms instead of 21 on AMX (a 2-core
// Xeon; bench_gguf_gemm.py). A thread's units share brgemm's tile configuration, which it releases when done
// (sgl-kernel does the same per parallel_2d range); minisgl's own tiles (amx_tiles) are configured once per
// unit. Those tiles take runs up to a whole chunk, GEMM_CHUNK_M rows: a run's panels meet all of its rows
// before the next, as a unit's do, and the weights stream as one run per thread. On a 2-core Xeon with AMX
// (family 6 model 167), SmolLM2's 120 layer GEMMs on huge pages in a scratch loop, runs and units switched
// per call by a temporary variable and alternated in one process, runs took 0.92, 0.88, 0.93, 0.88 and
// 0.88-0.89 of the time at 8, 12, 16, 32 and 64 rows, 0.89 at 128 (three or four rounds each); inside the engine,
// compiled decode steps (benchmarks/profile_loop.py, three alternations) 0.93 of the replay at 16
// requests and 0.95 at 64.
template <typename scalar_t>
void vnni_gemm(const scalar_t* A, int64_t lda, const scalar_t* B, scalar_t* C, const scalar_t* bias, int64_t M,
               int64_t N, int64_t K, bool use_brgemm, bool amx_tiles) {
  const int64_t stream_rows = amx_tiles ? GEMM_CHUNK_M : use_brgemm ? STREAM_ROWS : DPBF16_ONE_TILE_ROWS;
  for_each_gemm_run(
      M, N / VNNI_BLOCK_N, GEMM_CHUNK_M,
      [&](int64_t m0, int64_t m1, int64_t nb0, int64_t nb1) {
        alignas(64) float scratch[VNNI_BLOCK_M * VNNI_BLOCK_N];
        // With the tiles, a short last group (fewer than 16 rows) is multiplied from a zero-padded copy.
        static thread_local std::vector<at::BFloat16> padded;
        const int64_t tail = (m1 - m0) % AMX_TILE_ROWS, tail_row = m1 - tail;
        if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
          if (amx_tiles) {
            configure_amx_tiles();
            if (tail) {
              padded.assign(AMX_TILE_ROWS * K, at::BFloat16(0.f));
              for (int64_t r = 0; r < tail; ++r) std::copy_n(A + (tail_row + r) * lda, K, padded.data() + r * K);
            }
          }
        }
        for (int64_t nb = nb0; nb < nb1; ++nb) {
          const scalar_t* panel = B + nb * K * VNNI_BLOCK_N;
          const scalar_t* panel_bias = bias ? bias + nb * VNNI_BLOCK_N : nullptr;
          for (int64_t r0 = m0; r0 < m1; r0 += VNNI_BLOCK_M) {
            const int64_t rows = std::min(VNNI_BLOCK_M, m1 - r0);
            scalar_t* out = C + r0 * N + nb * VNNI_BLOCK_N;
            if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
              if (amx_tiles) {
                // Group g of 16 rows: from A, or from the padded copy if it is the short last group.
                const int groups = rows > AMX_TILE_ROWS ? 2 : 1;
                const at::BFloat16* a[2] = {};
                int64_t ld[2] = {};
                for (int g = 0; g < groups; ++g) {
                  const bool short_group = tail && r0 + g * AMX_TILE_ROWS == tail_row;
                  a[g] = short_group ? padded.data() : A + (r0 + g * AMX_TILE_ROWS) * lda;
                  ld[g] = short_group ? K : lda;
                }
                // The first block of a unit or run meets each panel first, from memory, and streams
                // the weights STREAM_PREFETCH_BYTES ahead of itself; the later blocks find the panel in cache.
                const char* next = r0 == m0 ? reinterpret_cast<const char*>(panel) + STREAM_PREFETCH_BYTES : nullptr;
                block_amx_bf16(a, ld, rows, panel, K, scratch, VNNI_BLOCK_N, next);
                store_scratch(scratch, rows, out, N, panel_bias);
                continue;
              }
            }
            if (use_brgemm) {
              at::native::cpublas::brgemm(rows, VNNI_BLOCK_N, K, lda, VNNI_BLOCK_N, VNNI_BLOCK_N, /*add_C=*/false,
                                          A + r0 * lda, panel, scratch);
              store_scratch(scratch, rows, out, N, panel_bias);
            } else if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
              // A unit's panels are consecutive: a block that is one tile prefetches a fixed distance ahead
              // in them at the heights dpbf16_prefetch_ahead() names by vendor (past the last panel too: a
              // prefetch never faults; common.h); without it 9 and 10 rows took 1.6 times as long as in two
              // tiles in a scratch loop, and 1.11 times inside an engine's EAGLE verify. Every tile of the
              // unit's first block, when it takes more than one, prefetches the next panel (gemm_vnni.h).
              const int64_t tile = rows <= DPBF16_ONE_TILE_ROWS ? rows : DPBF16_ROWS;
              const char* next = nullptr;
              if (tile == rows && dpbf16_prefetch_ahead(rows)) {
                next = reinterpret_cast<const char*>(panel) + STREAM_PREFETCH_BYTES;
              } else if (tile < rows && r0 == m0 && nb + 1 < nb1) {
                next = reinterpret_cast<const char*>(panel + K * VNNI_BLOCK_N);
              }
              for (int64_t r = 0; r < rows; r += tile) {
                with_rows<DPBF16_ONE_TILE_ROWS>(std::min<int64_t>(tile, rows - r), [&]<int R>() {
                  tile_dpbf16_store<R>(A + (r0 + r) * lda, lda, panel, K, out + r * N, N, panel_bias, next);
                });
              }
            }
          }
        }
      },
      [&] {
        if (amx_tiles) release_amx_tiles();
        if (use_brgemm) at::native::cpublas::brgemm_release();
      },
      stream_rows);
}

}  // namespace

// W [N, K] -> [N / 32, K / 2, 32, 2]: pure layout, runs on any CPU. The 4-D shape is how
// weight_packed_linear (and apply_linear) tell this layout from the float32-panel one. A stack of
// experts' weights [E, N, K] packs to [E, N / 32, K / 2, 32, 2], each expert as its own [N, K] would
// (what fused_experts_cpu reads; moe.cpp).
at::Tensor convert_weight_packed_vnni(const at::Tensor& weight) {
  CHECK_CPU(weight);
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kHalf,
              "convert_weight_packed_vnni: expects a bfloat16 or float16 weight, got ", weight.scalar_type());
  const int64_t d = weight.dim();
  TORCH_CHECK((d == 2 || d == 3) && weight.size(d - 2) % VNNI_BLOCK_N == 0 && weight.size(d - 1) % 2 == 0,
              "convert_weight_packed_vnni: expects [N, K] or [E, N, K] with N a multiple of ", VNNI_BLOCK_N,
              " and K even, got ", weight.sizes());
  const int64_t E = d == 3 ? weight.size(0) : 1, N = weight.size(d - 2), K = weight.size(d - 1);
  auto packed = weight.reshape({E, N / VNNI_BLOCK_N, VNNI_BLOCK_N, K / 2, 2}).transpose(2, 3).contiguous();
  return d == 3 ? packed : packed.squeeze(0);
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
  const bool amx_path = use_brgemm(e.amx_bf16);  // AMX's tiles here, or brgemm where MINISGL_BRGEMM=1 asks
  const bool brgemm = dtype == at::kBFloat16 ? amx_path && M > 4 : true;
  // bf16 blocks meant for AMX go to minisgl's own tiles (gemm_amx.h), from AMX_TILES_MIN_ROWS rows,
  // unless MINISGL_BRGEMM=1 names oneDNN's brgemm or K is not a whole number of tile rows.
  const bool tiles =
      dtype == at::kBFloat16 && use_own_tiles(amx_path && M >= AMX_TILES_MIN_ROWS, e.amx_bf16, K % AMX_BLOCK_K == 0);
  const at::Tensor a = mat1.stride(1) == 1 ? mat1 : mat1.contiguous();
  at::Tensor out = at::empty({M, N}, mat1.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(dtype, "weight_packed_linear_vnni", [&] {
    vnni_gemm<scalar_t>(a.data_ptr<scalar_t>(), a.stride(0), mat2.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                        bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr, M, N, K, brgemm && !tiles, tiles);
  });
  return out;
}

}  // namespace minisgl
