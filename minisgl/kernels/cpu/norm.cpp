// RMSNorm, alone and fused with the residual add (mirrors sgl-kernel/csrc/cpu/norm.cpp).
//
// One pass per token row instead of the six elementwise ops of the PyTorch version (add, cast,
// pow, mean, rsqrt, mul), each of which reads and writes the whole activation.
#include "common.h"

namespace minisgl {
namespace {

// out = w * round(x / rms(x)) on float32 rows, round() being to the model dtype: the reference
// rounds the normalized value before it scales by the weight.
template <typename scalar_t>
void rmsnorm_row(const float* x, const float* w, float* out, int64_t d, float eps) {
  float sum_sq = 0.f;
  _Pragma("omp simd reduction(+ : sum_sq)")
  for (int64_t i = 0; i < d; ++i) sum_sq += x[i] * x[i];
  const float inv_rms = 1.f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
  _Pragma("omp simd")
  for (int64_t i = 0; i < d; ++i) out[i] = x[i] * inv_rms;
  round_in_place<scalar_t>(out, d);
  _Pragma("omp simd")
  for (int64_t i = 0; i < d; ++i) out[i] *= w[i];
}

// Per-thread float32 rows for the 16-bit dtypes (unused for float32, see as_float).
struct RowBuffers {
  std::vector<float> w, x, res, sum, out;
  explicit RowBuffers(int64_t d) : w(d), x(d), res(d), sum(d), out(d) {}
};

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
      RowBuffers buf(d);
      const float* w_f = as_float(w, buf.w.data(), d);
      for (int64_t r = begin; r < end; ++r) {
        float* out_f = float_out(o + r * d, buf.out.data());
        rmsnorm_row<scalar_t>(as_float(x + r * d, buf.x.data(), d), w_f, out_f, d, static_cast<float>(eps));
        store_row(out_f, o + r * d, d);
      }
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
      RowBuffers buf(d);
      const float* w_f = as_float(w, buf.w.data(), d);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t off = r * d;
        const float* x_f = as_float(x + off, buf.x.data(), d);
        const float* res_f = as_float(res + off, buf.res.data(), d);
        float* sum_f = float_out(s + off, buf.sum.data());
        _Pragma("omp simd")
        for (int64_t i = 0; i < d; ++i) sum_f[i] = x_f[i] + res_f[i];
        round_in_place<scalar_t>(sum_f, d);  // the sum is a model-dtype tensor in the reference
        store_row(sum_f, s + off, d);
        float* out_f = float_out(o + off, buf.out.data());
        rmsnorm_row<scalar_t>(sum_f, w_f, out_f, d, static_cast<float>(eps));
        store_row(out_f, o + off, d);
      }
    });
  });
  return {out, sum};
}

}  // namespace minisgl
