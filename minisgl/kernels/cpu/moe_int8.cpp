// Fused MoE for W8A8-int8 experts (mirrors sgl-kernel/csrc/cpu/moe_int8.cpp:
// fused_experts_int8_kernel_impl): moe.cpp's four steps with the W8A8 GEMM's arithmetic.
//
//   1. route (moe.h); each token's row is quantized once, per token, to int8, and copied with its
//      scale to its pairs' sorted places;
//   2. gate and up: for each (block, 32 of the I intermediate columns), both products as exact int32
//      sums, rescaled by the row's and the columns' scales, then silu(gate) * up in float32;
//   2b. each pair's I activations quantized per row, as the W8A8 layer quantizes its input;
//   3. down: for each (block, 32 of the H output columns), the int8 product, rescaled, times the
//      pair's routing weight, into y at the pair's own place;
//   4. out[t] = the sum of its k rows of y, rounded once (moe.h).
// The experts' int8 matrices are the W8A8 linear layer's packing, one stack per projection, with
// their float32 scales per output channel, in either of its layouts, and each layout brings its own
// multiply (a "Layout" below): k-quads for vpdpbusd where the CPU has AVX512-VNNI, activations
// shifted by 128 (gemm_int8_vnni.h; blocks averaging over 4 rows on AMX-int8's brgemm), else k-pairs
// for AVX2's vpmaddwd on int16 activations (gemm_int8.h). Both give the same exact int32 sums. Where
// the W8A8 loop over experts (fused_experts_native) rounds each GEMM's output to the model dtype,
// this keeps float32 until the end, so the two differ by that rounding.
#include <optional>
#include <vector>

#include "gemm_int8.h"
#include "gemm_int8_vnni.h"
#include "moe.h"

namespace minisgl {
namespace {

constexpr int64_t COLS = 2 * INT8_PANEL_N;  // a unit's columns: two panels of 16
static_assert(QBLOCK_N == INT8_PANEL_N);    // both layouts have 16-column panels

// The VNNI layout: a panel is [K / 4 + 1][64] bytes (the last row the +128 shift's compensation),
// an activation row K rounded up to 4 bytes of a + 128.
struct VnniLayout {
  using act_t = uint8_t;
  bool brgemm;  // blocks on oneDNN's brgemm (AMX-int8) rather than vpdpbusd tiles
  static int64_t row(int64_t K) { return (K + 3) / 4 * 4; }
  static int64_t panel_bytes(int64_t K) { return ((K + 3) / 4 + 1) * INT8_ROW_BYTES; }
  template <typename scalar_t>
  static float quantize(const scalar_t* x, int64_t K, act_t* q) {
    return quantize_row_u8(x, K, (K + 3) / 4, q);
  }
  // scratch[r, 0:32] = rescaled a[r] . w[c] for a block's rows (at most BLOCK_M) and the two panels
  // at `panel`: exact int32 sums, minus the compensation, times both scales.
  MINISGL_AVX512_VNNI void to_scratch(const act_t* a, int64_t lda, const float* a_scale, const int8_t* panel,
                                      int64_t K, const float* w_scale, int64_t rows, float* scratch) const {
    static_assert(BLOCK_M <= INT8_BRGEMM_ROWS);
    alignas(64) int32_t sums[BLOCK_M * COLS];
    const int64_t K4 = (K + 3) / 4, bytes = panel_bytes(K);
    sums_int8(a, lda, panel, bytes, K4, rows, 2, brgemm, sums);
    for (int64_t j = 0; j < 2; ++j) {
      epilogue_int8(sums + j * INT8_PANEL_N, rows, panel + j * bytes + K4 * INT8_ROW_BYTES, a_scale,
                    w_scale + j * INT8_PANEL_N, static_cast<const float*>(nullptr), INT8_PANEL_N,
                    scratch + j * INT8_PANEL_N);
    }
  }
  void release() const {
    if (brgemm) at::native::cpublas::brgemm_release();
  }
};

// The AVX2 layout: a panel is [K / 2][32] bytes, an activation row K rounded up to 2 int16 values.
struct PairLayout {
  using act_t = int16_t;
  static int64_t row(int64_t K) { return (K + 1) / 2 * 2; }
  static int64_t panel_bytes(int64_t K) { return (K + 1) / 2 * 2 * QBLOCK_N; }
  template <typename scalar_t>
  static float quantize(const scalar_t* x, int64_t K, act_t* q) {
    return quantize_row(x, K, q);
  }
  void to_scratch(const act_t* a, int64_t lda, const float* a_scale, const int8_t* panel, int64_t K,
                  const float* w_scale, int64_t rows, float* scratch) const {
    int32_t acc[QMAX_ROWS][QBLOCK_N];
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t r0 = 0; r0 < rows; r0 += QMAX_ROWS) {
        const int64_t n = std::min<int64_t>(QMAX_ROWS, rows - r0);
        const int8_t* panel_j = panel + j * panel_bytes(K);
        with_rows<QMAX_ROWS>(n, [&]<int R>() { tile<R>(a + r0 * lda, lda, panel_j, (K + 1) / 2, acc); });
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t c = 0; c < QBLOCK_N; ++c) {  // the GEMM's epilogue, its float32 operations in its order
            scratch[(r0 + r) * COLS + j * QBLOCK_N + c] =
                static_cast<float>(acc[r][c]) * a_scale[r0 + r] * w_scale[j * QBLOCK_N + c];
          }
        }
      }
    }
  }
  void release() const {}
};

// Rows of x [rows, K] (model dtype) quantized to q [rows, Layout::row(K)] and scale [rows], in parallel.
template <typename Layout, typename scalar_t>
void quantize_rows(const scalar_t* x, int64_t rows, int64_t K, typename Layout::act_t* q, float* scale) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) scale[r] = Layout::quantize(x + r * K, K, q + r * Layout::row(K));
  });
}

template <typename Layout, typename scalar_t>
void fused_experts_int8(const Layout& layout, const std::vector<Block>& blocks, const std::vector<int64_t>& sorted,
                        const scalar_t* x, int64_t T, int64_t H, int64_t I, int64_t k, const int8_t* w13,
                        const float* s13, const int8_t* w2, const float* s2, const float* weights, scalar_t* out) {
  using act_t = typename Layout::act_t;
  const int64_t pairs = T * k, NB = static_cast<int64_t>(blocks.size());
  const int64_t rowH = Layout::row(H), rowI = Layout::row(I);
  const int64_t bytes13 = Layout::panel_bytes(H), bytes2 = Layout::panel_bytes(I);  // per 16-column panel
  const auto act_dtype = sizeof(act_t) == 1 ? at::kByte : at::kShort;
  auto xq = at::empty({T, rowH}, act_dtype), xs = at::empty({pairs, rowH}, act_dtype);
  auto x_scale = at::empty({T}, at::kFloat), xs_scale = at::empty({pairs}, at::kFloat);
  auto act = at::empty({pairs, I}, at::kFloat), act_q = at::empty({pairs, rowI}, act_dtype);
  auto act_scale = at::empty({pairs}, at::kFloat), y = at::empty({pairs, H}, at::kFloat);
  act_t *xq_ptr = static_cast<act_t*>(xq.data_ptr()), *xs_ptr = static_cast<act_t*>(xs.data_ptr());
  act_t* act_q_ptr = static_cast<act_t*>(act_q.data_ptr());
  float *x_scale_ptr = x_scale.data_ptr<float>(), *xs_scale_ptr = xs_scale.data_ptr<float>();
  float *act_ptr = act.data_ptr<float>(), *act_scale_ptr = act_scale.data_ptr<float>(), *y_ptr = y.data_ptr<float>();
  quantize_rows<Layout>(x, T, H, xq_ptr, x_scale_ptr);
  at::parallel_for(0, pairs, std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t t = sorted[p] / k;
      std::memcpy(xs_ptr + p * rowH, xq_ptr + t * rowH, rowH * sizeof(act_t));
      xs_scale_ptr[p] = x_scale_ptr[t];
    }
  });
  const auto release = [&layout] { layout.release(); };

  // Step 2: act = silu(x W1^T) * (x W3^T), per (block, 32 columns of I).
  const int64_t units_i = I / COLS;
  for_each_index(
      NB * units_i,
      [&](int64_t u) {
        const Block& b = blocks[u / units_i];
        const int64_t c0 = u % units_i * COLS;  // the gate columns; the up columns are I further on
        const int8_t* expert = w13 + b.expert * (2 * I / INT8_PANEL_N) * bytes13;
        const float* scales = s13 + b.expert * 2 * I;
        alignas(64) float gate[BLOCK_M * COLS], up[BLOCK_M * COLS];
        const act_t* a = xs_ptr + b.start * rowH;
        const float* a_scale = xs_scale_ptr + b.start;
        layout.to_scratch(a, rowH, a_scale, expert + c0 / INT8_PANEL_N * bytes13, H, scales + c0, b.rows, gate);
        layout.to_scratch(a, rowH, a_scale, expert + (c0 + I) / INT8_PANEL_N * bytes13, H, scales + c0 + I, b.rows,
                          up);
        silu_and_mul_rows<COLS>(gate, up, b.rows, act_ptr + b.start * I + c0, I);
      },
      release);
  quantize_rows<Layout>(act_ptr, pairs, I, act_q_ptr, act_scale_ptr);  // step 2b

  // Step 3: y[pair] = weight * (act W2^T), per (block, 32 columns of H), back in the pairs' own order.
  const int64_t units_h = H / COLS;
  for_each_index(
      NB * units_h,
      [&](int64_t u) {
        const Block& b = blocks[u / units_h];
        const int64_t c0 = u % units_h * COLS;
        alignas(64) float scratch[BLOCK_M * COLS];
        layout.to_scratch(act_q_ptr + b.start * rowI, rowI, act_scale_ptr + b.start,
                          w2 + (b.expert * (H / INT8_PANEL_N) + c0 / INT8_PANEL_N) * bytes2, I, s2 + b.expert * H + c0,
                          b.rows, scratch);
        store_weighted_rows<COLS>(scratch, b.rows, sorted.data() + b.start, weights, y_ptr + c0, H);
      },
      release);

  sum_slots(y_ptr, T, k, H, out);  // step 4
}

}  // namespace

// hidden_states [T, H] in the model dtype; w13 [E, 2I / 16, G, B] and w2 [E, H / 16, G', B], each
// expert's matrix as the W8A8 layer packs it: by convert_weight_packed_int8_vnni (B = 64 bytes of
// k-quads, G = K / 4 + 1 with the compensation row) or by convert_weight_packed_int8 (B = 32 bytes
// of k-pairs, G = K / 2); w13_scale [E, 2I] and w2_scale [E, H] (float32, per output channel);
// topk_weights [T, k] and topk_ids [T, k].
at::Tensor fused_experts_int8_cpu(const at::Tensor& hidden_states, const at::Tensor& w13, const at::Tensor& w13_scale,
                                  const at::Tensor& w2, const at::Tensor& w2_scale, const at::Tensor& topk_weights,
                                  const at::Tensor& topk_ids) {
  CHECK_INPUT(hidden_states);
  CHECK_INPUT(w13);
  CHECK_INPUT(w13_scale);
  CHECK_INPUT(w2);
  CHECK_INPUT(w2_scale);
  TORCH_CHECK(hidden_states.dim() == 2, "fused_experts_int8_cpu: hidden_states must be [T, H], got ",
              hidden_states.sizes());
  const int64_t T = hidden_states.size(0), H = hidden_states.size(1);
  const bool vnni = w13.dim() == 4 && w13.size(3) == INT8_ROW_BYTES;  // the last dimension tells the layouts apart
  const int64_t row_bytes = vnni ? INT8_ROW_BYTES : 2 * QBLOCK_N;
  const auto packed = [row_bytes](const at::Tensor& w) {
    return w.dim() == 4 && w.scalar_type() == at::kChar && w.size(3) == row_bytes;
  };
  TORCH_CHECK(packed(w13) && packed(w2), "fused_experts_int8_cpu: w13 and w2 must be stacks of int8 experts packed ",
              "alike by convert_weight_packed_int8_vnni or convert_weight_packed_int8, got ", w13.sizes(), " and ",
              w2.sizes());
  TORCH_CHECK(!vnni || cpu_has_avx512_vnni(), "fused_experts_int8_cpu: experts packed for VNNI need avx512_vnni, ",
              "which this CPU lacks (pack them with convert_weight_packed_int8 instead)");
  const auto groups = [vnni](int64_t K) { return vnni ? (K + 3) / 4 + 1 : (K + 1) / 2; };
  const int64_t E = w13.size(0), I = w13.size(1) * INT8_PANEL_N / 2;
  TORCH_CHECK(I % COLS == 0 && H % COLS == 0 && w13.size(2) == groups(H),
              "fused_experts_int8_cpu: w13 must hold 2I rows of H = ", H, " columns, I and H multiples of ", COLS,
              ", got ", w13.sizes());
  TORCH_CHECK(w2.size(0) == E && w2.size(1) * INT8_PANEL_N == H && w2.size(2) == groups(I),
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
  // sgl-kernel's can_use_brgemm<int8_t> on the rows a block averages: AMX-int8 from 5 rows (k-quads only).
  const bool brgemm =
      vnni && use_brgemm(engines().amx_int8, /*int8=*/true) && T * k > 4 * static_cast<int64_t>(blocks.size());
  auto out = at::empty_like(hidden_states);
  MINISGL_DISPATCH_FLOATING_TYPES(hidden_states.scalar_type(), "fused_experts_int8_cpu", [&] {
    const auto run = [&](const auto& layout) {
      fused_experts_int8(layout, blocks, sorted, hidden_states.data_ptr<scalar_t>(), T, H, I, k,
                         w13.data_ptr<int8_t>(), w13_scale.data_ptr<float>(), w2.data_ptr<int8_t>(),
                         w2_scale.data_ptr<float>(), weights.data_ptr<float>(), out.data_ptr<scalar_t>());
    };
    vnni ? run(VnniLayout{brgemm}) : run(PairLayout{});
  });
  return out;
}

}  // namespace minisgl
