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
// With AMX-int8, blocks of more than 4 rows go to AMX tiles instead, minisgl's own (gemm_amx.h) or
// oneDNN's brgemm (sums_int8), which read the same panels; the fused MoE for these weights is moe_int8.cpp.
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <optional>

#include "gemm_amx.h"
#include "gemm_int8_vnni.h"

namespace minisgl {
namespace {

// Rows [m0, m1) against panels [p0, p1), written to y (float32 results go to buf first when the
// output is 16-bit, and to padding columns never): vpdpbusd tiles of 8 rows, or blocks of up to 32
// with `brgemm` (sums_int8) or on minisgl's own AMX tiles (`amx_tiles`, gemm_amx.h).
template <typename out_t>
void gemm_chunk(const uint8_t* a, int64_t lda, const float* a_scale, const int8_t* packed, int64_t panel_bytes,
                int64_t K4, const float* w_scale, const out_t* bias, out_t* y, int64_t N, int64_t m0, int64_t m1,
                int64_t p0, int64_t p1, bool brgemm, bool amx_tiles) {
  alignas(64) int32_t sums[INT8_BRGEMM_ROWS * 2 * INT8_PANEL_N];
  alignas(64) float buf[INT8_BRGEMM_ROWS * 2 * INT8_PANEL_N];
  const int64_t block = brgemm || amx_tiles ? INT8_BRGEMM_ROWS : INT8_TILE_ROWS;
  for (int64_t p = p0; p < p1; p += 2) {
    const int64_t n0 = p * INT8_PANEL_N, panels = p + 2 <= p1 ? 2 : 1, cols = std::min(N - n0, panels * INT8_PANEL_N);
    const int8_t* panel = packed + p * panel_bytes;
    for (int64_t m = m0; m < m1; m += block) {
      const int64_t rows = std::min(block, m1 - m);
      if (amx_tiles) {
        const uint8_t* rows_a = a + m * lda;
        // As the bf16 tiles (gemm_vnni.cpp): the first block streams the pair's k-quads ahead of itself.
        const int8_t* nx = m == m0 ? panel + STREAM_PREFETCH_BYTES : nullptr;
        if (rows > AMX_TILE_ROWS) {
          panels == 2 ? tile_amx_int8<2, 2>(rows_a, lda, panel, panel_bytes, K4, sums, nx)
                      : tile_amx_int8<2, 1>(rows_a, lda, panel, panel_bytes, K4, sums, nx);
        } else {
          panels == 2 ? tile_amx_int8<1, 2>(rows_a, lda, panel, panel_bytes, K4, sums, nx)
                      : tile_amx_int8<1, 1>(rows_a, lda, panel, panel_bytes, K4, sums, nx);
        }
      } else {
        // A unit's pairs are consecutive: a tile of few rows prefetches the next pair (where that
        // pair is a single panel, the second prefetch reads past it: prefetches never fault), and
        // so does the unit's first block, whether more follow or it is the only one: the later
        // blocks read this pair from cache, and without the prefetch the memory sat idle while
        // they did. On a 2-core Zen 4 EPYC (no AMX), SmolLM2's 120 layer GEMMs with and without,
        // alternated nine times in one process (median of the paired ratios): 16 rows 0.86, 32
        // rows 0.90, 64 rows 0.93, 128 rows 0.96 of the time. A lone block of 5 to 8 rows (a
        // batch of 5 to 8 decodes, an EAGLE verify) in one run of pairs per thread: see
        // int8_scaled_mm_vnni. With AMX, blocks of more rows take the tiles above.
        const bool ahead = rows <= INT8_PREFETCH_ROWS || m == m0;
        const int8_t* next = ahead && p + 2 < p1 ? panel + 2 * panel_bytes : nullptr;
        sums_int8(a + m * lda, lda, panel, panel_bytes, K4, rows, panels, brgemm, sums, next);
      }
      for (int64_t j = 0; j < panels; ++j) {
        const int64_t nj = n0 + j * INT8_PANEL_N;
        epilogue_int8(sums + j * INT8_PANEL_N, rows, panel + j * panel_bytes + K4 * INT8_ROW_BYTES, a_scale + m,
                      w_scale + nj, bias ? bias + nj : nullptr, N - nj, buf + j * INT8_PANEL_N);
      }
      for (int64_t r = 0; r < rows; ++r) {
        if constexpr (std::is_same_v<out_t, float>) {
          std::memcpy(y + (m + r) * N + n0, buf + r * 2 * INT8_PANEL_N, cols * sizeof(float));
        } else {
          store_row(buf + r * 2 * INT8_PANEL_N, y + (m + r) * N + n0, cols);
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
  const int64_t panels = (N + INT8_PANEL_N - 1) / INT8_PANEL_N, K4 = (K + 3) / 4;
  auto w = weight.contiguous();
  auto packed = at::zeros({panels, K4 + 1, INT8_ROW_BYTES}, weight.options());
  const int8_t* src = w.data_ptr<int8_t>();
  int8_t* dst = packed.data_ptr<int8_t>();
  for (int64_t n = 0; n < N; ++n) {
    int8_t* panel = dst + (n / INT8_PANEL_N) * (K4 + 1) * INT8_ROW_BYTES;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      panel[(k / 4) * INT8_ROW_BYTES + (n % INT8_PANEL_N) * 4 + k % 4] = src[n * K + k];
      sum += src[n * K + k];
    }
    const int32_t comp = 128 * sum;
    std::memcpy(panel + K4 * INT8_ROW_BYTES + (n % INT8_PANEL_N) * sizeof(int32_t), &comp, sizeof(comp));
  }
  return packed;
}

// int8_scaled_mm_with_quant for a weight from convert_weight_packed_int8_vnni (shapes checked by the caller).
at::Tensor int8_scaled_mm_vnni(const at::Tensor& mat1, const at::Tensor& packed, const at::Tensor& scales2,
                               const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(cpu_has_avx512_vnni(), "int8_scaled_mm_with_quant: a weight packed for VNNI needs avx512_vnni, ",
              "which this CPU lacks (pack it with convert_weight_packed_int8 instead)");
  const int64_t M = mat1.size(0), K = mat1.size(1), N = scales2.numel();
  const int64_t panels = packed.size(0), K4 = packed.size(1) - 1, panel_bytes = (K4 + 1) * INT8_ROW_BYTES;
  // sgl-kernel's can_use_brgemm<int8_t>: AMX-int8 from 5 rows; there minisgl's own tiles take the
  // blocks (gemm_amx.h) unless MINISGL_BRGEMM=1 names oneDNN's brgemm or K is not whole tile rows.
  const bool brgemm = use_brgemm(engines().amx_int8, /*int8=*/true) && M > 4;
  const bool tiles = use_own_tiles(brgemm, engines().amx_int8, K4 % AMX_BLOCK_K4 == 0);
  // A tile loads 16 rows: the quantized copy gets zero rows up to a multiple of 16 for the last block.
  const int64_t a_rows = tiles ? (M + AMX_TILE_ROWS - 1) / AMX_TILE_ROWS * AMX_TILE_ROWS : M;
  auto a = at::empty({a_rows, K4 * 4}, mat1.options().dtype(at::kByte));
  std::memset(a.data_ptr<uint8_t>() + M * K4 * 4, 128, (a_rows - M) * K4 * 4);  // zeros, with the +128 shift
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
    // Units of GEMM_CHUNK_M rows by a run of panel pairs (a tile takes two panels at a time); up to one
    // vpdpbusd tile's rows (STREAM_ROWS with oneDNN's brgemm), one run of pairs per thread, each pair read once
    // by one tile, as gemm_vnni.cpp does for bf16. On a 2-core Zen 4 EPYC, SmolLM2's 120 layer
    // GEMMs (107 MB of int8 weights on huge pages, a scratch loop, the two rules switched per call
    // by a temporary environment variable, alternated 15 times): at 8 rows the run with the next
    // pair prefetched took 0.68-0.69 of the time of units without it (runs alone 0.94, the
    // prefetch alone 0.87), at 5 rows 0.71, at 6 rows 0.73. minisgl's own AMX tiles take runs up to a
    // whole chunk, as the bf16 tiles do (gemm_vnni.cpp): on a 2-core Xeon with AMX (family 6 model 167),
    // compiled W8A8 decode steps (benchmarks/profile_loop.py, alternated twice) took 0.97 of the replay at
    // 16 and at 64 requests.
    const int64_t stream_rows = tiles ? GEMM_CHUNK_M : brgemm ? STREAM_ROWS : INT8_TILE_ROWS;
    const int64_t pairs = (panels + 1) / 2;
    for_each_gemm_run(
        M, pairs, GEMM_CHUNK_M,
        [&](int64_t m0, int64_t m1, int64_t pair0, int64_t pair1) {
          if (tiles) configure_amx_tiles();
          gemm_chunk<scalar_t>(a.data_ptr<uint8_t>(), K4 * 4, a_scale.data_ptr<float>(), packed.data_ptr<int8_t>(),
                               panel_bytes, K4, scales2.data_ptr<float>(),
                               bias ? bias->data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(), N, m0, m1,
                               2 * pair0, std::min(panels, 2 * pair1), brgemm && !tiles, tiles);
        },
        [&] {
          if (tiles) release_amx_tiles();
          if (brgemm && !tiles) at::native::cpublas::brgemm_release();
        },
        stream_rows);
  });
  return out;
}

}  // namespace minisgl
