// Decode attention over the paged KV pool: one new query token per request
// (mirrors sgl-kernel/csrc/cpu/decode.cpp, decode_attention_cpu).
//
// Each work item first stores its request's new K/V in the pool (as SGLang's kernel does: one
// scatter fewer per layer than a separate index_put), then reads the request's keys and values
// once, in place, through req_to_token. The torch_native backend instead gathers every request's
// K/V into a [batch, max_len] padded copy per layer, which costs more than the attention itself.
#include "attention.h"

namespace minisgl {

// q, o: [batch, heads, dim]; key, value: [batch, kv_heads, dim], the new token's, stored at pool
// slots `loc`; k_buffer/v_buffer: this layer's pool; seq_lens include the new token.
void decode_attention_cpu(const at::Tensor& q, at::Tensor& o, at::Tensor& k_buffer, at::Tensor& v_buffer,
                          const at::Tensor& key, const at::Tensor& value, const at::Tensor& loc,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens, double scale) {
  const PagedAttentionArgs a =
      check_paged_attention(q, o, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, scale);
  const int64_t bs = q.size(0), max_context = req_to_token.size(1);
  check_new_kv(a, q, key, value, loc);
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t max_len = bs ? *std::max_element(lens, lens + bs) : 0;  // a loop, not a tensor op per layer
  TORCH_CHECK(max_len <= max_context, "decode_attention_cpu: seq_len exceeds req_to_token");
  // One work item per request (all its KV heads: a slot's K/V rows are read whole) when there are
  // enough requests to keep every thread busy, otherwise one per (request, KV head).
  const int64_t heads_per_item = bs >= 4 * at::get_num_threads() ? a.num_kv_heads : 1;
  const int64_t items_per_req = a.num_kv_heads / heads_per_item;
  MINISGL_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decode_attention_cpu", [&] {
    const int64_t* req_idx = req_pool_indices.data_ptr<int64_t>();
    const int64_t* slots = loc.data_ptr<int64_t>();
    dispatch_kv_dtype<scalar_t>(k_buffer, [&]<typename kv_t>() {
      dispatch_head_dim(a, [&]<int kDim>() {
        at::parallel_for(0, bs * items_per_req, 1, [&](int64_t begin, int64_t end) {
          Scratch& scratch = Scratch::for_this_thread(heads_per_item * a.group, a.head_dim, max_len);
          for (int64_t item = begin; item < end; ++item) {
            const int64_t b = item / items_per_req, head = (item % items_per_req) * heads_per_item;
            store_kv<scalar_t>(a, key, value, b, slots[b], head, head + heads_per_item, k_buffer.data_ptr<kv_t>(),
                               v_buffer.data_ptr<kv_t>());
            attend_block<kDim>(a, q.data_ptr<scalar_t>() + b * q.stride(0), o.data_ptr<scalar_t>() + b * o.stride(0),
                               o.stride(0), k_buffer.data_ptr<kv_t>(), v_buffer.data_ptr<kv_t>(),
                               req_to_token.data_ptr<int32_t>() + req_idx[b] * max_context, head,
                               head + heads_per_item, /*prefix=*/lens[b] - 1, /*first=*/0, /*count=*/1, scratch);
          }
        });
      });
    });
  });
}

}  // namespace minisgl
