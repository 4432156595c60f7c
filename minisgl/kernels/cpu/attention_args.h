// The arguments of the paged attention kernels (decode.cpp, extend.cpp), their checks, and the
// dispatch on the pool's dtype and the head dim that instantiates attend_block (attention.h).
//
// The pool holds the model's dtype, bfloat16 under --kv-cache-dtype bf16, or float8 (e5m2 or e4m3)
// under --kv-cache-dtype fp8_e5m2 / fp8_e4m3 (SGLang's flag and names): K/V then take a half or a
// quarter of float32's memory and of the bytes decode attention streams. The query, the output and
// the new tokens' K/V stay in the model's dtype; K/V are rounded to the pool's dtype when stored,
// and every read widens a pool row to float32 in registers (load_float) anyway.
#pragma once

#include "common.h"

#include <type_traits>

namespace minisgl {

struct PagedAttentionArgs {
  int64_t head_dim, v_head_dim, num_kv_heads, group;  // group = query heads per KV head
  int64_t q_token_stride, q_head_stride;              // q may be a strided view of the QKV output
  int64_t k_slot_stride, v_slot_stride;               // the pool: [slots, kv_heads, dim]
  float scale;
};

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kMaxHeadDim = 256;

// Copies new token i's K/V heads [head_begin, head_end) from key/value ([tokens, kv_heads, dim],
// possibly strided views of the QKV output) into the pool at slot loc[i]. Where the pool's dtype
// differs, a head is widened to float32 (as_float) and rounded to the pool's dtype to nearest even
// (store_row), as torch's .to() rounds, in vector registers.
template <typename scalar_t, typename kv_t>
inline void store_kv(const PagedAttentionArgs& a, const at::Tensor& key, const at::Tensor& value, int64_t i,
                     int64_t slot, int64_t head_begin, int64_t head_end, kv_t* k_buf, kv_t* v_buf) {
  const auto copy = [](const scalar_t* src, int64_t n, kv_t* dst) {
    if constexpr (std::is_same_v<scalar_t, kv_t>) {
      std::copy_n(src, n, dst);
    } else {
      float buf[kMaxHeadDim];  // check_paged_attention bounds both head dims by it
      store_row(as_float(src, buf, n), dst, n);
    }
  };
  for (int64_t h = head_begin; h < head_end; ++h) {
    copy(key.data_ptr<scalar_t>() + i * key.stride(0) + h * key.stride(1), a.head_dim,
         k_buf + slot * a.k_slot_stride + h * a.head_dim);
    copy(value.data_ptr<scalar_t>() + i * value.stride(0) + h * value.stride(1), a.v_head_dim,
         v_buf + slot * a.v_slot_stride + h * a.v_head_dim);
  }
}

// n values of a pool row as bf16, for the vdpbf16ps and brgemm paths of a bf16 model: a bf16 row
// itself, an fp8 row widened into buf, exactly (n a multiple of 2 * Vec::size()).
template <typename kv_t>
inline const at::BFloat16* bf16_row(const kv_t* row, at::BFloat16* buf, int64_t n) {
  if constexpr (std::is_same_v<kv_t, at::BFloat16>) {
    return row;
  } else {
    for (int64_t i = 0; i < n; i += 2 * Vec::size()) {
      at::vec::convert_from_float<at::BFloat16>(load_float(row + i), load_float(row + i + Vec::size())).store(buf + i);
    }
    return buf;
  }
}

// Checks the new tokens' key/value ([tokens, kv_heads, dim]) and their slots against the pool.
inline void check_new_kv(const PagedAttentionArgs& a, const at::Tensor& q, const at::Tensor& key,
                         const at::Tensor& value, const at::Tensor& loc) {
  CHECK_CPU(key);
  CHECK_CPU(value);
  CHECK_LAST_DIM_CONTIGUOUS(key);
  CHECK_LAST_DIM_CONTIGUOUS(value);
  CHECK_INPUT(loc);
  const int64_t n = q.size(0);
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3 && key.size(0) == n && value.size(0) == n && loc.numel() == n &&
                  key.size(1) == a.num_kv_heads && value.size(1) == a.num_kv_heads && key.size(2) == a.head_dim &&
                  value.size(2) == a.v_head_dim,
              "attention: key/value must be [tokens, kv_heads, dim] with one loc per query token");
  TORCH_CHECK(key.scalar_type() == q.scalar_type() && value.scalar_type() == q.scalar_type() &&
                  loc.scalar_type() == at::kLong,
              "attention: key/value must be the model dtype and loc int64");
}

// Calls fn.template operator()<kDim>() with the head dim as a compile-time constant where it is
// a common one, 0 otherwise.
template <typename Fn>
void dispatch_head_dim(const PagedAttentionArgs& a, Fn&& fn) {
  if (a.head_dim == 64) {
    fn.template operator()<64>();
  } else if (a.head_dim == 128) {
    fn.template operator()<128>();
  } else {
    fn.template operator()<0>();
  }
}

// Calls fn.template operator()<kv_t>() with the pool's element type: the model's (scalar_t),
// bfloat16, float8 e5m2 or float8 e4m3 (check_paged_attention allows no other).
template <typename scalar_t, typename Fn>
void dispatch_kv_dtype(const at::Tensor& k_buffer, Fn&& fn) {
  if (k_buffer.scalar_type() == c10::CppTypeToScalarType<scalar_t>::value) {
    fn.template operator()<scalar_t>();
  } else if (k_buffer.scalar_type() == at::kFloat8_e5m2) {
    fn.template operator()<c10::Float8_e5m2>();
  } else if (k_buffer.scalar_type() == at::kFloat8_e4m3fn) {
    fn.template operator()<c10::Float8_e4m3fn>();
  } else {
    fn.template operator()<at::BFloat16>();
  }
}

// Checks shared by both entry points; returns the arguments of attend_block.
inline PagedAttentionArgs check_paged_attention(const at::Tensor& q, const at::Tensor& o, const at::Tensor& k_buffer,
                                                const at::Tensor& v_buffer, const at::Tensor& req_to_token,
                                                const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                                                double scale) {
  CHECK_CPU(q);
  CHECK_LAST_DIM_CONTIGUOUS(q);
  CHECK_INPUT(o);
  CHECK_INPUT(k_buffer);
  CHECK_INPUT(v_buffer);
  CHECK_INPUT(req_to_token);
  CHECK_INPUT(req_pool_indices);
  CHECK_INPUT(seq_lens);
  TORCH_CHECK(q.dim() == 3 && o.dim() == 3 && k_buffer.dim() == 3 && v_buffer.dim() == 3,
              "attention: q, o [tokens, heads, dim] and the pool [slots, kv_heads, dim]");
  TORCH_CHECK(req_to_token.scalar_type() == at::kInt, "attention: req_to_token must be int32");
  TORCH_CHECK(req_pool_indices.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong,
              "attention: req_pool_indices and seq_lens must be int64");
  TORCH_CHECK(q.scalar_type() == o.scalar_type(), "attention: q and o dtypes differ");
  TORCH_CHECK(k_buffer.scalar_type() == v_buffer.scalar_type() &&
                  (k_buffer.scalar_type() == q.scalar_type() || k_buffer.scalar_type() == at::kBFloat16 ||
                   k_buffer.scalar_type() == at::kFloat8_e5m2 || k_buffer.scalar_type() == at::kFloat8_e4m3fn),
              "attention: the KV pool must hold the model dtype, bfloat16 or float8 (e5m2, e4m3fn), got ",
              k_buffer.scalar_type(), " for a ", q.scalar_type(), " query");
  const int64_t heads = q.size(1), kv_heads = k_buffer.size(1);
  TORCH_CHECK(heads % kv_heads == 0, "attention: query heads must be a multiple of KV heads");
  PagedAttentionArgs a;
  a.head_dim = q.size(2);
  a.v_head_dim = v_buffer.size(2);
  a.num_kv_heads = kv_heads;
  a.group = heads / kv_heads;
  a.q_token_stride = q.stride(0);
  a.q_head_stride = q.stride(1);
  a.k_slot_stride = kv_heads * a.head_dim;
  a.v_slot_stride = kv_heads * a.v_head_dim;
  a.scale = static_cast<float>(scale);
  TORCH_CHECK(k_buffer.size(2) == a.head_dim && o.size(2) == a.v_head_dim, "attention: head dims differ");
  TORCH_CHECK(a.v_head_dim == a.head_dim && a.head_dim % Vec::size() == 0 && a.head_dim <= kMaxHeadDim,
              "attention: the kernels need equal Q/K and V head dims, a multiple of ", Vec::size(), " up to ",
              kMaxHeadDim);
  return a;
}

}  // namespace minisgl
