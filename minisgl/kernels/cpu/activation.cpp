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
    using Vec = at::vec::Vectorized<float>;
    at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> gate_buf(d), up_buf(d), silu(d), out_buf(d);
      for (int64_t r = begin; r < end; ++r) {
        const float* g = as_float(x + r * in_stride, gate_buf.data(), d);
        const float* u = as_float(x + r * in_stride + d, up_buf.data(), d);
        // silu(g) = g / (1 + exp(-g)), rounded to the model dtype as F.silu's output is
        int64_t i = 0;
        for (; i + Vec::size() <= d; i += Vec::size()) {
          const Vec gv = Vec::loadu(g + i);
          (gv / (Vec(1.f) + gv.neg().exp_u20())).store(silu.data() + i);
        }
        for (; i < d; ++i) silu[i] = g[i] / (1.f + std::exp(-g[i]));
        round_in_place<scalar_t>(silu.data(), d);
        float* out_f = float_out(o + r * d, out_buf.data());
        _Pragma("omp simd")
        for (int64_t i = 0; i < d; ++i) out_f[i] = silu[i] * u[i];
        store_row(out_f, o + r * d, d);
      }
    });
  });
  return out;
}

}  // namespace minisgl
