// Fused MoE for W8A8-int8 experts on AVX512-VNNI (mirrors sgl-kernel/csrc/cpu/moe_int8.cpp:
// fused_experts_int8_kernel_impl): moe.cpp's four steps with the W8A8 GEMM's arithmetic.
//
//   1. route (moe.h); each token's row is quantized once, per token, to int8 (stored + 128, as
//      vpdpbusd takes it; gemm_int8_vnni.cpp), and copied with its scale to its pairs' sorted places;
//   2. gate and up: for each (block, 32 of the I intermediate columns), both products as exact int32
//      sums, rescaled by the row's and the columns' scales, then silu(gate) * up in float32;
//   2b. each pair's I activations quantized per row, as the W8A8 layer quantizes its input;
//   3. down: for each (block, 32 of the H output columns), the int8 product, rescaled, times the
//      pair's routing weight, into y at the pair's own place;
//   4. out[t] = the sum of its k rows of y, rounded once (moe.h).
// The experts' int8 matrices are the W8A8 linear layer's VNNI packing, one stack per projection, with
// their float32 scales per output channel. Where the W8A8 loop over experts (fused_experts_native)
// rounds each GEMM's output to the model dtype, this keeps float32 until the end, so the two differ
// by that rounding. With AMX-int8, blocks that average more than 4 rows go to oneDNN's brgemm
// (sums_int8). Omitted: CPUs without AVX512-VNNI (they keep the loop over experts on gemm_int8.cpp's
// vpmaddwd kernel).
#include <optional>
#include <vector>

#include "gemm_int8_vnni.h"
#include "moe.h"

namespace minisgl {
namespace {

constexpr int64_t COLS = 2 * INT8_PANEL_N;  // a unit's columns: the two panels one tile takes

// scratch[r, 0:32] = rescaled a[r] . w[c] for a block's rows (at most BLOCK_M) and the panel pair at
// `panel`, in float32: exact int32 sums (sums_int8: vpdpbusd, or brgemm), minus the +128 shift's
// compensation, times both scales.
MINISGL_AVX512_VNNI void pair_to_scratch(const uint8_t* a, int64_t lda, const float* a_scale, const int8_t* panel,
                                         int64_t panel_bytes, int64_t K4, const float* w_scale, int64_t rows,
                                         bool brgemm, float* scratch) {
  static_assert(BLOCK_M <= INT8_BRGEMM_ROWS);
  alignas(64) int32_t sums[BLOCK_M * COLS];
  sums_int8(a, lda, panel, panel_bytes, K4, rows, 2, brgemm, sums);
  for (int64_t j = 0; j < 2; ++j) {
    epilogue_int8(sums + j * INT8_PANEL_N, rows, panel + j * panel_bytes + K4 * INT8_ROW_BYTES, a_scale,
                  w_scale + j * INT8_PANEL_N, static_cast<const float*>(nullptr), INT8_PANEL_N,
                  scratch + j * INT8_PANEL_N);
  }
}

// Rows of x [rows, K] (model dtype) quantized to q [rows, K4 * 4] (+128) and scale [rows], in parallel.
template <typename scalar_t>
void quantize_rows(const scalar_t* x, int64_t rows, int64_t K, uint8_t* q, float* scale) {
  const int64_t K4 = (K + 3) / 4;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) scale[r] = quantize_row_u8(x + r * K, K, K4, q + r * K4 * 4);
  });
}

template <typename scalar_t>
void fused_experts_int8(const std::vector<Block>& blocks, const std::vector<int64_t>& sorted, const scalar_t* x,
                        int64_t T, int64_t H, int64_t I, int64_t k, const int8_t* w13, const float* s13,
                        const int8_t* w2, const float* s2, const float* weights, scalar_t* out) {
  const int64_t pairs = T * k, NB = static_cast<int64_t>(blocks.size());
  const int64_t H4 = (H + 3) / 4, I4 = (I + 3) / 4;
  const int64_t bytes13 = (H4 + 1) * INT8_ROW_BYTES, bytes2 = (I4 + 1) * INT8_ROW_BYTES;  // per 16-column panel
  auto xq = at::empty({T, H4 * 4}, at::kByte), xs = at::empty({pairs, H4 * 4}, at::kByte);
  auto x_scale = at::empty({T}, at::kFloat), xs_scale = at::empty({pairs}, at::kFloat);
  auto act = at::empty({pairs, I}, at::kFloat), act_q = at::empty({pairs, I4 * 4}, at::kByte);
  auto act_scale = at::empty({pairs}, at::kFloat), y = at::empty({pairs, H}, at::kFloat);
  uint8_t *xq_ptr = xq.data_ptr<uint8_t>(), *xs_ptr = xs.data_ptr<uint8_t>(), *act_q_ptr = act_q.data_ptr<uint8_t>();
  float *x_scale_ptr = x_scale.data_ptr<float>(), *xs_scale_ptr = xs_scale.data_ptr<float>();
  float *act_ptr = act.data_ptr<float>(), *act_scale_ptr = act_scale.data_ptr<float>(), *y_ptr = y.data_ptr<float>();
  quantize_rows(x, T, H, xq_ptr, x_scale_ptr);
  at::parallel_for(0, pairs, std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t t = sorted[p] / k;
      std::memcpy(xs_ptr + p * H4 * 4, xq_ptr + t * H4 * 4, H4 * 4);
      xs_scale_ptr[p] = x_scale_ptr[t];
    }
  });

  // sgl-kernel's can_use_brgemm<int8_t> on the rows a block averages: AMX-int8 from 5 rows.
  const bool brgemm = use_brgemm(engines().amx_int8) && pairs > 4 * NB;
  const auto release = [brgemm] {
    if (brgemm) at::native::cpublas::brgemm_release();
  };

  // Step 2: act = silu(x W1^T) * (x W3^T), per (block, 32 columns of I).
  const int64_t units_i = I / COLS;
  for_each_index(NB * units_i, [&](int64_t u) {
    const Block& b = blocks[u / units_i];
    const int64_t c0 = u % units_i * COLS;  // the gate columns; the up columns are I further on
    const int8_t* expert = w13 + b.expert * (2 * I / INT8_PANEL_N) * bytes13;
    const float* scales = s13 + b.expert * 2 * I;
    alignas(64) float gate[BLOCK_M * COLS], up[BLOCK_M * COLS];
    const uint8_t* a = xs_ptr + b.start * H4 * 4;
    const float* a_scale = xs_scale_ptr + b.start;
    pair_to_scratch(a, H4 * 4, a_scale, expert + c0 / INT8_PANEL_N * bytes13, bytes13, H4, scales + c0, b.rows,
                    brgemm, gate);
    pair_to_scratch(a, H4 * 4, a_scale, expert + (c0 + I) / INT8_PANEL_N * bytes13, bytes13, H4, scales + c0 + I,
                    b.rows, brgemm, up);
    silu_and_mul_rows<COLS>(gate, up, b.rows, act_ptr + b.start * I + c0, I);
  }, release);
  quantize_rows(act_ptr, pairs, I, act_q_ptr, act_scale_ptr);  // step 2b

  // Step 3: y[pair] = weight * (act W2^T), per (block, 32 columns of H), back in the pairs' own order.
  const int64_t units_h = H / COLS;
  for_each_index(NB * units_h, [&](int64_t u) {
    const Block& b = blocks[u / units_h];
    const int64_t c0 = u % units_h * COLS;
    alignas(64) float scratch[BLOCK_M * COLS];
    pair_to_scratch(act_q_ptr + b.start * I4 * 4, I4 * 4, act_scale_ptr + b.start,
                    w2 + (b.expert * (H / INT8_PANEL_N) + c0 / INT8_PANEL_N) * bytes2, bytes2, I4,
                    s2 + b.expert * H + c0, b.rows, brgemm, scratch);
    store_weighted_rows<COLS>(scratch, b.rows, sorted.data() + b.start, weights, y_ptr + c0, H);
  }, release);

  sum_slots(y_ptr, T, k, H, out);  // step 4
}

}  // namespace

// hidden_states [T, H] in the model dtype; w13 [E, 2I / 16, H / 4 + 1, 64] and w2 [E, H / 16, I / 4 + 1, 64],
// each expert's matrix as convert_weight_packed_int8_vnni packs it, with w13_scale [E, 2I] and
// w2_scale [E, H] (float32, per output channel); topk_weights [T, k] and topk_ids [T, k].
at::Tensor fused_experts_int8_cpu(const at::Tensor& hidden_states, const at::Tensor& w13, const at::Tensor& w13_scale,
                                  const at::Tensor& w2, const at::Tensor& w2_scale, const at::Tensor& topk_weights,
                                  const at::Tensor& topk_ids) {
  CHECK_INPUT(hidden_states);
  CHECK_INPUT(w13);
  CHECK_INPUT(w13_scale);
  CHECK_INPUT(w2);
  CHECK_INPUT(w2_scale);
  TORCH_CHECK(cpu_has_avx512_vnni(), "fused_experts_int8_cpu: needs avx512_vnni, which this CPU lacks");
  TORCH_CHECK(hidden_states.dim() == 2, "fused_experts_int8_cpu: hidden_states must be [T, H], got ",
              hidden_states.sizes());
  const int64_t T = hidden_states.size(0), H = hidden_states.size(1);
  const auto packed = [](const at::Tensor& w) {
    return w.dim() == 4 && w.scalar_type() == at::kChar && w.size(3) == INT8_ROW_BYTES;
  };
  TORCH_CHECK(packed(w13) && packed(w2), "fused_experts_int8_cpu: w13 and w2 must be stacks of int8 experts packed ",
              "by convert_weight_packed_int8_vnni, got ", w13.sizes(), " and ", w2.sizes());
  const int64_t E = w13.size(0), I = w13.size(1) * INT8_PANEL_N / 2;
  TORCH_CHECK(I % COLS == 0 && H % COLS == 0 && w13.size(2) == (H + 3) / 4 + 1,
              "fused_experts_int8_cpu: w13 must hold 2I rows of H = ", H, " columns, I and H multiples of ", COLS,
              ", got ", w13.sizes());
  TORCH_CHECK(w2.size(0) == E && w2.size(1) * INT8_PANEL_N == H && w2.size(2) == (I + 3) / 4 + 1,
              "fused_experts_int8_cpu: w2 must be [E=", E, ", H=", H, ", I=", I, "] packed, got ", w2.sizes());
  TORCH_CHECK(w13_scale.scalar_type() == at::kFloat && w13_scale.numel() == E * 2 * I &&
                  w2_scale.scalar_type() == at::kFloat && w2_scale.numel() == E * H,
              "fused_experts_int8_cpu: the scales must be float32, ", E * 2 * I, " for w13 and ", E * H, " for w2");
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == T && topk_weights.sizes() == topk_ids.sizes(),
              "fused_experts_int8_cpu: topk_weights and topk_ids must both be [T=", T, ", k], got ",
              topk_weights.sizes(), " and ", topk_ids.sizes());
  const auto ids = topk_ids.to(at::kLong).contiguous();
  const auto weights = topk_weights.to(at::kFloat).contiguous();
  const int64_t k = topk_ids.size(1);
  std::vector<int64_t> sorted(T * k);
  const std::vector<Block> blocks = route(ids.data_ptr<int64_t>(), T * k, E, sorted);
  auto out = at::empty_like(hidden_states);
  MINISGL_DISPATCH_FLOATING_TYPES(hidden_states.scalar_type(), "fused_experts_int8_cpu", [&] {
    fused_experts_int8(blocks, sorted, hidden_states.data_ptr<scalar_t>(), T, H, I, k, w13.data_ptr<int8_t>(),
                       w13_scale.data_ptr<float>(), w2.data_ptr<int8_t>(), w2_scale.data_ptr<float>(),
                       weights.data_ptr<float>(), out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace minisgl
