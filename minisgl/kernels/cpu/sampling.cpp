// Two sampling-time kernels. Greedy sampling's argmax over each row of the logits. SGLang has no CPU kernel for it (its
// sampler calls torch.argmax); minisgl adds one because ATen's argmax along the last dimension
// tracks an index per element without vectors: 2.9 ms on 48 x 49,152 float32 logits on a 2-core
// AMD EPYC, where a vectorized max of each row and a scan for its first occurrence take 0.6 ms.
// And a grammar's token bitmask applied to the logits (apply_token_bitmask_cpu below).
#include <algorithm>
#include <cstring>
#include <limits>

#include "common.h"

namespace minisgl {

// The index of the first maximum of each row of [rows, vocab] float32 logits, as torch.argmax: a NaN
// counts as larger than any number, so a row with NaNs gives the index of its first NaN.
at::Tensor argmax_cpu(const at::Tensor& logits) {
  CHECK_CPU(logits);
  CHECK_LAST_DIM_CONTIGUOUS(logits);
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && logits.scalar_type() == at::kFloat,
              "argmax_cpu: expects float32 logits [rows, vocab] with vocab > 0");
  const int64_t rows = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  at::Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* x = logits.data_ptr<float>();
  int64_t* idx = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * stride;
      const float m = max_of(row, vocab);  // NaN where the row has one
      int64_t i = 0;
      if (std::isnan(m)) {
        while (!std::isnan(row[i])) ++i;
      } else {
        while (row[i] != m) ++i;
      }
      idx[r] = i;
    }
  });
  return out;
}

// logits[r, t] = -inf wherever bit t % 32 of bitmask[r, t / 32] is clear: xgrammar's
// apply_token_bitmask_inplace, in one pass over the batch. A word of all ones (32 allowed tokens) is
// skipped, a word of zeros is a fill, and any other word a select per lane done on the values' bits
// without a branch: `bit ? v : -inf` compiled to a branch per token, which mispredicts on mixed
// words (a regex mask's are mostly mixed): 10 ms for random bits at batch 32 over SmolLM2's
// vocabulary, 0.8 ms branch-free (docs/performance.md).
template <typename scalar_t>
inline void mask_word(scalar_t* v, uint32_t bits, scalar_t minus_inf) {
  using raw_t = std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint16_t>;
  static_assert(sizeof(raw_t) == sizeof(scalar_t));
  raw_t raw[32], inf;
  std::memcpy(raw, v, sizeof(raw));  // the values as integers (memcpy: no aliasing through casts)
  std::memcpy(&inf, &minus_inf, sizeof(inf));
  for (int j = 0; j < 32; ++j) {
    const raw_t keep = static_cast<raw_t>(0u - ((bits >> j) & 1u));  // all ones where the token is allowed
    raw[j] = static_cast<raw_t>((raw[j] & keep) | (inf & ~keep));
  }
  std::memcpy(v, raw, sizeof(raw));
}

void apply_token_bitmask_cpu(at::Tensor& logits, const at::Tensor& bitmask) {
  CHECK_CPU(logits);
  CHECK_LAST_DIM_CONTIGUOUS(logits);
  CHECK_INPUT(bitmask);
  TORCH_CHECK(logits.dim() == 2 && bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt,
              "apply_token_bitmask_cpu: expects logits [rows, vocab] and an int32 bitmask [rows, words]");
  const int64_t rows = logits.size(0), vocab = logits.size(1), words = bitmask.size(1);
  TORCH_CHECK(bitmask.size(0) == rows && words == (vocab + 31) / 32, "apply_token_bitmask_cpu: bitmask ",
              bitmask.sizes(), " does not cover logits ", logits.sizes());
  const int32_t* mask = bitmask.data_ptr<int32_t>();
  MINISGL_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "apply_token_bitmask_cpu", [&] {
    const scalar_t minus_inf = -std::numeric_limits<scalar_t>::infinity();
    scalar_t* x = logits.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* row = x + r * logits.stride(0);
        for (int64_t w = 0; w < words; ++w) {
          const uint32_t bits = static_cast<uint32_t>(mask[r * words + w]);
          if (bits == 0xFFFFFFFFu) continue;
          scalar_t* v = row + 32 * w;
          const int64_t n = std::min<int64_t>(32, vocab - 32 * w);
          if (n < 32) {  // the last word, partly past the vocabulary
            for (int64_t j = 0; j < n; ++j) v[j] = (bits >> j) & 1u ? v[j] : minus_inf;
          } else if (bits == 0) {
            std::fill_n(v, 32, minus_inf);
          } else {
            mask_word(v, bits, minus_inf);
          }
        }
      }
    });
  });
}

}  // namespace minisgl
