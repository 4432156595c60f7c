// C entry points through which a graph compiled by CPUGraphRunner calls minisgl's kernels directly.
// No counterpart in sgl-kernel: SGLang's CPU graph runner leaves these calls to the dispatcher.
//
// Inductor's C++ wrapper calls a custom op through the dispatcher by name
// (aoti_torch_call_dispatcher): it looks the schema up, boxes every argument into an IValue and
// the kernel's wrapper unboxes them again, for each of the ~270 calls of a one-row decode step of
// SmolLM2. For the ops named in aot_inductor.custom_ops_to_c_shims it emits a plain C call
// instead, to aoti_torch_<device>_<op>, with the calling convention of torch's own generated
// shims (torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h): a Tensor is an AtenTensorHandle,
// an optional Tensor a pointer to one (nullptr for None), a float a double, an int an int64_t, a
// bool an int32_t, and each returned tensor comes back through an AtenTensorHandle* at the end (an
// op that returns nothing gets one such pointer too, always nullptr). The declarations inductor is
// given come from the ops' schemas (cpu_graph_runner.py's c_shim_declarations); nothing checks them
// against these definitions at build time, so the slow tests of tests/test_cpu_graph_runner.py
// compare compiled graphs of every kind of model, and so every shim, with eager.
#include <ATen/record_function.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include "ops.h"

// A shim's body: exceptions become an error code, as in torch's own shims, and the profiler sees
// the call under the op's name, as it does through the dispatcher.
#define MINISGL_SHIM(name, ...)                                             \
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({                              \
    RECORD_FUNCTION("minisgl_kernel::" name, std::vector<c10::IValue>());   \
    __VA_ARGS__                                                             \
  })

namespace {
using torch::aot_inductor::new_tensor_handle;
using torch::aot_inductor::pointer_to_optional;

// The tensor behind a handle, without copying it (the handle owns it).
at::Tensor& t(AtenTensorHandle handle) { return *torch::aot_inductor::tensor_handle_to_tensor_pointer(handle); }
}  // namespace

extern "C" {

AOTITorchError aoti_torch_cpu_rmsnorm_cpu(AtenTensorHandle input, AtenTensorHandle weight, double eps,
                                          AtenTensorHandle* ret0) {
  MINISGL_SHIM("rmsnorm_cpu", { *ret0 = new_tensor_handle(minisgl::rmsnorm_cpu(t(input), t(weight), eps)); });
}

AOTITorchError aoti_torch_cpu_fused_add_rmsnorm_cpu(AtenTensorHandle input, AtenTensorHandle residual,
                                                    AtenTensorHandle weight, double eps, AtenTensorHandle* ret0,
                                                    AtenTensorHandle* ret1) {
  MINISGL_SHIM("fused_add_rmsnorm_cpu", {
    auto [out, res] = minisgl::fused_add_rmsnorm_cpu(t(input), t(residual), t(weight), eps);
    *ret0 = new_tensor_handle(std::move(out));
    *ret1 = new_tensor_handle(std::move(res));
  });
}

AOTITorchError aoti_torch_cpu_silu_and_mul_cpu(AtenTensorHandle input, AtenTensorHandle* ret0) {
  MINISGL_SHIM("silu_and_mul_cpu", { *ret0 = new_tensor_handle(minisgl::silu_and_mul_cpu(t(input))); });
}

AOTITorchError aoti_torch_cpu_rotary_embedding_cpu(AtenTensorHandle positions, AtenTensorHandle query,
                                                   AtenTensorHandle key, int64_t head_size,
                                                   AtenTensorHandle cos_sin_cache, AtenTensorHandle* ret0,
                                                   AtenTensorHandle* ret1) {
  MINISGL_SHIM("rotary_embedding_cpu", {
    auto [q, k] = minisgl::rotary_embedding_cpu(t(positions), t(query), t(key), head_size, t(cos_sin_cache));
    *ret0 = new_tensor_handle(std::move(q));
    *ret1 = new_tensor_handle(std::move(k));
  });
}

AOTITorchError aoti_torch_cpu_decode_attention_cpu(AtenTensorHandle q, AtenTensorHandle o, AtenTensorHandle k_buffer,
                                                   AtenTensorHandle v_buffer, AtenTensorHandle key,
                                                   AtenTensorHandle value, AtenTensorHandle loc,
                                                   AtenTensorHandle req_to_token, AtenTensorHandle req_pool_indices,
                                                   AtenTensorHandle seq_lens, double scale,
                                                   AtenTensorHandle* no_output) {
  MINISGL_SHIM("decode_attention_cpu", {
    minisgl::decode_attention_cpu(t(q), t(o), t(k_buffer), t(v_buffer), t(key), t(value), t(loc), t(req_to_token),
                                  t(req_pool_indices), t(seq_lens), scale);
  });
}

AOTITorchError aoti_torch_cpu_weight_packed_linear(AtenTensorHandle mat1, AtenTensorHandle mat2,
                                                   AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  MINISGL_SHIM("weight_packed_linear", {
    *ret0 = new_tensor_handle(
        minisgl::weight_packed_linear(t(mat1), t(mat2), pointer_to_optional<at::Tensor>(bias)));
  });
}

AOTITorchError aoti_torch_cpu_packed_weight_rows(AtenTensorHandle packed, AtenTensorHandle ids,
                                                 AtenTensorHandle* ret0) {
  MINISGL_SHIM("packed_weight_rows", { *ret0 = new_tensor_handle(minisgl::packed_weight_rows(t(packed), t(ids))); });
}

AOTITorchError aoti_torch_cpu_extend_attention_cpu(
    AtenTensorHandle q, AtenTensorHandle o, AtenTensorHandle k_buffer, AtenTensorHandle v_buffer, AtenTensorHandle key,
    AtenTensorHandle value, AtenTensorHandle loc, AtenTensorHandle req_to_token, AtenTensorHandle req_pool_indices,
    AtenTensorHandle seq_lens, AtenTensorHandle extend_seq_lens, AtenTensorHandle extend_start_loc, double scale,
    AtenTensorHandle* custom_mask, AtenTensorHandle* no_output) {
  MINISGL_SHIM("extend_attention_cpu", {
    minisgl::extend_attention_cpu(t(q), t(o), t(k_buffer), t(v_buffer), t(key), t(value), t(loc), t(req_to_token),
                                  t(req_pool_indices), t(seq_lens), t(extend_seq_lens), t(extend_start_loc), scale,
                                  pointer_to_optional<at::Tensor>(custom_mask));
  });
}

AOTITorchError aoti_torch_cpu_argmax_cpu(AtenTensorHandle logits, AtenTensorHandle* ret0) {
  MINISGL_SHIM("argmax_cpu", { *ret0 = new_tensor_handle(minisgl::argmax_cpu(t(logits))); });
}

AOTITorchError aoti_torch_cpu_fused_experts_cpu(AtenTensorHandle hidden_states, AtenTensorHandle w13,
                                                AtenTensorHandle w2, AtenTensorHandle topk_weights,
                                                AtenTensorHandle topk_ids, AtenTensorHandle* ret0) {
  MINISGL_SHIM("fused_experts_cpu", {
    *ret0 = new_tensor_handle(
        minisgl::fused_experts_cpu(t(hidden_states), t(w13), t(w2), t(topk_weights), t(topk_ids)));
  });
}

AOTITorchError aoti_torch_cpu_topk_softmax_cpu(AtenTensorHandle gating_output, int64_t topk, int32_t renormalize,
                                               AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  MINISGL_SHIM("topk_softmax_cpu", {
    auto [weights, ids] = minisgl::topk_softmax_cpu(t(gating_output), topk, renormalize);
    *ret0 = new_tensor_handle(std::move(weights));
    *ret1 = new_tensor_handle(std::move(ids));
  });
}

AOTITorchError aoti_torch_cpu_fused_experts_int8_cpu(AtenTensorHandle hidden_states, AtenTensorHandle w13,
                                                     AtenTensorHandle w13_scale, AtenTensorHandle w2,
                                                     AtenTensorHandle w2_scale, AtenTensorHandle topk_weights,
                                                     AtenTensorHandle topk_ids, AtenTensorHandle* ret0) {
  MINISGL_SHIM("fused_experts_int8_cpu", {
    *ret0 = new_tensor_handle(minisgl::fused_experts_int8_cpu(t(hidden_states), t(w13), t(w13_scale), t(w2),
                                                              t(w2_scale), t(topk_weights), t(topk_ids)));
  });
}

// out_dtype is a ScalarType, which the schema (and so the declaration) carries as an int.
AOTITorchError aoti_torch_cpu_int8_scaled_mm_with_quant(AtenTensorHandle mat1, AtenTensorHandle mat2,
                                                        AtenTensorHandle scales2, AtenTensorHandle* bias,
                                                        int64_t out_dtype, int32_t is_vnni, AtenTensorHandle* ret0) {
  MINISGL_SHIM("int8_scaled_mm_with_quant", {
    *ret0 = new_tensor_handle(minisgl::int8_scaled_mm_with_quant(t(mat1), t(mat2), t(scales2),
                                                                 pointer_to_optional<at::Tensor>(bias),
                                                                 static_cast<at::ScalarType>(out_dtype), is_vnni));
  });
}

AOTITorchError aoti_torch_cpu_gguf_mul_mat(AtenTensorHandle x, AtenTensorHandle qweight, int64_t weight_type,
                                           AtenTensorHandle* bias, int32_t use_avx2, AtenTensorHandle* ret0) {
  MINISGL_SHIM("gguf_mul_mat", {
    *ret0 = new_tensor_handle(
        minisgl::gguf_mul_mat(t(x), t(qweight), weight_type, pointer_to_optional<at::Tensor>(bias), use_avx2));
  });
}

AOTITorchError aoti_torch_cpu_gguf_mul_mat_vec_a8(AtenTensorHandle x, AtenTensorHandle qweight, int64_t weight_type,
                                                  AtenTensorHandle* bias, int32_t use_avx2, AtenTensorHandle* ret0) {
  MINISGL_SHIM("gguf_mul_mat_vec_a8", {
    *ret0 = new_tensor_handle(minisgl::gguf_mul_mat_vec_a8(t(x), t(qweight), weight_type,
                                                           pointer_to_optional<at::Tensor>(bias), use_avx2));
  });
}

}  // extern "C"
