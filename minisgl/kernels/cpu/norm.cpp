// RMSNorm, alone and fused with the residual add (mirrors sgl-kernel/csrc/cpu/norm.cpp).
//
// One pass per token row instead of the six elementwise ops of the PyTorch version (add, cast,
// pow, mean, rsqrt, mul), each of which reads and writes the whole activation.
#include "common.h"

namespace minisgl {
namespace {

template <typename scalar_t>
void rmsnorm_row(const scalar_t* x, const scalar_t* w, scalar_t* out, int64_t d, float eps) {
  float sum_sq = 0.f;
  _Pragma("omp simd reduction(+ : sum_sq)")
  for (int64_t i = 0; i < d; ++i) {
    float v = static_cast<float>(x[i]);
    sum_sq += v * v;
  }
  const float inv_rms = 1.f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
  _Pragma("omp simd")
  for (int64_t i = 0; i < d; ++i) {
    // The reference rounds the normalized value to the model dtype before scaling by the weight.
    out[i] = static_cast<scalar_t>(static_cast<float>(w[i]) * round_to<scalar_t>(static_cast<float>(x[i]) * inv_rms));
  }
}

}  // namespace

// Inputs that are not contiguous (a per-head view of q or k, say) are copied first.
at::Tensor rmsnorm_cpu(const at::Tensor& input_, const at::Tensor& weight, double eps) {
  CHECK_CPU(input_);
  CHECK_INPUT(weight);
  const at::Tensor input = input_.contiguous();
  const int64_t d = input.size(-1), rows = input.numel() / d;
  TORCH_CHECK(weight.numel() == d && weight.scalar_type() == input.scalar_type(), "rmsnorm_cpu: weight mismatch");
  at::Tensor out = at::empty_like(input);
  MINISGL_DISPATCH_FLOATING_TYPES(input.scalar_type(), "rmsnorm_cpu", [&] {
    const scalar_t* x = input.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) rmsnorm_row(x + r * d, w, o + r * d, d, static_cast<float>(eps));
    });
  });
  return out;
}

// Returns (norm(input + residual) * weight, input + residual), like RMSNorm.forward_native.
std::tuple<at::Tensor, at::Tensor> fused_add_rmsnorm_cpu(
    const at::Tensor& input_, const at::Tensor& residual_, const at::Tensor& weight, double eps) {
  CHECK_CPU(input_);
  CHECK_CPU(residual_);
  CHECK_INPUT(weight);
  const at::Tensor input = input_.contiguous(), residual = residual_.contiguous();
  TORCH_CHECK(input.sizes() == residual.sizes() && input.scalar_type() == residual.scalar_type(),
              "fused_add_rmsnorm_cpu: input and residual differ");
  const int64_t d = input.size(-1), rows = input.numel() / d;
  TORCH_CHECK(weight.numel() == d && weight.scalar_type() == input.scalar_type(), "fused_add_rmsnorm_cpu: weight mismatch");
  at::Tensor out = at::empty_like(input);
  at::Tensor sum = at::empty_like(input);
  MINISGL_DISPATCH_FLOATING_TYPES(input.scalar_type(), "fused_add_rmsnorm_cpu", [&] {
    const scalar_t* x = input.data_ptr<scalar_t>();
    const scalar_t* res = residual.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    scalar_t* s = sum.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t off = r * d;
        _Pragma("omp simd")
        for (int64_t i = 0; i < d; ++i) {
          s[off + i] = static_cast<scalar_t>(static_cast<float>(x[off + i]) + static_cast<float>(res[off + i]));
        }
        rmsnorm_row(s + off, w, o + off, d, static_cast<float>(eps));
      }
    });
  });
  return {out, sum};
}

}  // namespace minisgl
