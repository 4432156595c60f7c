// Rotary embedding in the NeoX layout (rotate halves) for query and key at once
// (mirrors sgl-kernel/csrc/cpu/rope.cpp).
//
// Reads q and k straight out of the fused QKV projection (strided views), gathers cos/sin by
// position once per token, and writes contiguous outputs; the PyTorch version builds six
// temporaries (two halves, four products, two concatenations) per tensor.
#include "common.h"

namespace minisgl {
namespace {

// One head's rotation, a vector at a time (16 lanes with AVX-512, 8 with AVX2; a 16-bit head widened
// in registers and rounded once, on the store); the rest of a half that is not a whole number of
// vectors goes one value at a time. Scalar code
// with static_cast conversions took 76 us on 64 bf16 tokens of SmolLM2 (2-core Xeon), against 16 us
// for float32, whose loop the compiler vectorizes.
template <typename scalar_t>
void rotate_heads(const scalar_t* x, int64_t head_stride, int64_t heads, int64_t head_size, int64_t half,
                  const float* cos, const float* sin, scalar_t* out) {
  using fVec = at::vec::Vectorized<float>;
  constexpr int64_t W = fVec::size();
  const auto store = [](scalar_t* dst, const fVec& v) {
    if constexpr (std::is_same_v<scalar_t, float>) {
      v.store(dst);
    } else {
      at::vec::convert_from_float<scalar_t>(v, v).store(dst, W);
    }
  };
  for (int64_t h = 0; h < heads; ++h) {
    const scalar_t* xi = x + h * head_stride;
    scalar_t* oi = out + h * head_size;
    int64_t i = 0;
    for (; i + W <= half; i += W) {
      const fVec x1 = load_float(xi + i), x2 = load_float(xi + i + half);
      const fVec c = fVec::loadu(cos + i), s = fVec::loadu(sin + i);
      store(oi + i, x1 * c - x2 * s);
      store(oi + i + half, x2 * c + x1 * s);
    }
    for (; i < half; ++i) {
      const float x1 = static_cast<float>(xi[i]), x2 = static_cast<float>(xi[i + half]);
      oi[i] = static_cast<scalar_t>(x1 * cos[i] - x2 * sin[i]);
      oi[i + half] = static_cast<scalar_t>(x2 * cos[i] + x1 * sin[i]);
    }
    for (int64_t j = 2 * half; j < head_size; ++j) oi[j] = xi[j];  // partial rotary: the rest passes through
  }
}

}  // namespace

// query: [tokens, heads * head_size], key: [tokens, kv_heads * head_size] (rows may be strided),
// cos_sin_cache: [max_position, rotary_dim] float32 holding cos | sin.
std::tuple<at::Tensor, at::Tensor> rotary_embedding_cpu(
    const at::Tensor& positions, const at::Tensor& query, const at::Tensor& key, int64_t head_size,
    const at::Tensor& cos_sin_cache) {
  CHECK_INPUT(positions);
  CHECK_INPUT(cos_sin_cache);
  CHECK_LAST_DIM_CONTIGUOUS(query);
  CHECK_LAST_DIM_CONTIGUOUS(key);
  TORCH_CHECK(positions.scalar_type() == at::kLong && cos_sin_cache.scalar_type() == at::kFloat,
              "rotary_embedding_cpu: positions must be int64 and the cache float32");
  TORCH_CHECK(query.scalar_type() == key.scalar_type(), "rotary_embedding_cpu: query and key dtypes differ");
  const int64_t tokens = query.size(0), rotary_dim = cos_sin_cache.size(1), half = rotary_dim / 2;
  TORCH_CHECK(rotary_dim <= head_size && rotary_dim % 2 == 0, "rotary_embedding_cpu: bad rotary_dim");
  const int64_t q_heads = query.size(1) / head_size, k_heads = key.size(1) / head_size;
  at::Tensor q_out = at::empty({tokens, q_heads * head_size}, query.options());
  at::Tensor k_out = at::empty({tokens, k_heads * head_size}, key.options());
  MINISGL_DISPATCH_FLOATING_TYPES(query.scalar_type(), "rotary_embedding_cpu", [&] {
    const int64_t* pos = positions.data_ptr<int64_t>();
    const float* cache = cos_sin_cache.data_ptr<float>();
    const scalar_t* q = query.data_ptr<scalar_t>();
    const scalar_t* k = key.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* cos = cache + pos[t] * rotary_dim;
        rotate_heads(q + t * query.stride(0), head_size, q_heads, head_size, half, cos, cos + half,
                     q_out.data_ptr<scalar_t>() + t * q_heads * head_size);
        rotate_heads(k + t * key.stride(0), head_size, k_heads, head_size, half, cos, cos + half,
                     k_out.data_ptr<scalar_t>() + t * k_heads * head_size);
      }
    });
  });
  return {q_out, k_out};
}

}  // namespace minisgl
