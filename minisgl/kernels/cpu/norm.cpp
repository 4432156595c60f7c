// RMSNorm, alone and fused with the residual add (mirrors sgl-kernel/csrc/cpu/norm.cpp).
//
// One pass per token row instead of the six elementwise ops of the PyTorch version (add, cast,
// pow, mean, rsqrt, mul), each of which reads and writes the whole activation.
#include "common.h"

namespace minisgl {
namespace {

using fVec = at::vec::Vectorized<float>;
constexpr int64_t W = fVec::size();

// One row: out = round(v / rms(v)) * w, v being x, or with a residual the sum x + res rounded to the
// model dtype and stored to `sum` (the reference's sum is a model-dtype tensor, and so is the
// normalized value it scales by the weight). Two passes over the row, 2 W values at a time in
// registers, widening and rounding there: with the row widened into float32 buffers first (five
// per call, allocated per call) the bf16 kernel took 33 us on 64 rows of SmolLM2, the float32 one 17.
template <typename T>
void rmsnorm_row(const T* x, const T* res, const T* w, T* out, T* sum, int64_t d, float eps) {
  fVec acc0(0.f), acc1(0.f);
  float tail = 0.f;
  int64_t i = 0;
  for (; i + 2 * W <= d; i += 2 * W) {
    fVec a = load_float(x + i), b = load_float(x + i + W);
    if (res) {
      std::tie(a, b) = round_float2<T>(a + load_float(res + i), b + load_float(res + i + W));
      store_float2(sum + i, a, b);
    }
    acc0 = at::vec::fmadd(a, a, acc0);
    acc1 = at::vec::fmadd(b, b, acc1);
  }
  for (; i < d; ++i) {
    float v = static_cast<float>(x[i]);
    if (res) {
      v = round_to<T>(v + static_cast<float>(res[i]));
      sum[i] = static_cast<T>(v);
    }
    tail += v * v;
  }
  const float sum_sq = at::vec::vec_reduce_all<float>([](fVec& p, fVec& q) { return p + q; }, acc0 + acc1) + tail;
  const float inv_rms = 1.f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
  const T* v = res ? sum : x;
  const fVec inv(inv_rms);
  for (i = 0; i + 2 * W <= d; i += 2 * W) {
    const auto [a, b] = round_float2<T>(load_float(v + i) * inv, load_float(v + i + W) * inv);
    store_float2(out + i, a * load_float(w + i), b * load_float(w + i + W));
  }
  for (; i < d; ++i) out[i] = static_cast<T>(round_to<T>(static_cast<float>(v[i]) * inv_rms) * static_cast<float>(w[i]));
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
      for (int64_t r = begin; r < end; ++r) {
        rmsnorm_row<scalar_t>(x + r * d, nullptr, w, o + r * d, nullptr, d, static_cast<float>(eps));
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
      for (int64_t r = begin; r < end; ++r) {
        rmsnorm_row<scalar_t>(x + r * d, res + r * d, w, o + r * d, s + r * d, d, static_cast<float>(eps));
      }
    });
  });
  return {out, sum};
}

}  // namespace minisgl
