// Shared helpers for minisgl's CPU kernels (mirrors sgl-kernel/csrc/cpu/common.h and vec.h).
//
// Every kernel reads its inputs in the model's dtype (float32, bfloat16 or float16), computes in
// float32 and rounds to the model's dtype at the same points as the PyTorch reference it replaces,
// so greedy tokens stay identical to Hugging Face's. The file is compiled with the vector ISA ATen
// itself picked for this CPU (CPU_CAPABILITY_AVX512 / AVX2), which is what at::vec keys on.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cmath>

#define CHECK_CPU(x) TORCH_CHECK((x).device().is_cpu(), #x " must be a CPU tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define CHECK_LAST_DIM_CONTIGUOUS(x) TORCH_CHECK((x).stride(-1) == 1, #x " must be contiguous in its last dimension")
#define CHECK_INPUT(x) \
  CHECK_CPU(x);        \
  CHECK_CONTIGUOUS(x)

// The model dtypes every kernel accepts. (Loops inside these lambdas use _Pragma("omp simd"):
// a #pragma line cannot sit inside a macro argument.)
#define MINISGL_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...)                 \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) \
                         AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

namespace minisgl {

// Round a float32 value to the model dtype and back: the reference rounds here too.
template <typename scalar_t>
inline float round_to(float x) {
  return static_cast<float>(static_cast<scalar_t>(x));
}

// x[i] = exp(x[i] - shift) for i < n, returning the sum of the results (softmax's denominator).
inline float exp_and_sum(float* x, int64_t n, float shift) {
  using Vec = at::vec::Vectorized<float>;
  const Vec vshift(shift);
  Vec vsum(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec e = (Vec::loadu(x + i) - vshift).exp_u20();
    e.store(x + i);
    vsum = vsum + e;
  }
  float lanes[Vec::size()];
  vsum.store(lanes);
  float sum = 0.f;
  for (float lane : lanes) sum += lane;
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

}  // namespace minisgl
