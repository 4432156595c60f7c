// Fused MoE for bf16 experts packed for the matrix engines (mirrors sgl-kernel/csrc/cpu/moe.cpp:
// fused_experts_cpu, its moe_align_block_size, and silu_and_mul fused into the first GEMM).
//
//   out[t] = sum_j w[t, j] * W2[e] (silu(W1[e] x[t]) * W3[e] x[t]),  e = topk_ids[t, j]
//
// for every token at once, in four steps and two parallel regions, where fused_experts_native
// (layers/moe/fused_moe_native.py) runs some ten torch operators per chosen expert:
//   1. route: the T * k (token, slot) pairs sorted by expert (a counting sort) and cut into blocks
//      of at most BLOCK_M pairs of one expert; each pair's token row is copied into place, so that
//      a block's rows lie next to each other (the Triton kernel reads them through the sorted ids);
//   2. gate and up: for each (block, panel of 32 of the I intermediate columns), the gate panel and
//      its up panel (I columns further on in W13) into float32, then silu(gate) * up, rounded once to
//      bf16, into act [T * k, I] in sorted order;
//   3. down: for each (block, panel of 32 of the H output columns), act's rows times W2's panel, times
//      the pair's routing weight, in float32 into y at the pair's own place t * k + j;
//   4. out[t] = y[t * k] + ... + y[t * k + k - 1], rounded to bf16.
// Steps 2 and 3 multiply on gemm_vnni.h's engines (AMX's brgemm where blocks average more than 4
// rows and the CPU has it, vdpbf16ps otherwise), units taken from a shared counter (for_each_index).
// sgl-kernel keeps y in bf16 and gathers a block's rows per thread; this keeps y in float32 (one
// rounding at the end) and gathers them once. Omitted: int8, fp8 and int4 experts, fp16, the shared
// expert kernel, and writing the result in place.
#include <optional>
#include <vector>

#include "gemm_vnni.h"

namespace minisgl {
namespace {

constexpr int64_t BLOCK_M = VNNI_BLOCK_M;  // pairs per block: one brgemm call

struct Block {
  int64_t expert, start, rows;  // rows [start, start + rows) of the sorted pairs
};

// Step 1: sorted[p] = the pair (t * k + j) at sorted place p, grouped by expert in expert order,
// and the blocks that cut each expert's group. An expert nobody chose has no block.
std::vector<Block> route(const int64_t* ids, int64_t pairs, int64_t E, std::vector<int64_t>& sorted) {
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < E, "fused_experts_cpu: topk_ids holds expert ", ids[i], ", outside [0, ", E,
                ")");
    ++start[ids[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) sorted[next[ids[i]]++] = i;
  std::vector<Block> blocks;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = start[e]; s < start[e + 1]; s += BLOCK_M) blocks.push_back({e, s, std::min(BLOCK_M, start[e + 1] - s)});
  }
  return blocks;
}

// act[r, 0:32] = silu(gate[r]) * up[r] for a block's rows, from float32 scratch rows of 32.
void silu_and_mul_rows(const float* gate, const float* up, int64_t rows, at::BFloat16* act, int64_t ld) {
  using Vec = at::vec::Vectorized<float>;
  alignas(64) float buf[VNNI_BLOCK_N];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < VNNI_BLOCK_N; c += Vec::size()) {
      const Vec g = Vec::loadu(gate + r * VNNI_BLOCK_N + c), u = Vec::loadu(up + r * VNNI_BLOCK_N + c);
      (g / (Vec(1.f) + g.neg().exp()) * u).store(buf + c);
    }
    store_row(buf, act + r * ld, VNNI_BLOCK_N);
  }
}

}  // namespace

// hidden_states [T, H] bf16; w13 [E, 2I / 32, H / 2, 32, 2] and w2 [E, H / 32, I / 2, 32, 2], bf16 from
// convert_weight_packed_vnni on the stacked [E, 2I, H] (gate rows, then up rows) and [E, H, I];
// topk_weights [T, k] (float32, or any float dtype) and topk_ids [T, k] (int32 or int64).
at::Tensor fused_experts_cpu(const at::Tensor& hidden_states, const at::Tensor& w13, const at::Tensor& w2,
                             const at::Tensor& topk_weights, const at::Tensor& topk_ids) {
  CHECK_INPUT(hidden_states);
  CHECK_INPUT(w13);
  CHECK_INPUT(w2);
  TORCH_CHECK(hidden_states.dim() == 2 && hidden_states.scalar_type() == at::kBFloat16,
              "fused_experts_cpu: hidden_states must be [T, H] bfloat16, got ", hidden_states.dim(), "-D ",
              hidden_states.scalar_type());
  TORCH_CHECK(engines().avx512_bf16, "fused_experts_cpu: needs avx512_bf16, which this CPU lacks");
  const int64_t T = hidden_states.size(0), H = hidden_states.size(1);
  const auto packed = [](const at::Tensor& w) {
    return w.dim() == 5 && w.scalar_type() == at::kBFloat16 && w.size(3) == VNNI_BLOCK_N && w.size(4) == 2;
  };
  TORCH_CHECK(packed(w13) && packed(w2), "fused_experts_cpu: w13 and w2 must be bf16 stacks of experts from ",
              "convert_weight_packed_vnni, got ", w13.sizes(), " and ", w2.sizes());
  const int64_t E = w13.size(0), I = w13.size(1) * VNNI_BLOCK_N / 2;
  TORCH_CHECK(w13.size(1) % 2 == 0 && w13.size(2) * 2 == H,
              "fused_experts_cpu: w13 must hold 2I rows with I a multiple of 32 and H = ", H, " columns, got ",
              w13.sizes());
  TORCH_CHECK(w2.size(0) == E && w2.size(1) * VNNI_BLOCK_N == H && w2.size(2) * 2 == I,
              "fused_experts_cpu: w2 must be [E=", E, ", H=", H, ", I=", I, "] packed, got ", w2.sizes());
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == T && topk_weights.sizes() == topk_ids.sizes(),
              "fused_experts_cpu: topk_weights and topk_ids must both be [T=", T, ", k], got ",
              topk_weights.sizes(), " and ", topk_ids.sizes());
  const int64_t k = topk_ids.size(1), pairs = T * k;
  const auto ids = topk_ids.to(at::kLong).contiguous();
  const auto weights = topk_weights.to(at::kFloat).contiguous();

  std::vector<int64_t> sorted(pairs);
  const std::vector<Block> blocks = route(ids.data_ptr<int64_t>(), pairs, E, sorted);
  const int64_t NB = static_cast<int64_t>(blocks.size());
  const auto* x = hidden_states.data_ptr<at::BFloat16>();
  auto xs = at::empty({pairs, H}, hidden_states.options());
  auto* xs_ptr = xs.data_ptr<at::BFloat16>();
  at::parallel_for(0, pairs, std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) std::memcpy(xs_ptr + p * H, x + sorted[p] / k * H, H * sizeof(at::BFloat16));
  });
  // sgl-kernel's can_use_brgemm on the rows a block averages: AMX tiles from 5 rows.
  const bool use_brgemm = engines().amx_bf16 && pairs > 4 * NB;
  const auto release = [&] {
    if (use_brgemm) at::native::cpublas::brgemm_release();
  };

  // Step 2: act = silu(x W1^T) * (x W3^T), per (block, panel of I).
  auto act = at::empty({pairs, I}, hidden_states.options());
  auto* act_ptr = act.data_ptr<at::BFloat16>();
  const auto* w13_ptr = w13.data_ptr<at::BFloat16>();
  const int64_t panels_i = I / VNNI_BLOCK_N;
  for_each_index(
      NB * panels_i,
      [&](int64_t u) {
        const Block& b = blocks[u / panels_i];
        const int64_t p = u % panels_i;
        const at::BFloat16* expert = w13_ptr + b.expert * 2 * I * H;
        alignas(64) float gate[BLOCK_M * VNNI_BLOCK_N], up[BLOCK_M * VNNI_BLOCK_N];
        const at::BFloat16* a = xs_ptr + b.start * H;
        panel_to_scratch(a, H, expert + p * VNNI_BLOCK_N * H, b.rows, H, use_brgemm, gate);
        panel_to_scratch(a, H, expert + (p + panels_i) * VNNI_BLOCK_N * H, b.rows, H, use_brgemm, up);
        silu_and_mul_rows(gate, up, b.rows, act_ptr + b.start * I + p * VNNI_BLOCK_N, I);
      },
      release);

  // Step 3: y[pair] = weight * (act W2^T), per (block, panel of H), back in the pairs' own order.
  auto y = at::empty({pairs, H}, hidden_states.options().dtype(at::kFloat));
  auto* y_ptr = y.data_ptr<float>();
  const auto* w2_ptr = w2.data_ptr<at::BFloat16>();
  const auto* weight_ptr = weights.data_ptr<float>();
  const int64_t panels_h = H / VNNI_BLOCK_N;
  for_each_index(
      NB * panels_h,
      [&](int64_t u) {
        const Block& b = blocks[u / panels_h];
        const int64_t p = u % panels_h;
        alignas(64) float scratch[BLOCK_M * VNNI_BLOCK_N];
        panel_to_scratch(act_ptr + b.start * I, I, w2_ptr + (b.expert * H + p * VNNI_BLOCK_N) * I, b.rows, I,
                         use_brgemm, scratch);
        for (int64_t r = 0; r < b.rows; ++r) {
          const int64_t pair = sorted[b.start + r];
          at::vec::map([w = weight_ptr[pair]](auto v) { return v * decltype(v)(w); }, y_ptr + pair * H + p * VNNI_BLOCK_N,
                       scratch + r * VNNI_BLOCK_N, VNNI_BLOCK_N);
        }
      },
      release);

  // Step 4: each token's k weighted outputs summed in float32, rounded once.
  auto out = at::empty_like(hidden_states);
  auto* out_ptr = out.data_ptr<at::BFloat16>();
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> sum(H);
    for (int64_t t = t0; t < t1; ++t) {
      std::copy_n(y_ptr + t * k * H, H, sum.data());
      for (int64_t j = 1; j < k; ++j) {
        at::vec::map2([](auto a, auto b) { return a + b; }, sum.data(), sum.data(), y_ptr + (t * k + j) * H, H);
      }
      store_row(sum.data(), out_ptr + t * H, H);
    }
  });
  return out;
}

}  // namespace minisgl
