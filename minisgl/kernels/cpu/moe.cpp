// Fused MoE for experts packed for minisgl's GEMMs (mirrors sgl-kernel/csrc/cpu/moe.cpp:
// fused_experts_cpu, its moe_align_block_size, and silu_and_mul fused into the first GEMM).
//
//   out[t] = sum_j w[t, j] * W2[e] (silu(W1[e] x[t]) * W3[e] x[t]),  e = topk_ids[t, j]
//
// for every token at once, in four steps and two parallel regions, where fused_experts_native
// (layers/moe/fused_moe_native.py) runs some ten torch operators per chosen expert:
//   1. route (moe.h): the T * k (token, slot) pairs sorted by expert (a counting sort) and cut
//      into blocks of at most BLOCK_M pairs of one expert; each pair's token row is copied into
//      place, so that a block's rows lie next to each other (the Triton kernel reads them through
//      the sorted ids);
//   2. gate and up: for each (block, run of panels of the I intermediate columns), each gate panel
//      and its up panel (I columns further on in W13) into float32, then silu(gate) * up, into
//      act [T * k, I] in sorted order;
//   3. down: for each (block, run of panels of the H output columns), act's rows times W2's panel,
//      times the pair's routing weight, in float32 into y at the pair's own place t * k + j;
//   4. out[t] = y[t * k] + ... + y[t * k + k - 1], rounded to the model dtype.
// The experts come in one of the two layouts a dense weight may have, and each block meets a panel
// through that layout's own tile: bf16 in the matrix engines' VNNI layout (gemm_vnni.h: vdpbf16ps,
// or AMX where blocks average more than 4 rows: gemm_amx.h's tile loop, or brgemm), or float panels
// in any dtype (gemm.h: FMA, activations widened to float32 once, on every CPU the kernels build on).
// sgl-kernel takes bf16, fp16, int8, fp8 and int4 experts, keeps y in the model dtype and gathers a
// block's rows per thread; this keeps y in float32 (one rounding at the end) and gathers them once.
// Omitted here: quantized experts (W8A8's are moe_int8.cpp's; fp8 and int4 nowhere), the shared
// expert kernel, and writing the result in place.
#include <optional>
#include <vector>

#include "gemm.h"
#include "gemm_amx.h"
#include "gemm_vnni.h"
#include "moe.h"

namespace minisgl {
namespace {

static_assert(BLOCK_M == VNNI_BLOCK_M);  // a block is one brgemm call (and three FMA tiles)

// bf16 experts in the VNNI layout [N / 32, K / 2, 32, 2]: a block's rows (bf16) times one panel,
// into float32 scratch rows of `width`. (Each layout's multiply also takes the panel that comes
// next, for the float tiles to prefetch.)
struct VnniExperts {
  using a_t = at::BFloat16;  // what the tile reads as activations
  using w_t = at::BFloat16;
  static constexpr int64_t width = VNNI_BLOCK_N;
  bool use_brgemm;
  bool amx_tiles;  // gemm_amx.h's loop: A needs 32 readable rows from a block's start (fused_experts pads)
  void begin() const {  // at the start of each unit of work
    if (amx_tiles) configure_amx_tiles();
  }
  void multiply(const a_t* A, int64_t lda, const w_t* panel, int64_t rows, int64_t K, float* scratch,
                const w_t* /*next: these tiles do not prefetch*/) const {
    if (!amx_tiles) return panel_to_scratch(A, lda, panel, rows, K, use_brgemm, scratch);
    const at::BFloat16* a[2] = {A, A + AMX_TILE_ROWS * lda};
    const int64_t ld[2] = {lda, lda};
    block_amx_bf16(a, ld, rows, panel, K, scratch);
  }
  void release() const {
    if (amx_tiles) release_amx_tiles();
    if (use_brgemm) at::native::cpublas::brgemm_release();
  }
};

// Experts in float panels [N / BLOCK_N, K, BLOCK_N] of any dtype: a block's rows (float32) times one panel.
template <typename W>
struct PanelExperts {
  using a_t = float;
  using w_t = W;
  static constexpr int64_t width = BLOCK_N;
  void multiply(const float* A, int64_t lda, const w_t* panel, int64_t rows, int64_t K, float* scratch,
                const w_t* next) const {
    gemm_panel(A, lda, panel, K, scratch, width, static_cast<const float*>(nullptr), rows, next);
  }
  void begin() const {}
  void release() const {}
};

template <typename Experts, typename scalar_t>
void fused_experts(const Experts& experts, const std::vector<Block>& blocks, const std::vector<int64_t>& sorted,
                   const scalar_t* x, int64_t T, int64_t H, int64_t I, int64_t k, const typename Experts::w_t* w13,
                   const typename Experts::w_t* w2, const float* weights, scalar_t* out) {
  using a_t = typename Experts::a_t;
  constexpr int64_t W = Experts::width;
  const int64_t pairs = T * k, NB = static_cast<int64_t>(blocks.size());
  const auto a_options = at::TensorOptions().dtype(c10::CppTypeToScalarType<a_t>::value);
  // An AMX tile loads 16 rows whatever a block holds: 16 zero rows past the last pair keep a short
  // last block's loads inside the buffers.
  const int64_t buffer_rows = pairs + AMX_TILE_ROWS;
  auto xs_buf = at::empty({buffer_rows, H}, a_options), act_buf = at::empty({buffer_rows, I}, a_options);
  auto y_buf = at::empty({pairs, H}, at::kFloat);
  a_t* xs = xs_buf.template data_ptr<a_t>();    // the gathered rows
  a_t* act = act_buf.template data_ptr<a_t>();  // silu(gate) * up
  std::memset(xs + pairs * H, 0, AMX_TILE_ROWS * H * sizeof(a_t));
  std::memset(act + pairs * I, 0, AMX_TILE_ROWS * I * sizeof(a_t));
  float* y = y_buf.data_ptr<float>();           // each pair's weighted output
  at::parallel_for(0, pairs, std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) at::vec::convert(x + sorted[p] / k * H, xs + p * H, H);
  });

  // Step 2: act = silu(x W1^T) * (x W3^T), per (block, run of panels of I): a block is the chunk of
  // for_each_unit's units, and within a run each panel prefetches the next one it multiplies.
  const int64_t panels_i = I / W;
  for_each_unit(
      NB, panels_i, 1,
      [&](int64_t b0, int64_t, int64_t p0, int64_t p1) {
        experts.begin();
        const Block& b = blocks[b0];
        const auto* expert = w13 + b.expert * 2 * I * H;
        const a_t* a = xs + b.start * H;
        alignas(64) float gate[BLOCK_M * W], up[BLOCK_M * W];
        for (int64_t p = p0; p < p1; ++p) {
          const auto *gate_panel = expert + p * W * H, *up_panel = expert + (p + panels_i) * W * H;
          experts.multiply(a, H, gate_panel, b.rows, H, gate, up_panel);
          experts.multiply(a, H, up_panel, b.rows, H, up, p + 1 < p1 ? gate_panel + W * H : nullptr);
          silu_and_mul_rows<W>(gate, up, b.rows, act + b.start * I + p * W, I);
        }
      },
      [&] { experts.release(); });

  // Step 3: y[pair] = weight * (act W2^T), per (block, run of panels of H), back in the pairs' own order.
  for_each_unit(
      NB, H / W, 1,
      [&](int64_t b0, int64_t, int64_t p0, int64_t p1) {
        experts.begin();
        const Block& b = blocks[b0];
        alignas(64) float scratch[BLOCK_M * W];
        for (int64_t p = p0; p < p1; ++p) {
          const auto* panel = w2 + (b.expert * H + p * W) * I;
          experts.multiply(act + b.start * I, I, panel, b.rows, I, scratch, p + 1 < p1 ? panel + W * I : nullptr);
          store_weighted_rows<W>(scratch, b.rows, sorted.data() + b.start, weights, y + p * W, H);
        }
      },
      [&] { experts.release(); });

  sum_slots(y, T, k, H, out);  // step 4
}

}  // namespace

// hidden_states [T, H] in the model dtype; w13 and w2 the stacked [E, 2I, H] (gate rows, then up rows)
// and [E, H, I] packed whole, either by convert_weight_packed_vnni (bf16: [E, 2I / 32, H / 2, 32, 2])
// or by convert_weight_packed (float32 or the model dtype: [E, 2I / B, H, B], B = weight_packed_block_n);
// topk_weights [T, k] (any float dtype) and topk_ids [T, k] (int32 or int64).
at::Tensor fused_experts_cpu(const at::Tensor& hidden_states, const at::Tensor& w13, const at::Tensor& w2,
                             const at::Tensor& topk_weights, const at::Tensor& topk_ids) {
  CHECK_INPUT(hidden_states);
  CHECK_INPUT(w13);
  CHECK_INPUT(w2);
  TORCH_CHECK(hidden_states.dim() == 2, "fused_experts_cpu: hidden_states must be [T, H], got ",
              hidden_states.sizes());
  const int64_t T = hidden_states.size(0), H = hidden_states.size(1);
  const bool vnni = w13.dim() == 5;
  const int64_t W = vnni ? VNNI_BLOCK_N : BLOCK_N;
  TORCH_CHECK(w13.dim() == w2.dim() && (vnni || w13.dim() == 4) && w13.size(-1) == (vnni ? 2 : W) &&
                  (!vnni || w13.size(3) == W) && w13.scalar_type() == w2.scalar_type(),
              "fused_experts_cpu: w13 and w2 must be stacks of experts packed whole by convert_weight_packed_vnni ",
              "or convert_weight_packed, got ", w13.sizes(), " and ", w2.sizes());
  const int64_t E = w13.size(0), I = w13.size(1) * W / 2, K13 = vnni ? w13.size(2) * 2 : w13.size(2);
  const int64_t K2 = vnni ? w2.size(2) * 2 : w2.size(2);
  TORCH_CHECK(w13.size(1) % 2 == 0 && K13 == H, "fused_experts_cpu: w13 must hold 2I rows, I a multiple of ", W,
              ", of H = ", H, " columns, got ", w13.sizes());
  TORCH_CHECK(w2.size(0) == E && w2.size(1) * W == H && K2 == I, "fused_experts_cpu: w2 must be [E=", E,
              ", H=", H, ", I=", I, "] packed, got ", w2.sizes());
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == T && topk_weights.sizes() == topk_ids.sizes(),
              "fused_experts_cpu: topk_weights and topk_ids must both be [T=", T, ", k], got ",
              topk_weights.sizes(), " and ", topk_ids.sizes());
  const auto ids = topk_ids.to(at::kLong).contiguous();
  const auto weights = topk_weights.to(at::kFloat).contiguous();
  const int64_t k = topk_ids.size(1), pairs = T * k;
  std::vector<int64_t> sorted(pairs);
  const std::vector<Block> blocks = route(ids.data_ptr<int64_t>(), pairs, E, sorted);
  const auto dtype = hidden_states.scalar_type(), w_dtype = w13.scalar_type();
  auto out = at::empty_like(hidden_states);
  MINISGL_DISPATCH_FLOATING_TYPES(dtype, "fused_experts_cpu", [&] {
    const auto run = [&](const auto& experts) {
      using w_t = typename std::decay_t<decltype(experts)>::w_t;
      fused_experts(experts, blocks, sorted, hidden_states.data_ptr<scalar_t>(), T, H, I, k,
                    static_cast<const w_t*>(w13.data_ptr()), static_cast<const w_t*>(w2.data_ptr()),
                    weights.data_ptr<float>(), out.data_ptr<scalar_t>());
    };
    if (vnni) {
      TORCH_CHECK(dtype == at::kBFloat16 && w_dtype == at::kBFloat16,
                  "fused_experts_cpu: VNNI-packed experts are bf16 and multiply bf16 activations, got ", w_dtype,
                  " experts and ", dtype, " activations");
      TORCH_CHECK(engines().avx512_bf16,
                  "fused_experts_cpu: VNNI-packed experts need avx512_bf16, which this CPU lacks");
      // sgl-kernel's can_use_brgemm on the rows a block averages: AMX tiles from 5 rows.
      // There minisgl's own tiles take the blocks, as in the dense GEMM (gemm_vnni.cpp).
      const bool brgemm = use_brgemm(engines().amx_bf16) && pairs > 4 * static_cast<int64_t>(blocks.size());
      const bool tiles = use_own_tiles(brgemm, engines().amx_bf16, H % AMX_BLOCK_K == 0 && I % AMX_BLOCK_K == 0);
      if constexpr (std::is_same_v<scalar_t, at::BFloat16>) run(VnniExperts{brgemm && !tiles, tiles});
    } else if (w_dtype == at::kFloat) {
      run(PanelExperts<float>{});
    } else {
      TORCH_CHECK(w_dtype == dtype, "fused_experts_cpu: ", w_dtype, " experts multiply float32 or ", w_dtype,
                  " activations, got ", dtype);
      if constexpr (!std::is_same_v<scalar_t, float>) run(PanelExperts<scalar_t>{});
    }
  });
  return out;
}

}  // namespace minisgl
