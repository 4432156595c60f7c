// Causal attention of a block of query tokens over one request's pages of the KV pool: the core
// that decode.cpp and extend.cpp share (SGLang keeps separate decode/extend kernels in
// sgl-kernel/csrc/cpu/decode.cpp and extend.cpp; here decode is extend with one query token).
//
// Keys are read in place through the request's row of req_to_token, so nothing is gathered into
// a padded copy, and each K/V row is loaded once per block and used by every query row of the
// block: the query heads that share a KV head (GQA) and the block's query tokens.
#pragma once

#include "attention_brgemm.h"
#include "attention_dpbf16.h"

#include <ATen/cpu/vec/functional.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <vector>

namespace minisgl {

// Asks for every cache line of [p, p + bytes) into L2 (prefetcht1, as the GEMMs' weight prefetches):
// decode reads K/V rows from slots scattered over the pool, which the hardware prefetchers cannot
// predict. Into L1 each prefetch held one of L1's few miss buffers until its line arrived, and the
// next ones waited: 1.4-1.9x slower over random slots (docs/performance.md, "Decode's prefetches").
inline void prefetch_bytes(const void* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(static_cast<const char*>(p) + off, 0, 2);
}

// Accumulators a tile keeps in registers: 24 of AVX-512's 32, 12 of AVX2's 16 (the rest hold the
// operands being multiplied). More would spill to the stack on every step.
constexpr int kAccumulators = Vec::size() == 16 ? 24 : 12;
// Query rows per tile of scores_by_tile: two accumulators each.
constexpr int kScoreRows = kAccumulators / 2;

// A custom mask over a block's query tokens (extend.cpp: an EAGLE tree): token j of the block sees
// key t where rows[j * ld + t]. Null: the causal mask alone.
struct RowMask {
  const bool* rows = nullptr;
  int64_t ld = 0;
};

// Where attend_block leaves its rows when the caller merges several key ranges (decode.cpp's
// split keys): each row's output in float32, divided by its own sum, and its log-sum-exp, by
// which the ranges are weighed. Null: rows are stored in o, in the model dtype.
struct PartialOut {
  float* o = nullptr;    // [rows][head_dim]
  float* lse = nullptr;  // [rows]
};

// Identifies one call of an attention kernel, so that a thread's Scratch never reuses keys
// transposed in an earlier call (another layer, or the same slots holding other tokens).
inline int64_t next_call_id() {
  static std::atomic<int64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

// {sum of a's lanes, of b's, of c's, of d's} into out[0, 4): the cross-lane sums of four dot
// products at once, about two instructions per score where one reduce_add costs six.
inline void store_sums4(Reg a, Reg b, Reg c, Reg d, float* out) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#if defined(CPU_CAPABILITY_AVX512)  // fold each zmm's halves into a ymm, then as AVX2
  const auto fold = [](__m512 x) { return _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1)); };
  const __m256 a8 = fold(a), b8 = fold(b), c8 = fold(c), d8 = fold(d);
#else
  const __m256 a8 = a, b8 = b, c8 = c, d8 = d;
#endif
  // hadd(hadd(a, b), hadd(c, d)) holds, per 128-bit lane, the lane's sums of a, b, c and d.
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
#else
  out[0] = Vec(a).reduce_add();
  out[1] = Vec(b).reduce_add();
  out[2] = Vec(c).reduce_add();
  out[3] = Vec(d).reduce_add();
#endif
}

// Keys per tile of scores_by_key, and query rows per tile: ROWS x 4 accumulators (12 of AVX2's
// 16 registers, 24 of AVX-512's 32) beside the 4 key registers.
constexpr int kTileKeys = 4;
constexpr int kKeyRows = kAccumulators / kTileKeys;

// scores[i * ld + j] = q_i . k_j for ROWS query rows and 4 keys: each piece of a key is loaded (and
// widened) once for all the rows, and the 4 x ROWS dot products are independent chains of FMAs
// (one per (row, key) was a chain of dependent FMAs and a cross-lane sum for every score).
template <int ROWS, int kDim, typename kv_t>
inline void score_keys(const float* q, int64_t d, const kv_t* const* keys, float* scores, int64_t ld) {
  Reg acc[ROWS][kTileKeys];
  for (int i = 0; i < ROWS; ++i) {
    for (int j = 0; j < kTileKeys; ++j) acc[i][j] = Vec(0.f);
  }
  for (int64_t c = 0; c < (kDim ? kDim : d); c += Vec::size()) {
    Reg k[kTileKeys];
    for (int j = 0; j < kTileKeys; ++j) k[j] = load_float(keys[j] + c);
    for (int i = 0; i < ROWS; ++i) {
      const Vec qi = Vec::loadu(q + i * d + c);
      for (int j = 0; j < kTileKeys; ++j) acc[i][j] = at::vec::fmadd(qi, Vec(k[j]), Vec(acc[i][j]));
    }
  }
  for (int i = 0; i < ROWS; ++i) store_sums4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], scores + i * ld);
}

// Pass 1 of attend_block when few query rows share each key (decode: one GQA group per KV head),
// scores[r][t] = q_r . k_t, four keys at a time. Every row gets a score for every key; the
// softmax ignores those past a row's visible keys. Entries up to ld may be written (ld is a
// multiple of kTileKeys).
template <int kDim, typename kv_t>
void scores_by_key(const PagedAttentionArgs& a, Scratch& sc, const kv_t* k_buf, const kv_t* v_buf,
                   const int32_t* token_slots, int64_t head_begin, int64_t heads, int64_t rows_per_head,
                   int64_t kv_len, int64_t ld) {
  const int64_t d = kDim ? kDim : a.head_dim;
  for (int64_t t0 = 0; t0 < kv_len; t0 += kTileKeys) {
    // This item's K and (for pass 3) V heads of the keys 8 ahead.
    for (int64_t t = t0 + 8; t < std::min(t0 + 8 + kTileKeys, kv_len); ++t) {
      prefetch_bytes(k_buf + token_slots[t] * a.k_slot_stride + head_begin * d, heads * d * sizeof(kv_t));
      prefetch_bytes(v_buf + token_slots[t] * a.v_slot_stride + head_begin * d, heads * d * sizeof(kv_t));
    }
    const int64_t n = std::min<int64_t>(kTileKeys, kv_len - t0);
    for (int64_t h = 0; h < heads; ++h) {
      const kv_t* keys[kTileKeys];  // past the last key, the last key again (its scores are never read)
      for (int64_t j = 0; j < kTileKeys; ++j) {
        keys[j] = k_buf + token_slots[t0 + std::min(j, n - 1)] * a.k_slot_stride + (head_begin + h) * d;
      }
      for (int64_t r = 0; r < rows_per_head; r += kKeyRows) {
        const int64_t row = h * rows_per_head + r;
        with_rows<kKeyRows>(std::min<int64_t>(kKeyRows, rows_per_head - r), [&]<int R>() {
          score_keys<R, kDim>(sc.q_rows.data() + row * d, d, keys, sc.scores.data() + row * ld + t0, ld);
        });
      }
    }
  }
}

// scores[i][0, kKeyBlock) = q_i . kt[:, 0, kKeyBlock) for ROWS query rows: one tile of scores_by_tile.
template <int ROWS, int kDim>
inline void score_tile(const float* q, int64_t d, const float* kt, float* scores, int64_t ld) {
  Vec acc0[ROWS], acc1[ROWS];
  for (int i = 0; i < ROWS; ++i) acc0[i] = acc1[i] = Vec(0.f);
  for (int64_t c = 0; c < (kDim ? kDim : d); ++c) {
    const Vec k0 = Vec::loadu(kt + c * kKeyBlock), k1 = Vec::loadu(kt + c * kKeyBlock + Vec::size());
    for (int i = 0; i < ROWS; ++i) {
      const Vec qi(q[i * d + c]);
      acc0[i] = at::vec::fmadd(qi, k0, acc0[i]);
      acc1[i] = at::vec::fmadd(qi, k1, acc1[i]);
    }
  }
  for (int i = 0; i < ROWS; ++i) {
    acc0[i].store(scores + i * ld);
    acc1[i].store(scores + i * ld + Vec::size());
  }
}

// Pass 1 of attend_block when many query rows share each key (extend): a block of kKeyBlock keys is
// widened and transposed once into keys_t[block][d][kKeyBlock], and then Q . K^T for the block is a
// small GEMM: each query element is broadcast against a row of keys_t, with no horizontal sums
// (which scores_by_key needs, one per query row and key). Rows that see none of a block's keys
// skip it. The transposed blocks stay in the thread's Scratch, so the request's later query blocks
// (which see the same keys and more) transpose only the keys they add: `who` names the call,
// request and first KV head, or is null where nothing is to be reused.
// On the bf16 path, with `brgemm`, Q . K^T goes to AMX's tiles instead (scores_on_tiles: minisgl's
// own loop where `own`, else oneDNN's brgemm); the caller configures and releases them. V rows
// (v_buf) are only prefetched here, for pass 3.
template <int kDim, bool kDp, typename kv_t>
void scores_by_tile(const PagedAttentionArgs& a, Scratch& sc, const kv_t* k_buf, const kv_t* v_buf,
                    const int32_t* token_slots, int64_t head_begin, int64_t heads, int64_t rows_per_head,
                    int64_t kv_len, int64_t ld, int64_t start, const KeyReuse& who, bool brgemm, bool own) {
  const int64_t d = kDim ? kDim : a.head_dim;
  for (int64_t h = 0; h < heads; ++h) {
    sc.keys_held.claim(who, head_begin + h);
    for (int64_t t0 = 0; t0 < kv_len; t0 += kKeyBlock) {
      const int64_t n = std::min(kKeyBlock, kv_len - t0);
      float* kt = sc.keys_t.data() + t0 * d;  // block t0 / kKeyBlock: [d][kKeyBlock], float32
      uint32_t* kw = kDp ? sc.keys_w.data() + t0 * d / 2 : nullptr;  // or [d / 2][kKeyBlock] pairs
      if (t0 + n > sc.keys_held.keys) {  // a block not transposed yet, or only in part
        // The next block's K and V rows, into L2: a prefix (a verify's context, a radix hit) lies in
        // scattered slots, as decode's keys do (docs/performance.md, "Decode's prefetches go to L2").
        for (int64_t t = t0 + kKeyBlock; t < std::min(t0 + 2 * kKeyBlock, kv_len); ++t) {
          prefetch_bytes(k_buf + token_slots[t] * a.k_slot_stride + (head_begin + h) * d, d * sizeof(kv_t));
          prefetch_bytes(v_buf + token_slots[t] * a.v_slot_stride + (head_begin + h) * d, d * sizeof(kv_t));
        }
        if constexpr (kDp) {
          const kv_t* block[kKeyBlock];
          for (int64_t t = 0; t < n; ++t) block[t] = k_buf + token_slots[t0 + t] * a.k_slot_stride + (head_begin + h) * d;
          transpose_key_words<kDim, kKeyBlock>(block, n, kw);
        } else {
          float row[kMaxHeadDim];  // a key widened in vector registers (e4m3 element by element: ~5% slower extend)
          for (int64_t t = 0; t < kKeyBlock; ++t) {
            if (t < n) {
              const float* k = as_float(k_buf + token_slots[t0 + t] * a.k_slot_stride + (head_begin + h) * d, row, d);
              for (int64_t c = 0; c < d; ++c) kt[c * kKeyBlock + t] = k[c];
            } else {  // past the last key: zeros, never read back, but no NaN or denormal garbage to multiply
              for (int64_t c = 0; c < d; ++c) kt[c * kKeyBlock + t] = 0.f;
            }
          }
        }
        sc.keys_held.keys = t0 + n;
      }
      // Row r (token j = r / group) sees keys up to start + j, so rows from (t0 - start) * group on.
      if (kDp && brgemm) {
        scores_on_tiles(a, sc, kw, h * rows_per_head, std::max<int64_t>(0, t0 - start) * a.group, rows_per_head, ld,
                        t0, d, own);
        continue;
      }
      for (int64_t r = std::max<int64_t>(0, t0 - start) * a.group; r < rows_per_head; r += kScoreRows) {
        const int64_t row = h * rows_per_head + r;
        with_rows<kScoreRows>(std::min<int64_t>(kScoreRows, rows_per_head - r), [&]<int R>() {
          if constexpr (kDp) {
            score_tile_dpbf16<R, kDim, kKeyBlock>(sc.q_bf16.data() + row * d, kw, sc.scores.data() + row * ld + t0,
                                                  ld, a.scale);
          } else {
            score_tile<R, kDim>(sc.q_rows.data() + row * d, d, kt, sc.scores.data() + row * ld + t0, ld);
          }
        });
      }
    }
  }
}

// Vectors of a head per value tile, and query rows per tile: ROWS x kValueVecs accumulators beside
// the tile's kValueVecs pieces of v and one broadcast probability: 20 + 4 + 1 of AVX-512's 32
// registers, 10 + 2 + 1 of AVX2's 16. With 6 rows x 4 (29 of 32) GCC kept one accumulator on the
// stack, and its store and reload each key bounded the loop: perf put 30% of the pass on that store.
constexpr int kValueVecs = Vec::size() == 16 ? 4 : 2;
constexpr int kValueRows = 5;

// out[i * d + c] = sum_t p[i][t] * v_t[c] over keys [0, n), for ROWS query rows of one KV head and
// the NV vectors of the head starting at v_piece: each piece of v_t is loaded (and widened) once for
// all the rows, and each row's p[i][t] is broadcast once for all the pieces. (One row at a time, as
// before, read every value row once per query row.) Rows that see fewer keys have p = 0 past them.
template <int ROWS, int NV, typename kv_t>
inline void value_tile(const PagedAttentionArgs& a, const float* p, int64_t ld, int64_t n, const kv_t* v_piece,
                       const int32_t* token_slots, float* out, int64_t d) {
  Reg acc[ROWS][NV];
  for (int i = 0; i < ROWS; ++i) {
    for (int c = 0; c < NV; ++c) acc[i][c] = Vec(0.f);
  }
  for (int64_t t = 0; t < n; ++t) {
    const kv_t* v = v_piece + token_slots[t] * a.v_slot_stride;
    Reg vt[NV];
    for (int c = 0; c < NV; ++c) vt[c] = load_float(v + c * Vec::size());
    for (int i = 0; i < ROWS; ++i) {
      const Vec pt(p[i * ld + t]);
      for (int c = 0; c < NV; ++c) acc[i][c] = at::vec::fmadd(pt, Vec(vt[c]), Vec(acc[i][c]));
    }
  }
  for (int i = 0; i < ROWS; ++i) {
    for (int c = 0; c < NV; ++c) Vec(acc[i][c]).store(out + i * d + c * Vec::size());
  }
}

// value_tile over the whole head, kValueVecs vectors at a time: with a head dim known at compile
// time that is a multiple of them (64 and 128 at either width), only NV = kValueVecs is built.
template <int ROWS, int kDim, typename kv_t>
inline void value_rows(const PagedAttentionArgs& a, const float* p, int64_t ld, int64_t n, const kv_t* v_head,
                       const int32_t* token_slots, float* out) {
  const int64_t d = kDim ? kDim : a.head_dim;
  for (int64_t c = 0; c < d; c += kValueVecs * Vec::size()) {
    if constexpr (kDim != 0 && kDim % (kValueVecs * Vec::size()) == 0) {
      value_tile<ROWS, kValueVecs>(a, p, ld, n, v_head + c, token_slots, out + c, d);
    } else {
      with_rows<kValueVecs>(std::min<int64_t>(kValueVecs, (d - c) / Vec::size()), [&]<int NV>() {
        value_tile<ROWS, NV>(a, p, ld, n, v_head + c, token_slots, out + c, d);
      });
    }
  }
}

// Queries: tokens [first, first + count) of a request whose new tokens start at absolute position
// `prefix` (token j sits at prefix + j and sees keys 0..prefix + j), for KV heads
// [head_begin, head_end) and the `group` query heads of each. Scratch must hold
// count * group * (head_end - head_begin) rows and prefix + first + count keys.
// kDim is the head dim when it is a compile-time constant (64, 128: loops over a row unroll
// into a few vector instructions), 0 otherwise; either way a multiple of Vec::size().
template <int kDim, typename scalar_t, typename kv_t>
void attend_block(const PagedAttentionArgs& a, const scalar_t* q, scalar_t* o, int64_t o_token_stride,
                  const kv_t* k_buf, const kv_t* v_buf, const int32_t* token_slots, int64_t head_begin,
                  int64_t head_end, int64_t prefix, int64_t first, int64_t count, Scratch& sc,
                  const KeyReuse& who = {}, const RowMask& mask = {}, const PartialOut& partial = {}) {
  const int64_t d = kDim ? kDim : a.head_dim, n_vec = d / Vec::size();
  const int64_t heads = head_end - head_begin;
  const int64_t rows_per_head = count * a.group, rows = heads * rows_per_head;
  const int64_t kv_len = prefix + first + count;  // keys visible to the block's last token
  // Row r = (KV head h, token j, query head g): the rows of one KV head are contiguous.
  auto row = [&](int64_t h, int64_t j, int64_t g) { return h * rows_per_head + j * a.group + g; };
  // Keys visible to row r: 0 .. prefix + first + j.
  auto visible = [&](int64_t r) { return prefix + first + (r % rows_per_head) / a.group + 1; };
  // A bf16 model over a bf16 (or fp8) pool on a CPU with AVX512-BF16 (`engine`) takes p . v on
  // vdpbf16ps (attention_dpbf16.h), and with many rows per key (extend, `dp`) the scores too, from the
  // queries as the model made them, unscaled.
  constexpr bool kFp8 = std::is_same_v<kv_t, c10::Float8_e5m2> || std::is_same_v<kv_t, c10::Float8_e4m3fn>;
  constexpr bool kBf16 = std::is_same_v<scalar_t, at::BFloat16> && (std::is_same_v<kv_t, at::BFloat16> || kFp8) &&
                         kDim > 0 && kDim % 32 == 0;
  const bool engine = kBf16 && cpu_has_avx512_bf16();
  const bool by_tile = rows_per_head >= kScoreRows, dp = engine && by_tile;
  const bool brgemm = dp && use_brgemm(engines().amx_bf16);  // both products on AMX's tiles (attention_brgemm.h)
  const bool own = use_own_tiles(brgemm, engines().amx_bf16, /*whole_tiles=*/true);  // kDim: whole tile rows
  // An fp8 pool's p . v: on vdpbf16ps where a head has several row tiles (extend), its values
  // widened to bf16 once per head; decode's one tile of a GQA group takes FMAs, widening each value
  // as it reads it (0.71-0.84 against 0.82-0.96 ms a layer on vdpbf16ps, 64 requests x 200 keys,
  // AVX-512 EPYC, e5m2). A bf16 pool's decode stays on vdpbf16ps: on FMAs it took 1.01-1.21 ms.
  constexpr bool kWidenable = kBf16 && kDim % 64 == 0 && kFp8;
  const bool dp_values = engine && (rows_per_head > kValueRows || !kFp8);
  const bool widen = kWidenable && dp_values;
  if (engine) sc.grow_bf16(rows, d, kv_len);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t g = 0; g < a.group; ++g) {
        const scalar_t* src = q + (first + j) * a.q_token_stride + ((head_begin + h) * a.group + g) * a.q_head_stride;
        if constexpr (kBf16) {
          if (dp) {
            std::copy_n(src, d, sc.q_bf16.data() + row(h, j, g) * d);
            continue;
          }
        }
        float* dst = sc.q_rows.data() + row(h, j, g) * d;
        for (int64_t c = 0; c < n_vec; ++c) (load_float(src + c * Vec::size()) * Vec(a.scale)).store(dst + c * Vec::size());
      }
    }
  }

  // 1. scores[r][t] = q_r . k_t for the keys each row sees (entries past that are never used).
  const int64_t ld = round_up(kv_len, kKeyBlock);
  const auto tiles = [&]<bool kDp>() {
    scores_by_tile<kDim, kDp, kv_t>(a, sc, k_buf, v_buf, token_slots, head_begin, heads, rows_per_head, kv_len, ld,
                                    prefix + first, who, brgemm, own);
  };
  if (own) configure_amx_tiles();
  if (!by_tile) {
    scores_by_key<kDim, kv_t>(a, sc, k_buf, v_buf, token_slots, head_begin, heads, rows_per_head, kv_len, ld);
  } else if constexpr (kBf16) {
    dp ? tiles.template operator()<true>() : tiles.template operator()<false>();
  } else {
    tiles.template operator()<false>();
  }
  // 2. softmax over each row's visible keys (the division is deferred to the output); p = 0 past them,
  // for the value tiles that run to their last row's keys.
  for (int64_t r = 0; r < rows; ++r) {
    float* s = sc.scores.data() + r * ld;
    if (mask.rows) {  // keys the causal mask shows but the custom one hides get no weight
      const bool* sees = mask.rows + (r % rows_per_head) / a.group * mask.ld;
      // memchr (vectorized in libc) jumps to the next hidden key: a branch per key was a third of
      // attend_block's own time on an EAGLE tree's verify, whose rows hide only a few of their keys.
      const bool *hidden = sees, *end = sees + visible(r);
      while ((hidden = static_cast<const bool*>(std::memchr(hidden, 0, end - hidden)))) {
        s[hidden - sees] = -std::numeric_limits<float>::infinity();
        ++hidden;
      }
    }
    const float m = max_of(s, visible(r));
    const float sum = exp_and_sum(s, visible(r), m);
    sc.inv_sum[r] = 1.f / sum;
    if (partial.lse) partial.lse[r] = m + std::log(sum);
    std::fill(s + visible(r), s + kv_len, 0.f);
    if (dp_values) store_row(s, sc.p_bf16.data() + r * ld, kv_len);  // rounded to nearest even, for vdpbf16ps
    if (brgemm) std::fill(sc.p_bf16.data() + r * ld + kv_len, sc.p_bf16.data() + (r + 1) * ld, at::BFloat16(0.f));
  }
  // 3. o_r = sum_t p[r][t] * v_t / sum_r, in tiles of a KV head's rows: for a bf16 model over a bf16
  // pool on vdpbf16ps (decode too: a call covers all the keys), from probabilities rounded to bf16
  // as sgl-kernel's brgemm takes them; the sum they are divided by stays the float32 one.
  // Each block of rows is then divided by its sums and stored in the model dtype.
  const auto finish = [&](int64_t r0, int64_t n_rows, float* out) {
    for (int64_t i = 0; i < n_rows; ++i) {
      const int64_t r = r0 + i, h = r / rows_per_head, j = (r % rows_per_head) / a.group, g = r % a.group;
      scalar_t* dst = o + (first + j) * o_token_stride + ((head_begin + h) * a.group + g) * d;
      const Vec inv(sc.inv_sum[r]);
      for (int64_t c = 0; c < n_vec; ++c) (Vec::loadu(out + i * d + c * Vec::size()) * inv).store(out + i * d + c * Vec::size());
      if (partial.o) {
        std::copy_n(out + i * d, d, partial.o + r * d);
      } else if constexpr (std::is_same_v<scalar_t, float>) {
        std::copy_n(out + i * d, d, dst);
      } else {
        store_row(out + i * d, dst, d);  // rounds to the model dtype in vector registers
      }
    }
  };
  if constexpr (kBf16) {  // brgemm is only ever true here
    if (brgemm) {
      for (int64_t h = 0; h < heads; ++h) {
        values_on_tiles(a, sc, v_buf + (head_begin + h) * d, token_slots, h, rows_per_head, kv_len, ld, d, own,
                        who, head_begin + h, visible, finish);
      }
      own ? release_amx_tiles() : at::native::cpublas::brgemm_release();
      return;
    }
  }
  float out[kValueRows * kMaxHeadDim];
  for (int64_t h = 0; h < heads; ++h) {
    if constexpr (kWidenable) {
      if (widen) {
        widen_values(a, sc, v_buf + (head_begin + h) * d, token_slots, visible((h + 1) * rows_per_head - 1), d);
      }
    }
    for (int64_t r0 = h * rows_per_head; r0 < (h + 1) * rows_per_head; r0 += kValueRows) {
      const int64_t n_rows = std::min<int64_t>(kValueRows, (h + 1) * rows_per_head - r0);
      with_rows<kValueRows>(n_rows, [&]<int R>() {
        const int64_t n = visible(r0 + R - 1);
        if constexpr (kBf16 && kDim % 64 == 0) {
          if (dp_values) {
            for (int64_t c = 0; c < d; c += 64) {
              if (widen) {
                value_tile_dpbf16<R>(sc.p_bf16.data() + r0 * ld, ld, n, sc.values_bf16.data() + c, d, sc.iota.data(),
                                     out + c, d);
              } else {
                value_tile_dpbf16<R>(sc.p_bf16.data() + r0 * ld, ld, n, v_buf + (head_begin + h) * d + c,
                                     a.v_slot_stride, token_slots, out + c, d);
              }
            }
            return;
          }
        }
        value_rows<R, kDim>(a, sc.scores.data() + r0 * ld, ld, n, v_buf + (head_begin + h) * d, token_slots, out);
      });
      finish(r0, n_rows, out);
    }
  }
}

}  // namespace minisgl
