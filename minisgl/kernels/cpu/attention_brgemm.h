// What attention's passes keep per thread (attention.h's Scratch), the key block they share, and
// their two products on AMX's tiles: the matrix-engine path of an AMX CPU, for a bf16 model over a
// bf16 (or fp8) pool. sgl-kernel's extend attention hands each block to oneDNN's brgemm ukernel, as
// minisgl does under MINISGL_BRGEMM=1 (common.h); by default the blocks go to the GEMMs' own tile
// loop (gemm_amx.h), configured once per call of attend_block. Both give the same bits.
#pragma once

#include "attention_args.h"
#include "gemm_amx.h"

#include <ATen/native/CPUBlas.h>

#include <type_traits>
#include <vector>

namespace minisgl {

// Keys per block of scores_by_tile: two vectors of scores per query row.
constexpr int64_t kKeyBlock = 2 * Vec::size();
// Query rows per block (two AMX tiles of 16 rows).
constexpr int64_t kBrgemmRows = 32;

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Which keys an attention pass may take from the thread's Scratch: those it prepared earlier in the
// same call (call id from next_call_id) for the same request. call < 0: none.
struct KeyReuse {
  int64_t call = -1, request = -1;
};

// Which keys a Scratch buffer holds prepared: [0, keys) of KV head `head` of request `request`, in
// the call `call`. Extend's later query blocks of a request see the same keys and more, so they
// prepare only the keys they add.
struct HeldKeys {
  int64_t call = -1, request = -1, head = -1, keys = 0;

  // Keeps the keys if they are (who, kv_head)'s, else forgets them (keys = 0).
  void claim(const KeyReuse& who, int64_t kv_head) {
    if (who.call < 0 || call != who.call || request != who.request || head != kv_head) {
      *this = {who.call, who.request, kv_head, 0};
    }
  }
};

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
  // The AMX path's p . v (values_on_tiles): one KV head's values as VNNI pairs of keys, and a
  // block of rows' float32 outputs.
  std::vector<at::BFloat16> values_w;
  std::vector<float> pv_out;
  // An fp8 pool's values of one KV head widened to bf16 for vdpbf16ps ([keys][d]), and the slots
  // 0, 1, 2, ... they are read through (widen_values, attention_dpbf16.h).
  std::vector<at::BFloat16> values_bf16;
  std::vector<int32_t> iota;
  // Which keys keys_t (or keys_w) holds transposed, and values_w packed.
  HeldKeys keys_held, values_held;

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

  // A block's tiles load 16 rows however few it has: kBrgemmRows rows to spare past the last.
  void grow_bf16(int64_t rows, int64_t head_dim, int64_t kv_len) {
    grow(q_bf16, (rows + kBrgemmRows) * head_dim);
    grow(p_bf16, (rows + kBrgemmRows) * round_up(kv_len, kKeyBlock));
    grow(keys_w, head_dim / 2 * round_up(kv_len, kKeyBlock));
  }
};

// A block of up to kBrgemmRows rows of A (row stride lda) times 32 columns of B ([K / 2][ldb][2])
// over K, into out (row stride ldc), times `scale`: on minisgl's own tiles (`own`, configured by the
// caller), else on brgemm.
inline void block_product(bool own, int64_t m, const at::BFloat16* A, int64_t lda, const at::BFloat16* B, int64_t ldb,
                          int64_t K, float* out, int64_t ldc, float scale) {
  alignas(64) float block[kBrgemmRows * VNNI_BLOCK_N];
  if (own) {
    const at::BFloat16* a[2] = {A, A + AMX_TILE_ROWS * lda};
    const int64_t ld[2] = {lda, lda};
    block_amx_bf16(a, ld, m, B, K, block, ldb);
  } else {
    at::native::cpublas::brgemm(m, VNNI_BLOCK_N, K, lda, ldb, VNNI_BLOCK_N, /*add_C=*/false, A, B, block);
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < VNNI_BLOCK_N; t += Vec::size()) {
      (Vec::loadu(block + i * VNNI_BLOCK_N + t) * Vec(scale)).store(out + i * ldc + t);
    }
  }
}

// Pass 1's Q . K^T for one block of kKeyBlock keys on the tiles: the key pairs transposed for
// vdpbf16ps (kw: [d / 2][kKeyBlock] 32-bit words) are already the VNNI layout the tiles read, K = the
// head dim by N = the block's keys, so rows [r_first, rows_per_head) of the head whose first row is
// `row0` take one block per kBrgemmRows rows, and the scale as they are stored, in float32.
inline void scores_on_tiles(const PagedAttentionArgs& a, Scratch& sc, const uint32_t* kw, int64_t row0,
                            int64_t r_first, int64_t rows_per_head, int64_t ld, int64_t t0, int64_t d, bool own) {
  // Only an AVX-512 build reaches the tiles (every AMX CPU has AVX-512 and gets one); there a key
  // block is 32 keys. An AVX2 build, whose blocks are 16, compiles this without ever calling it.
#if defined(CPU_CAPABILITY_AVX512)
  static_assert(kKeyBlock == VNNI_BLOCK_N, "a key block is one panel of the tiles");
#endif
  for (int64_t r = r_first; r < rows_per_head; r += kBrgemmRows) {
    const int64_t m = std::min(kBrgemmRows, rows_per_head - r), row = row0 + r;
    block_product(own, m, sc.q_bf16.data() + row * d, d, reinterpret_cast<const at::BFloat16*>(kw), kKeyBlock, d,
                  sc.scores.data() + row * ld + t0, ld, a.scale);
  }
}

// Pass 3 on the tiles, as sgl-kernel's extend attention does on brgemm: KV head h's values packed
// as VNNI pairs of keys, [kv_len / 2][d][2] (zeros past kv_len; a request's earlier query blocks
// packed the values they saw, `who`, so only the pairs past those are packed), then for each block
// of up to kBrgemmRows of its rows, o = p . v over the keys its last row sees (visible(r), up to a
// whole key block), 32 of the head's columns at a time, in float32, and finish(r0, rows, out) on
// the results. brgemm (MINISGL_BRGEMM=1) takes one call per key block, adding into its float32
// output; the own tiles keep the sums in their registers over all the keys, in the same order.
// The probabilities are the bf16 ones the vdpbf16ps path reads, zero past each row's visible keys
// up to a whole key block.
template <typename kv_t, typename Visible, typename Finish>
void values_on_tiles(const PagedAttentionArgs& a, Scratch& sc, const kv_t* v_head, const int32_t* token_slots,
                     int64_t h, int64_t rows_per_head, int64_t kv_len, int64_t ld, int64_t d, bool own,
                     const KeyReuse& who, int64_t kv_head, Visible&& visible, Finish&& finish) {
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
  sc.values_held.claim(who, kv_head);
  // From the pair that holds the last value packed: past it come zeros, which this call's values replace.
  for (int64_t t = sc.values_held.keys / 2 * 2; t < keys; t += 2) {
    const uint16_t *v0 = value(t, bufs[0]), *v1 = value(t + 1, bufs[1]);
    uint32_t* w = reinterpret_cast<uint32_t*>(vw) + t / 2 * d;
    for (int64_t c = 0; c < d; ++c) w[c] = v0[c] | static_cast<uint32_t>(v1[c]) << 16;
  }
  sc.values_held.keys = kv_len;
  for (int64_t r0 = h * rows_per_head; r0 < (h + 1) * rows_per_head; r0 += kBrgemmRows) {
    const int64_t m = std::min(kBrgemmRows, (h + 1) * rows_per_head - r0);
    const int64_t keys_seen = round_up(visible(r0 + m - 1), kKeyBlock);
    if (own) {
      for (int64_t c = 0; c < d; c += VNNI_BLOCK_N) {
        block_product(true, m, sc.p_bf16.data() + r0 * ld, ld, vw + 2 * c, d, keys_seen, sc.pv_out.data() + c, d, 1.f);
      }
    } else {
      for (int64_t t0 = 0; t0 < keys_seen; t0 += kKeyBlock) {
        at::native::cpublas::brgemm(m, d, kKeyBlock, ld, d, d, /*add_C=*/t0 > 0, sc.p_bf16.data() + r0 * ld + t0,
                                    vw + t0 * d, sc.pv_out.data());
      }
    }
    finish(r0, m, sc.pv_out.data());
  }
}

}  // namespace minisgl
