// What attention's passes keep per thread (attention.h's Scratch), the key block they share, and
// their two products on brgemm: the matrix-engine path of an AMX CPU (or of MINISGL_BRGEMM=1,
// common.h), as sgl-kernel's extend attention multiplies, for a bf16 model over a bf16 (or fp8) pool.
#pragma once

#include "attention_args.h"

#include <ATen/native/CPUBlas.h>

#include <type_traits>
#include <vector>

namespace minisgl {

// Keys per block of scores_by_tile: two vectors of scores per query row.
constexpr int64_t kKeyBlock = 2 * Vec::size();
// Query rows per brgemm call (two AMX tiles of 16 rows).
constexpr int64_t kBrgemmRows = 32;

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Per-thread scratch: the block's queries (scaled, float32), scores (rows padded to whole key
// blocks), softmax denominators and one KV head's keys, transposed in blocks (scores_by_tile).
// One per thread, kept from call to call and grown when a call needs more: allocating it per
// layer was a measurable share of short decode steps.
struct Scratch {
  std::vector<float> q_rows, scores, inv_sum, keys_t;
  // The vdpbf16ps path's (attention_dpbf16.h): the queries as the model made them, the probabilities
  // rounded to bf16, and the keys transposed as 32-bit pairs. Grown only by calls that take that path
  // (grow_bf16).
  std::vector<at::BFloat16> q_bf16, p_bf16;
  std::vector<uint32_t> keys_w;
  // The brgemm path's p . v (values_by_brgemm): one KV head's values as VNNI pairs of keys, and a
  // block of rows' float32 outputs.
  std::vector<at::BFloat16> values_w;
  std::vector<float> pv_out;
  // An fp8 pool's values of one KV head widened to bf16 for vdpbf16ps ([keys][d]), and the slots
  // 0, 1, 2, ... they are read through (widen_values, attention_dpbf16.h).
  std::vector<at::BFloat16> values_bf16;
  std::vector<int32_t> iota;
  // Which keys keys_t holds: those [0, kt_keys) of KV head kt_head of request kt_request, in the
  // call kt_call. Later query blocks of the same request and head (extend) reuse them.
  int64_t kt_call = -1, kt_request = -1, kt_head = -1, kt_keys = 0;

  template <typename T>
  static void grow(std::vector<T>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  }

  static Scratch& for_this_thread(int64_t rows, int64_t head_dim, int64_t max_kv_len) {
    thread_local Scratch sc;
    grow(sc.q_rows, rows * head_dim);
    grow(sc.scores, rows * round_up(max_kv_len, kKeyBlock));
    grow(sc.inv_sum, rows);
    grow(sc.keys_t, head_dim * round_up(max_kv_len, kKeyBlock));
    return sc;
  }

  void grow_bf16(int64_t rows, int64_t head_dim, int64_t kv_len) {
    grow(q_bf16, rows * head_dim);
    grow(p_bf16, rows * round_up(kv_len, kKeyBlock));
    grow(keys_w, head_dim / 2 * round_up(kv_len, kKeyBlock));
  }
};

// Pass 1's Q . K^T for one block of kKeyBlock keys on brgemm: the key pairs transposed for vdpbf16ps
// (kw: [d / 2][kKeyBlock] 32-bit words) are already the VNNI layout brgemm reads, K = the head dim by
// N = the block's keys, so rows [r_first, rows_per_head) of the head whose first row is `row0` take
// one call per kBrgemmRows rows, and the scale after it, in float32 (vdpbf16ps applies it as it stores).
inline void scores_by_brgemm(const PagedAttentionArgs& a, Scratch& sc, const uint32_t* kw, int64_t row0,
                             int64_t r_first, int64_t rows_per_head, int64_t ld, int64_t t0, int64_t d) {
  for (int64_t r = r_first; r < rows_per_head; r += kBrgemmRows) {
    const int64_t m = std::min(kBrgemmRows, rows_per_head - r), row = row0 + r;
    float* s = sc.scores.data() + row * ld + t0;
    at::native::cpublas::brgemm(m, kKeyBlock, d, d, kKeyBlock, ld, /*add_C=*/false, sc.q_bf16.data() + row * d,
                                reinterpret_cast<const at::BFloat16*>(kw), s);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t t = 0; t < kKeyBlock; t += Vec::size()) {
        (Vec::loadu(s + i * ld + t) * Vec(a.scale)).store(s + i * ld + t);
      }
    }
  }
}

// Pass 3 on brgemm (an AMX CPU, or MINISGL_BRGEMM=1), as sgl-kernel's extend attention does: KV head
// h's values packed once as VNNI pairs of keys, [kv_len / 2][d][2] (zeros past kv_len), then for
// each block of up to kBrgemmRows of its rows, o = p . v one key block at a time up to the keys its
// last row sees (visible(r)), accumulating in float32, and finish(r0, rows, out) on the results.
// The probabilities are the bf16 ones the vdpbf16ps path reads, zero past each row's visible keys
// up to a whole key block.
template <typename kv_t, typename Visible, typename Finish>
void values_by_brgemm(const PagedAttentionArgs& a, Scratch& sc, const kv_t* v_head, const int32_t* token_slots,
                      int64_t h, int64_t rows_per_head, int64_t kv_len, int64_t ld, int64_t d, Visible&& visible,
                      Finish&& finish) {
  const int64_t keys = round_up(kv_len, kKeyBlock);
  Scratch::grow(sc.values_w, keys * d);
  Scratch::grow(sc.pv_out, kBrgemmRows * d);
  at::BFloat16* vw = sc.values_w.data();
  // Values t and t + 1's column c become one 32-bit word, vw[t / 2][c]: whole words in a loop the
  // compiler vectorizes (one 16-bit element at a time, into every other halfword, it was 40% of
  // attend_block's own time on an EAGLE tree's verify: 16 tokens, ~130 keys).
  static constexpr uint16_t zeros[kMaxHeadDim] = {};  // static: no 512-byte memset per call
  at::BFloat16 bufs[2][kMaxHeadDim];                   // an fp8 pool's two values, widened
  const auto value = [&](int64_t t, at::BFloat16* buf) {  // value t's bf16 bits, or zeros past kv_len
    if (t >= kv_len) return zeros;
    return reinterpret_cast<const uint16_t*>(bf16_row(v_head + token_slots[t] * a.v_slot_stride, buf, d));
  };
  for (int64_t t = 0; t < keys; t += 2) {
    const uint16_t *v0 = value(t, bufs[0]), *v1 = value(t + 1, bufs[1]);
    uint32_t* w = reinterpret_cast<uint32_t*>(vw) + t / 2 * d;
    for (int64_t c = 0; c < d; ++c) w[c] = v0[c] | static_cast<uint32_t>(v1[c]) << 16;
  }
  for (int64_t r0 = h * rows_per_head; r0 < (h + 1) * rows_per_head; r0 += kBrgemmRows) {
    const int64_t m = std::min(kBrgemmRows, (h + 1) * rows_per_head - r0);
    for (int64_t t0 = 0; t0 < visible(r0 + m - 1); t0 += kKeyBlock) {
      at::native::cpublas::brgemm(m, d, kKeyBlock, ld, d, d, /*add_C=*/t0 > 0, sc.p_bf16.data() + r0 * ld + t0,
                                  vw + t0 * d, sc.pv_out.data());
    }
    finish(r0, m, sc.pv_out.data());
  }
}

}  // namespace minisgl
