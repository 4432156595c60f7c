// Registers minisgl's CPU kernels as torch.ops.minisgl_kernel.* (mirrors
// sgl-kernel/csrc/cpu/torch_extension_cpu.cpp, which registers torch.ops.sgl_kernel.*).
// Registering through TORCH_LIBRARY, not pybind11, lets the ops carry schemas: torch.compile and
// the profiler see them by name.
#include <torch/library.h>

#include "ops.h"

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
  m.def("topk_softmax_cpu(Tensor gating_output, int topk, bool renormalize) -> (Tensor, Tensor)");
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
  m.impl("topk_softmax_cpu", &minisgl::topk_softmax_cpu);
  m.impl("argmax_cpu", &minisgl::argmax_cpu);
  m.impl("convert_weight_packed_int8", &minisgl::convert_weight_packed_int8);
  m.impl("convert_weight_packed_int8_vnni", &minisgl::convert_weight_packed_int8_vnni);
  m.impl("per_token_quant_int8", &minisgl::per_token_quant_int8);
  m.impl("int8_scaled_mm_with_quant", &minisgl::int8_scaled_mm_with_quant);
  m.impl("apply_token_bitmask_cpu", &minisgl::apply_token_bitmask_cpu);
  m.impl("gguf_mul_mat", &minisgl::gguf_mul_mat);
  m.impl("gguf_mul_mat_vec_a8", &minisgl::gguf_mul_mat_vec_a8);
}
