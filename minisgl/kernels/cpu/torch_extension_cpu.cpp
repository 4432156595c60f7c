// Registers minisgl's CPU kernels as torch.ops.minisgl_kernel.* (mirrors
// sgl-kernel/csrc/cpu/torch_extension_cpu.cpp, which registers torch.ops.sgl_kernel.*).
// Registering through TORCH_LIBRARY, not pybind11, lets the ops carry schemas: torch.compile and
// the profiler see them by name.
#include <torch/library.h>

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

TORCH_LIBRARY(minisgl_kernel, m) {
  m.def("rmsnorm_cpu(Tensor input, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rmsnorm_cpu(Tensor input, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("silu_and_mul_cpu(Tensor input) -> Tensor");
  m.def(
      "rotary_embedding_cpu(Tensor positions, Tensor query, Tensor key, int head_size, Tensor cos_sin_cache)"
      " -> (Tensor, Tensor)");
  m.def(
      "decode_attention_cpu(Tensor q, Tensor(a!) o, Tensor(b!) k_buffer, Tensor(c!) v_buffer, Tensor key,"
      " Tensor value, Tensor loc, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float scale) -> ()");
  m.def(
      "extend_attention_cpu(Tensor q, Tensor(a!) o, Tensor(b!) k_buffer, Tensor(c!) v_buffer, Tensor key,"
      " Tensor value, Tensor loc, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens,"
      " Tensor extend_seq_lens, Tensor extend_start_loc, float scale, Tensor? custom_mask=None) -> ()");
  m.def("convert_weight_packed(Tensor weight) -> Tensor");
  m.def("convert_weight_packed_vnni(Tensor weight) -> Tensor");
  m.def("weight_packed_linear(Tensor mat1, Tensor mat2, Tensor? bias) -> Tensor");
  m.def("packed_weight_rows(Tensor packed, Tensor ids) -> Tensor");
  m.def(
      "fused_experts_cpu(Tensor hidden_states, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids) -> "
      "Tensor");
  m.def(
      "fused_experts_int8_cpu(Tensor hidden_states, Tensor w13, Tensor w13_scale, Tensor w2, Tensor w2_scale, "
      "Tensor topk_weights, Tensor topk_ids) -> Tensor");
  m.def("argmax_cpu(Tensor logits) -> Tensor");
  m.def("apply_token_bitmask_cpu(Tensor(a!) logits, Tensor bitmask) -> ()");
  m.def("weight_packed_block_n() -> int", &minisgl::weight_packed_block_n);  // no tensor: not dispatched
  m.def("convert_weight_packed_int8(Tensor weight) -> Tensor");
  m.def("convert_weight_packed_int8_vnni(Tensor weight) -> Tensor");
  m.def("per_token_quant_int8(Tensor x) -> (Tensor, Tensor)");
  m.def(
      "int8_scaled_mm_with_quant(Tensor mat1, Tensor mat2, Tensor scales2, Tensor? bias, ScalarType out_dtype,"
      " bool is_vnni) -> Tensor");
  m.def("gguf_mul_mat(Tensor x, Tensor qweight, int weight_type, Tensor? bias, bool use_avx2) -> Tensor");
  m.def("gguf_mul_mat_vec_a8(Tensor x, Tensor qweight, int weight_type, Tensor? bias, bool use_avx2) -> Tensor");
}

TORCH_LIBRARY_IMPL(minisgl_kernel, CPU, m) {
  m.impl("rmsnorm_cpu", &minisgl::rmsnorm_cpu);
  m.impl("fused_add_rmsnorm_cpu", &minisgl::fused_add_rmsnorm_cpu);
  m.impl("silu_and_mul_cpu", &minisgl::silu_and_mul_cpu);
  m.impl("rotary_embedding_cpu", &minisgl::rotary_embedding_cpu);
  m.impl("decode_attention_cpu", &minisgl::decode_attention_cpu);
  m.impl("extend_attention_cpu", &minisgl::extend_attention_cpu);
  m.impl("convert_weight_packed", &minisgl::convert_weight_packed);
  m.impl("convert_weight_packed_vnni", &minisgl::convert_weight_packed_vnni);
  m.impl("weight_packed_linear", &minisgl::weight_packed_linear);
  m.impl("packed_weight_rows", &minisgl::packed_weight_rows);
  m.impl("fused_experts_cpu", &minisgl::fused_experts_cpu);
  m.impl("fused_experts_int8_cpu", &minisgl::fused_experts_int8_cpu);
  m.impl("argmax_cpu", &minisgl::argmax_cpu);
  m.impl("convert_weight_packed_int8", &minisgl::convert_weight_packed_int8);
  m.impl("convert_weight_packed_int8_vnni", &minisgl::convert_weight_packed_int8_vnni);
  m.impl("per_token_quant_int8", &minisgl::per_token_quant_int8);
  m.impl("int8_scaled_mm_with_quant", &minisgl::int8_scaled_mm_with_quant);
  m.impl("apply_token_bitmask_cpu", &minisgl::apply_token_bitmask_cpu);
  m.impl("gguf_mul_mat", &minisgl::gguf_mul_mat);
  m.impl("gguf_mul_mat_vec_a8", &minisgl::gguf_mul_mat_vec_a8);
}
