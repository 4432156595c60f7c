// The entry points of minisgl's CPU kernels, declared once for the two files that call them:
// torch_extension_cpu.cpp registers them as torch.ops.minisgl_kernel.*, aoti_shims.cpp wraps them as
// the C functions a compiled graph calls.
#pragma once

#include "common.h"

namespace minisgl {
at::Tensor rmsnorm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rmsnorm_cpu(const at::Tensor& input, const at::Tensor& residual,
                                                         const at::Tensor& weight, double eps);
at::Tensor silu_and_mul_cpu(const at::Tensor& input);
std::tuple<at::Tensor, at::Tensor> rotary_embedding_cpu(const at::Tensor& positions, const at::Tensor& query,
                                                        const at::Tensor& key, int64_t head_size,
                                                        const at::Tensor& cos_sin_cache);
void decode_attention_cpu(const at::Tensor& q, at::Tensor& o, at::Tensor& k_buffer, at::Tensor& v_buffer,
                          const at::Tensor& key, const at::Tensor& value, const at::Tensor& loc,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens, double scale);
void extend_attention_cpu(const at::Tensor& q, at::Tensor& o, at::Tensor& k_buffer, at::Tensor& v_buffer,
                          const at::Tensor& key, const at::Tensor& value, const at::Tensor& loc,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens,
                          const at::Tensor& extend_start_loc, double scale,
                          const std::optional<at::Tensor>& custom_mask);
at::Tensor convert_weight_packed(const at::Tensor& weight);
at::Tensor convert_weight_packed_vnni(const at::Tensor& weight);
at::Tensor weight_packed_linear(const at::Tensor& mat1, const at::Tensor& mat2, const std::optional<at::Tensor>& bias);
int64_t weight_packed_block_n();
at::Tensor packed_weight_rows(const at::Tensor& packed, const at::Tensor& ids);
at::Tensor argmax_cpu(const at::Tensor& logits);
// gemm_int8.cpp: W8A8-int8
at::Tensor fused_experts_cpu(const at::Tensor& hidden_states, const at::Tensor& w13, const at::Tensor& w2,
                             const at::Tensor& topk_weights, const at::Tensor& topk_ids);  // moe.cpp
at::Tensor fused_experts_int8_cpu(const at::Tensor& hidden_states, const at::Tensor& w13, const at::Tensor& w13_scale,
                                  const at::Tensor& w2, const at::Tensor& w2_scale, const at::Tensor& topk_weights,
                                  const at::Tensor& topk_ids);  // moe_int8.cpp
std::tuple<at::Tensor, at::Tensor> topk_softmax_cpu(const at::Tensor& gating_output, int64_t topk,
                                                    bool renormalize);  // topk.cpp
at::Tensor convert_weight_packed_int8(const at::Tensor& weight);
at::Tensor convert_weight_packed_int8_vnni(const at::Tensor& weight);  // gemm_int8_vnni.cpp
std::tuple<at::Tensor, at::Tensor> per_token_quant_int8(const at::Tensor& x);
at::Tensor int8_scaled_mm_with_quant(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& scales2,
                                     const std::optional<at::Tensor>& bias, at::ScalarType out_dtype, bool is_vnni);
void apply_token_bitmask_cpu(at::Tensor& logits, const at::Tensor& bitmask);
// gemm_gguf.cpp: GGUF blocks kept quantized
at::Tensor gguf_mul_mat(const at::Tensor& x, const at::Tensor& qweight, int64_t weight_type,
                        const std::optional<at::Tensor>& bias, bool use_avx2);
// gemm_gguf_vec.cpp: the same for a few rows, activations quantized to int8 per block
at::Tensor gguf_mul_mat_vec_a8(const at::Tensor& x, const at::Tensor& qweight, int64_t weight_type,
                               const std::optional<at::Tensor>& bias, bool use_avx2);
}  // namespace minisgl
