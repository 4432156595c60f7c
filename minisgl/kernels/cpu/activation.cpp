// silu(gate) * up over the gate_up projection's output (mirrors sgl-kernel/csrc/cpu/activation.cpp).
//
// The PyTorch version slices [gate | up] into two strided halves and runs silu and mul as separate
// passes; at prefill sizes those passes cost more than a third of the MLP's GEMM time.
#include "common.h"

namespace minisgl {

at::Tensor silu_and_mul_cpu(const at::Tensor& input) {
  CHECK_CPU(input);
  CHECK_LAST_DIM_CONTIGUOUS(input);
  TORCH_CHECK(input.dim() == 2 && input.size(1) % 2 == 0, "silu_and_mul_cpu: expects [tokens, 2 * d]");
  const int64_t rows = input.size(0), d = input.size(1) / 2, in_stride = input.stride(0);
  at::Tensor out = at::empty({rows, d}, input.options());
  MINISGL_DISPATCH_FLOATING_TYPES(input.scalar_type(), "silu_and_mul_cpu", [&] {
    const scalar_t* x = input.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> gate(d);
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* g = x + r * in_stride;
        const scalar_t* u = g + d;
        _Pragma("omp simd")
        for (int64_t i = 0; i < d; ++i) gate[i] = -static_cast<float>(g[i]);
        exp_and_sum(gate.data(), d, 0.f);  // gate = exp(-g)
        _Pragma("omp simd")
        for (int64_t i = 0; i < d; ++i) {
          // silu(g) = g / (1 + exp(-g)), rounded to the model dtype as F.silu's output is
          const float silu = round_to<scalar_t>(static_cast<float>(g[i]) / (1.f + gate[i]));
          o[r * d + i] = static_cast<scalar_t>(silu * static_cast<float>(u[i]));
        }
      }
    });
  });
  return out;
}

}  // namespace minisgl
