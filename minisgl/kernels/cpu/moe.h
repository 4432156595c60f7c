// What both fused MoE kernels (moe.cpp for float experts, moe_int8.cpp for W8A8 ones) share: the
// routing of step 1 (sgl-kernel's moe_align_block_size, as a counting sort), the activation of
// step 2, the weighted store of step 3 and the sum of step 4, all in float32.
#pragma once

#include <vector>

#include "common.h"

namespace minisgl {

constexpr int64_t BLOCK_M = 32;  // (token, slot) pairs per block, all routed to one expert

struct Block {
  int64_t expert, start, rows;  // rows [start, start + rows) of the sorted pairs
};

// Step 1: sorted[p] = the pair (t * k + j) at sorted place p, grouped by expert in expert order,
// and the blocks that cut each expert's group. An expert nobody chose has no block.
inline std::vector<Block> route(const int64_t* ids, int64_t pairs, int64_t E, std::vector<int64_t>& sorted) {
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < E, "fused MoE: topk_ids holds expert ", ids[i], ", outside [0, ", E, ")");
    ++start[ids[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) sorted[next[ids[i]]++] = i;
  std::vector<Block> blocks;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = start[e]; s < start[e + 1]; s += BLOCK_M) {
      blocks.push_back({e, s, std::min(BLOCK_M, start[e + 1] - s)});
    }
  }
  return blocks;
}

// dst[0:n] = src[0:n] as T (a float32 row is stored as is: store_row leaves float32 to its caller).
template <typename T>
inline void store_floats(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy_n(src, n, dst);
  } else {
    store_row(src, dst, n);
  }
}

// act[r, 0:width] = silu(gate[r]) * up[r] for a block's rows, from float32 scratch rows of `width`.
template <int64_t width, typename a_t>
void silu_and_mul_rows(const float* gate, const float* up, int64_t rows, a_t* act, int64_t ld) {
  using Vec = at::vec::Vectorized<float>;
  alignas(64) float buf[width];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; c += Vec::size()) {
      const Vec g = Vec::loadu(gate + r * width + c), u = Vec::loadu(up + r * width + c);
      (g / (Vec(1.f) + g.neg().exp()) * u).store(buf + c);
    }
    store_floats(buf, act + r * ld, width);
  }
}

// y[pair, 0:width] = weights[pair] * scratch[r] for a block's rows r, pair = pairs[r]: step 3's
// results back at each (token, slot) pair's own row of y (ld = H), times its routing weight.
template <int64_t width>
void store_weighted_rows(const float* scratch, int64_t rows, const int64_t* pairs, const float* weights, float* y,
                         int64_t ld) {
  using Vec = at::vec::Vectorized<float>;
  for (int64_t r = 0; r < rows; ++r) {
    const Vec w(weights[pairs[r]]);
    for (int64_t c = 0; c < width; c += Vec::size()) {
      (Vec::loadu(scratch + r * width + c) * w).store(y + pairs[r] * ld + c);
    }
  }
}

// Step 4: out[t] = y[t * k] + ... + y[t * k + k - 1], each token's weighted outputs summed in
// float32 and rounded once.
template <typename scalar_t>
void sum_slots(const float* y, int64_t T, int64_t k, int64_t H, scalar_t* out) {
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> sum(H);
    for (int64_t t = t0; t < t1; ++t) {
      std::copy_n(y + t * k * H, H, sum.data());
      for (int64_t j = 1; j < k; ++j) {
        at::vec::map2([](auto a, auto b) { return a + b; }, sum.data(), sum.data(), y + (t * k + j) * H, H);
      }
      store_floats(sum.data(), out + t * H, H);
    }
  });
}

}  // namespace minisgl
