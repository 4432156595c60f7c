// The MoE router's softmax top-k (mirrors sgl-kernel/csrc/cpu/topk.cpp, topk_softmax_cpu, which
// SGLang's fused_topk_cpu calls on CPUs; sgl-kernel's also takes the hidden states, only to check
// their token count, and returns the ids as int32, where minisgl returns int64, as torch.topk does).
//
//   p = softmax(gating_output[t]) in float32;  ids = the top_k experts by p, largest first;
//   weights = p[ids], divided by their sum if renormalize.
//
// Why a kernel for a few dozen numbers per token: it is what eager and a compiled graph both call.
// Written in torch ops, the router's softmax was compiled by inductor into its own loop, whose exp
// and sums round differently from ATen's softmax in the last bit; on an AVX2 CPU that bit, through
// the renormalized weights of a bfloat16 model, was enough for CPUGraphRunner's outputs to leave
// eager's. One scalar loop per token also gives the same bits on every ISA.
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "common.h"

namespace minisgl {

std::tuple<at::Tensor, at::Tensor> topk_softmax_cpu(const at::Tensor& gating_output, int64_t topk, bool renormalize) {
  CHECK_INPUT(gating_output);
  TORCH_CHECK(gating_output.dim() == 2, "topk_softmax_cpu: gating_output must be [tokens, experts], got ",
              gating_output.sizes());
  const int64_t T = gating_output.size(0), E = gating_output.size(1);
  TORCH_CHECK(topk >= 1 && topk <= E, "topk_softmax_cpu: topk=", topk, " of ", E, " experts");
  auto weights = at::empty({T, topk}, gating_output.options().dtype(at::kFloat));
  auto ids = at::empty({T, topk}, gating_output.options().dtype(at::kLong));
  MINISGL_DISPATCH_FLOATING_TYPES(gating_output.scalar_type(), "topk_softmax_cpu", [&] {
    const scalar_t* logits = gating_output.data_ptr<scalar_t>();
    at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> p(E);
      for (int64_t t = begin; t < end; ++t) {
        float m = -std::numeric_limits<float>::infinity(), sum = 0.f;
        for (int64_t e = 0; e < E; ++e) m = std::max(m, p[e] = static_cast<float>(logits[t * E + e]));
        for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - m);
        for (int64_t e = 0; e < E; ++e) p[e] /= sum;
        // top_k passes of an argmax (k is 1 to 8 here); a tie goes to the lower expert id. A chosen
        // expert's probability becomes -1, below any other.
        float* w = weights.data_ptr<float>() + t * topk;
        int64_t* id = ids.data_ptr<int64_t>() + t * topk;
        float chosen = 0.f;
        for (int64_t j = 0; j < topk; ++j) {
          int64_t best = 0;
          for (int64_t e = 1; e < E; ++e) best = p[e] > p[best] ? e : best;
          w[j] = p[best];
          id[j] = best;
          chosen += p[best];
          p[best] = -1.f;
        }
        if (renormalize) {
          for (int64_t j = 0; j < topk; ++j) w[j] /= chosen;
        }
      }
    });
  });
  return {weights, ids};
}

}  // namespace minisgl
