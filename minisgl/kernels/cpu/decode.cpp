// Decode attention over the paged KV pool: one new query token per request
// (mirrors sgl-kernel/csrc/cpu/decode.cpp, decode_attention_cpu).
//
// Each work item first stores its request's new K/V in the pool (as SGLang's kernel does: one
// scatter fewer per layer than a separate index_put), then reads the request's keys and values
// once, in place, through req_to_token. The torch_native backend instead gathers every request's
// K/V into a [batch, max_len] padded copy per layer, which costs more than the attention itself.
//
// With fewer work items than threads can share evenly (one request over SmolLM2's 3 KV heads on
// 2 threads leaves one thread idle a third of the time), each item's keys are split into ranges,
// as sgl-kernel's decode splits them (num_kv_splits): every range attends on its own and leaves
// its rows in float32 with their log-sum-exp (PartialOut), and a second pass weighs the ranges by
// exp(lse - max lse), which is the softmax over all the keys.
#include <cmath>

#include "attention.h"

namespace minisgl {

namespace {

// A range shorter than this costs more in merging than an idle thread does.
constexpr int64_t kMinKeysPerSplit = 256;

int64_t num_key_splits(int64_t items, int64_t max_len) {
  const int64_t threads = at::get_num_threads();
  if (items >= 2 * threads) return 1;
  const int64_t wanted = (2 * threads + items - 1) / items;
  return std::max<int64_t>(1, std::min(wanted, max_len / kMinKeysPerSplit));
}

// o rows of one (request, KV head): the splits' rows weighed by exp(lse - max lse).
template <typename scalar_t>
void merge_splits(const float* part_o, const float* part_lse, int64_t splits, int64_t group, int64_t d,
                  scalar_t* o) {
  float row[kMaxHeadDim];  // per layer and item: no allocation
  for (int64_t g = 0; g < group; ++g) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < splits; ++s) m = std::max(m, part_lse[s * group + g]);
    std::fill_n(row, d, 0.f);
    float total = 0.f;
    for (int64_t s = 0; s < splits; ++s) {
      const float w = std::exp(part_lse[s * group + g] - m);  // an empty range: exp(-inf) = 0
      if (w == 0.f) continue;
      total += w;
      const float* src = part_o + (s * group + g) * d;
      for (int64_t c = 0; c < d; ++c) row[c] += w * src[c];
    }
    for (int64_t c = 0; c < d; ++c) row[c] /= total;
    if constexpr (std::is_same_v<scalar_t, float>) {
      std::copy_n(row, d, o + g * d);
    } else {
      store_row(row, o + g * d, d);
    }
  }
}

// decode_attention_cpu with each (request, KV head)'s keys split into `splits` ranges.
template <int kDim, typename scalar_t, typename kv_t>
void decode_split(const PagedAttentionArgs& a, const at::Tensor& q, at::Tensor& o, at::Tensor& k_buffer,
                  at::Tensor& v_buffer, const at::Tensor& key, const at::Tensor& value, const int64_t* slots,
                  const at::Tensor& req_to_token, const int64_t* req_idx, const int64_t* lens, int64_t bs,
                  int64_t max_len, int64_t splits) {
  const int64_t d = a.head_dim, items = bs * a.num_kv_heads, max_context = req_to_token.size(1);
  std::vector<float> part_o(items * splits * a.group * d), part_lse(items * splits * a.group);
  kv_t* k_buf = k_buffer.data_ptr<kv_t>();
  kv_t* v_buf = v_buffer.data_ptr<kv_t>();
  at::parallel_for(0, items * splits, 1, [&](int64_t begin, int64_t end) {
    Scratch& scratch = Scratch::for_this_thread(a.group, d, max_len);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t item = w / splits, split = w % splits, b = item / a.num_kv_heads, head = item % a.num_kv_heads;
      const int64_t per_split = (lens[b] + splits - 1) / splits;
      const int64_t first_key = split * per_split, end_key = std::min(lens[b], first_key + per_split);
      float* lse = part_lse.data() + w * a.group;
      if (end_key <= first_key) {  // a short request's last ranges are empty
        std::fill(lse, lse + a.group, -std::numeric_limits<float>::infinity());
        continue;
      }
      // Only the last range reads the new token's slot, so only it stores the new K/V first.
      if (end_key == lens[b]) store_kv<scalar_t>(a, key, value, b, slots[b], head, head + 1, k_buf, v_buf);
      attend_block<kDim>(a, q.data_ptr<scalar_t>() + b * q.stride(0), o.data_ptr<scalar_t>() + b * o.stride(0),
                         o.stride(0), k_buf, v_buf, req_to_token.data_ptr<int32_t>() + req_idx[b] * max_context + first_key,
                         head, head + 1, /*prefix=*/end_key - first_key - 1, /*first=*/0, /*count=*/1, scratch, {}, {},
                         PartialOut{part_o.data() + w * a.group * d, lse});
    }
  });
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / a.num_kv_heads, head = item % a.num_kv_heads;
      merge_splits(part_o.data() + item * splits * a.group * d, part_lse.data() + item * splits * a.group, splits,
                   a.group, d, o.data_ptr<scalar_t>() + b * o.stride(0) + head * a.group * d);
    }
  });
}

}  // namespace

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
  const int64_t splits = heads_per_item == 1 ? num_key_splits(bs * items_per_req, max_len) : 1;
  MINISGL_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decode_attention_cpu", [&] {
    const int64_t* req_idx = req_pool_indices.data_ptr<int64_t>();
    const int64_t* slots = loc.data_ptr<int64_t>();
    dispatch_kv_dtype<scalar_t>(k_buffer, [&]<typename kv_t>() {
      dispatch_head_dim(a, [&]<int kDim>() {
        if (splits > 1) {
          decode_split<kDim, scalar_t, kv_t>(a, q, o, k_buffer, v_buffer, key, value, slots, req_to_token, req_idx,
                                             lens, bs, max_len, splits);
          return;
        }
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
