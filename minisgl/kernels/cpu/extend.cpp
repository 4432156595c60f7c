// Extend (prefill) attention over the paged KV pool: each request's new tokens attend causally
// to its cached prefix and to each other (mirrors sgl-kernel/csrc/cpu/extend.cpp,
// extend_attention_cpu).
//
// The kernel first stores every new token's K/V in the pool (one parallel pass: a block reads
// keys other threads' tokens bring), so prefix and new keys are then read the same way, through
// req_to_token. Attention work items are (request, block of new tokens, KV head).
//
// An EAGLE tree (minisgl/speculative/eagle_utils.py) narrows the causal mask with a custom one,
// as SGLang's GPU extend kernels take `custom_mask`; sgl-kernel's CPU kernel has none.
#include <array>

#include "attention.h"

namespace minisgl {
namespace {

// A checked custom mask, and the slots it makes the kernel read keys from: per request its
// req_to_token row up to the prefix, then its new tokens' own slots from `loc`.
struct TreeMask {
  const bool* mask = nullptr;
  std::vector<int64_t> mask_start, slot_start;
  std::vector<int32_t> slots;
};

TreeMask tree_mask(const at::Tensor& custom_mask, const at::Tensor& loc, const at::Tensor& req_to_token,
                   const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens,
                   const at::Tensor& extend_start_loc) {
  CHECK_INPUT(custom_mask);
  TORCH_CHECK(custom_mask.scalar_type() == at::kBool, "extend_attention_cpu: custom_mask must be bool");
  const int64_t bs = seq_lens.size(0), max_context = req_to_token.size(1);
  const int64_t *lens = seq_lens.data_ptr<int64_t>(), *ext_lens = extend_seq_lens.data_ptr<int64_t>();
  const int64_t *ext_start = extend_start_loc.data_ptr<int64_t>(), *req_idx = req_pool_indices.data_ptr<int64_t>();
  const int64_t* loc_p = loc.data_ptr<int64_t>();
  TreeMask t;
  t.mask = custom_mask.data_ptr<bool>();
  int64_t mask_size = 0, slot_size = 0;
  for (int64_t b = 0; b < bs; ++b) {
    t.mask_start.push_back(mask_size);
    t.slot_start.push_back(slot_size);
    mask_size += ext_lens[b] * lens[b];
    slot_size += lens[b];
  }
  // Longer is allowed: a compiled verify's mask is a static buffer sized for the longest rows.
  TORCH_CHECK(custom_mask.numel() >= mask_size,
              "extend_attention_cpu: custom_mask must hold extend_len x seq_len entries per request");
  t.slots.resize(slot_size);
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t prefix = lens[b] - ext_lens[b];
    std::copy_n(req_to_token.data_ptr<int32_t>() + req_idx[b] * max_context, prefix, t.slots.data() + t.slot_start[b]);
    for (int64_t j = 0; j < ext_lens[b]; ++j) {
      t.slots[t.slot_start[b] + prefix + j] = static_cast<int32_t>(loc_p[ext_start[b] + j]);
      const bool* row = t.mask + t.mask_start[b] + j * lens[b];
      TORCH_CHECK(row[prefix + j] && std::none_of(row + prefix + j + 1, row + lens[b], [](bool m) { return m; }),
                  "extend_attention_cpu: custom_mask must let each new token see itself and no later token");
    }
  }
  return t;
}

}  // namespace

// q, o: [num_tokens, heads, dim], the requests' new tokens back to back; key, value: their
// [num_tokens, kv_heads, dim], stored at pool slots `loc`; extend_seq_lens and extend_start_loc
// say where each request's run starts and how long it is; seq_lens include the new tokens.
//
// custom_mask (optional, bool): per request a row-major [extend_len, seq_len] block, back to back,
// true where a new token may see a key (SGLang's layout, with mask_indptr implied by the lengths);
// entries past the last block are not read.
// It may only narrow the causal mask: a token sees itself and no later token, which holds for
// EAGLE's trees because build_tree_kernel_efficient puts every node after its ancestors. With a
// mask the new tokens' keys are read from `loc`, not req_to_token: EAGLE's draft steps run a
// request's lanes as one-token extends that share its req_to_token row, each in its own slot.
void extend_attention_cpu(const at::Tensor& q, at::Tensor& o, at::Tensor& k_buffer, at::Tensor& v_buffer,
                          const at::Tensor& key, const at::Tensor& value, const at::Tensor& loc,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens,
                          const at::Tensor& extend_start_loc, double scale,
                          const std::optional<at::Tensor>& custom_mask) {
  const PagedAttentionArgs a =
      check_paged_attention(q, o, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, scale);
  check_new_kv(a, q, key, value, loc);
  CHECK_INPUT(extend_seq_lens);
  CHECK_INPUT(extend_start_loc);
  const int64_t bs = seq_lens.size(0), max_context = req_to_token.size(1);
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t* ext_lens = extend_seq_lens.data_ptr<int64_t>();
  const int64_t* ext_start = extend_start_loc.data_ptr<int64_t>();
  const int64_t* req_idx = req_pool_indices.data_ptr<int64_t>();

  // A request's new tokens go in blocks of up to `block` (32) of nearly equal length, each of at least
  // min_block tokens where it has that many, so that every block's rows fill a score tile
  // (scores_by_tile); a block's scores are [its tokens * group, its kv_len].
  constexpr int64_t kBlock = 32;
  const int64_t min_block = (kScoreRows + a.group - 1) / a.group;
  const auto num_blocks_of = [&](int64_t ext, int64_t block) {
    return ext == 0 ? 0 : std::max<int64_t>(1, std::min((ext + block - 1) / block, ext / min_block));
  };
  int64_t max_len = 0;
  for (int64_t b = 0; b < bs; ++b) {
    TORCH_CHECK(lens[b] <= max_context && ext_lens[b] <= lens[b], "extend_attention_cpu: bad lengths");
    max_len = std::max(max_len, lens[b]);
  }
  // Work items are (block, KV head). An EAGLE verify at batch 1 (8 tokens over SmolLM2's 3 KV heads)
  // made 3 items for 2 threads: one thread took two, the other one and then waited. With fewer items
  // than two per thread the blocks are halved, down to min_block: 6 items there.
  int64_t block = kBlock;
  const auto num_items = [&](int64_t blk) {
    int64_t n = 0;
    for (int64_t b = 0; b < bs; ++b) n += num_blocks_of(ext_lens[b], blk);
    return n * a.num_kv_heads;
  };
  while (block > min_block && num_items(block) < 2 * at::get_num_threads()) block = std::max(min_block, block / 2);
  std::vector<std::array<int64_t, 3>> blocks;  // (request, first new token, tokens)
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t n = num_blocks_of(ext_lens[b], block);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t first = ext_lens[b] * i / n;
      blocks.push_back({b, first, ext_lens[b] * (i + 1) / n - first});
    }
  }
  const int64_t num_blocks = static_cast<int64_t>(blocks.size());
  const TreeMask tree = custom_mask ? tree_mask(*custom_mask, loc, req_to_token, req_pool_indices, seq_lens,
                                                extend_seq_lens, extend_start_loc)
                                    : TreeMask{};
  const int64_t call = next_call_id();
  MINISGL_DISPATCH_FLOATING_TYPES(q.scalar_type(), "extend_attention_cpu", [&] {
    const int64_t* slots = loc.data_ptr<int64_t>();
    dispatch_kv_dtype<scalar_t>(k_buffer, [&]<typename kv_t>() {
      at::parallel_for(0, q.size(0), 64, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          store_kv<scalar_t>(a, key, value, i, slots[i], 0, a.num_kv_heads, k_buffer.data_ptr<kv_t>(),
                             v_buffer.data_ptr<kv_t>());
        }
      });
      dispatch_head_dim(a, [&]<int kDim>() {
        // Items go KV head by KV head, and within one, a request's blocks in order: a thread walks a
        // contiguous range of them, so its next block is usually the same request's next one and
        // reuses the keys this one transposed (scores_by_tile).
        at::parallel_for(0, num_blocks * a.num_kv_heads, 1, [&](int64_t begin, int64_t end) {
          Scratch& scratch = Scratch::for_this_thread(kBlock * a.group, a.head_dim, max_len);
          for (int64_t item = begin; item < end; ++item) {
            const auto [b, first, count] = blocks[item % num_blocks];
            const int64_t head = item / num_blocks;
            const int32_t* slots_b = tree.mask ? tree.slots.data() + tree.slot_start[b]
                                               : req_to_token.data_ptr<int32_t>() + req_idx[b] * max_context;
            const bool* mask_b = tree.mask ? tree.mask + tree.mask_start[b] + first * lens[b] : nullptr;
            attend_block<kDim>(a, q.data_ptr<scalar_t>() + ext_start[b] * q.stride(0),
                               o.data_ptr<scalar_t>() + ext_start[b] * o.stride(0), o.stride(0),
                               k_buffer.data_ptr<kv_t>(), v_buffer.data_ptr<kv_t>(), slots_b, head, head + 1,
                               /*prefix=*/lens[b] - ext_lens[b], first, count, scratch, KeyReuse{call, b},
                               RowMask{mask_b, lens[b]});
          }
        });
      });
    });
  });
}

}  // namespace minisgl
