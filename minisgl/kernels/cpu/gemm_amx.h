// The bf16 and W8A8-int8 GEMMs' blocks on AMX, written with the tile instructions themselves, for
// weights packed in the VNNI layouts (gemm_vnni.h, gemm_int8_vnni.h). sgl-kernel hands such blocks
// to oneDNN's brgemm ukernel (at::native::cpublas::brgemm, as minisgl did before); here the same
// multiply is a loop of eight instructions the reader can see, the tiles are configured once per
// unit of work instead of a kernel being looked up in oneDNN's cache on every call, and the results
// are bitwise those of brgemm.
//
// AMX holds 8 tile registers of up to 16 rows x 64 bytes. One configuration serves every tile here,
// 16 rows x 64 bytes:
//   tiles 0-3: a 32 x 32 block of float32 results, as 2 x 2 tiles of 16 x 16;
//   tiles 4-5: 16 rows of A each, 32 bf16 values of K per row;
//   tiles 6-7: 16 k-pairs of a panel each, 16 columns x 2 values per row. That is the panel's own
//              layout, [K / 2][32][2], read with a row stride of 128 bytes, columns 0-15 or 16-31
//              (attention's values, [keys / 2][d][2], with a stride of 4 d bytes).
// _tile_dpbf16ps(C, A, B) adds A (16 x 32) times B (32 x 16, in pairs) into C: 16 x 16 x 32
// multiply-adds per instruction, against vdpbf16ps's 32. The int8 block is the same with bytes:
// 64 u8 activations of K per A row, 16 k-quads of a 16-column int8 panel per B tile, and
// _tile_dpbusd adding 16 x 16 x 64 exact int32 products.
#pragma once

#include "gemm_int8_vnni.h"
#include "gemm_vnni.h"

namespace minisgl {

#define MINISGL_AMX_TILE __attribute__((target("amx-tile")))
#define MINISGL_AMX_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
#define MINISGL_AMX_INT8 __attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-int8")))

// K per step of the tile loop: one row of an A tile (64 bytes of bf16, or of u8: 16 k-quads).
constexpr int64_t AMX_BLOCK_K = 32;
constexpr int64_t AMX_BLOCK_K4 = 16;
// Rows per A tile; a block of VNNI_BLOCK_M rows is two of them.
constexpr int64_t AMX_TILE_ROWS = 16;

// The 64-byte operand of ldtilecfg (Intel SDM, "TILECFG"): palette 1, then the bytes per row and
// the rows of each tile.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// All 8 tiles as 16 rows x 64 bytes, on this thread, until release_amx_tiles. The process already
// has the kernel's permission to use them (engines() asks for it through at::cpu::init_amx).
MINISGL_AMX_TILE inline void configure_amx_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = AMX_TILE_ROWS;
  }
  // Not _tile_loadconfig: GCC 12's names only the first 8 bytes of its operand as read, drops the
  // stores of the rest as dead, and the tiles stay unconfigured (tilezero then faults).
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}

MINISGL_AMX_TILE inline void release_amx_tiles() { _tile_release(); }

// scratch[0:16 RT, 0:32] = A's rows times one panel over K (a multiple of 32), in float32: RT groups
// of 16 rows, group g from a[g] with row stride lda[g]. A tile always loads 16 rows, so a short last
// group must come from a zero-padded copy (vnni_gemm keeps one) or a buffer with 16 rows to spare
// (moe.cpp's, attention's Scratch), never from past the end of A. The panel is 32 columns of an
// operand stored as [K / 2][ldb][2]: a packed weight's own panel (ldb = 32), or 32 of the d columns
// of attention's values, packed as pairs of keys (ldb = d; attention_brgemm.h).
// Unless `next` is null, each k-step first asks for the 16 k-pairs at the same offset from `next`
// into L2 (T1): the dense GEMM points it STREAM_PREFETCH_BYTES past the panel, so that a block that
// reads the weights from memory streams them ahead of its tile loads. A tile load waits for all of
// its 16 rows, and the 8 tile registers leave few loads in flight: on a 2-core Xeon with AMX (family
// 6 model 207), SmolLM2's 120 layer GEMMs from DRAM on huge pages, with and without, alternated in
// one process (median of the paired ratios), took 0.71-0.73 of the time at 4, 8 and 16 rows, 0.68
// at 32, 0.76-0.79 at 64, 0.82 at 128, 0.85 at 256 and 0.98 at 1,024 (2 to 36 KB ahead measured
// alike). On the tiles' int8 loop, below, the same: 0.89 at 8 rows, 0.92 at 16, 0.88 at 64, 0.95 at 256.
template <int RT>
MINISGL_AMX_BF16 inline void tile_amx_bf16(const at::BFloat16* const (&a)[2], const int64_t (&lda)[2],
                                           const at::BFloat16* panel, int64_t K, float* scratch,
                                           int64_t ldb = VNNI_BLOCK_N, const char* next = nullptr) {
  const int64_t panel_row = 2 * ldb * sizeof(at::BFloat16);  // one k-pair: 128 bytes in a weight's panel
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (RT == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k0 = 0; k0 < K; k0 += AMX_BLOCK_K) {
    const at::BFloat16* b = panel + k0 * ldb;  // k-pair k0 / 2, column 0
    if (next) {
      const char* n = next + k0 * ldb * 2;
      for (int64_t off = 0; off < 16 * panel_row; off += 64) _mm_prefetch(n + off, _MM_HINT_T1);
    }
    _tile_loadd(6, b, panel_row);
    _tile_loadd(7, b + 2 * 16, panel_row);  // column 16 of the same k-pairs
    _tile_loadd(4, a[0] + k0, lda[0] * sizeof(at::BFloat16));
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (RT == 2) {
      _tile_loadd(5, a[1] + k0, lda[1] * sizeof(at::BFloat16));
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t ld = VNNI_BLOCK_N * sizeof(float);
  _tile_stored(0, scratch, ld);
  _tile_stored(1, scratch + 16, ld);
  if constexpr (RT == 2) {
    _tile_stored(2, scratch + AMX_TILE_ROWS * VNNI_BLOCK_N, ld);
    _tile_stored(3, scratch + AMX_TILE_ROWS * VNNI_BLOCK_N + 16, ld);
  }
}

// tile_amx_bf16 for a block of `rows` (1 to 32) rows: one group of 16 or two.
MINISGL_AMX_BF16 inline void block_amx_bf16(const at::BFloat16* const (&a)[2], const int64_t (&lda)[2], int64_t rows,
                                            const at::BFloat16* panel, int64_t K, float* scratch,
                                            int64_t ldb = VNNI_BLOCK_N, const char* next = nullptr) {
  rows > AMX_TILE_ROWS ? tile_amx_bf16<2>(a, lda, panel, K, scratch, ldb, next)
                       : tile_amx_bf16<1>(a, lda, panel, K, scratch, ldb, next);
}

// Rows from which the dense bf16 GEMM multiplies on these tiles: 4, one row fewer than sgl-kernel's
// can_use_brgemm (M > 4), which weighs oneDNN's per-call setup. A 4-row block fills a quarter of each
// A tile, but the tiles keep up with the weights streaming from DRAM where vdpbf16ps falls behind: on a
// 2-core Xeon with AMX (family 6 model 167), bench_one_batch.py's bfloat16 decode at 4 streams gave
// 62.7 and 64.3 tok/s a stream on vdpbf16ps, 68.9 and 68.1 on the tiles (graph runner, alternated);
// at 3 streams the two were level (52.3 and 52.0, 52.1 and 51.5, without the graph runner), and at 2
// the tiles were slower (50.4 and 53.2 against 55.2 and 55.5). The int8 GEMM keeps sgl-kernel's boundary:
// there the tiles at 3 and 4 rows took 6.3-6.8 ms a pass where vpdpbusd took 5.8-6.3 (bench_gguf_gemm.py).
constexpr int64_t AMX_TILES_MIN_ROWS = 4;

// Whether blocks that use_brgemm sends to the AMX path (`brgemm`) go to these tile loops instead: on a
// CPU with the tiles for the dtype (`amx`), for a K of whole tile rows, unless MINISGL_BRGEMM=1 names
// oneDNN's brgemm. The dense bf16 and int8 GEMMs, the bf16 fused MoE and attention ask the same question.
inline bool use_own_tiles(bool brgemm, bool amx, bool whole_tiles) {
  return brgemm && amx && whole_tiles && !brgemm_asked();
}

// sums[0:16 RT, 0:16 PANELS] (rows 2 x 16 int32 apart, as sums_int8 leaves them) = rows of the
// quantized activations a (u8, +128) times PANELS (1 or 2) int8 panels panel_bytes apart, over K4
// k-quads (a multiple of 16): exact int32 sums, so bitwise those of vpdpbusd and of brgemm. A tile
// always loads 16 rows: the caller's a must have 16 RT rows (int8_scaled_mm_vnni pads its copy).
// Unless `next` is null, each k-step first asks for the same 16 k-quads of the panels at `next` into
// L2, as tile_amx_bf16 does.
// Tiles: C(g, j) = 2 g + j, A rows of group g in 4 + g, panel j's k-quads in 6 + j.
template <int RT, int PANELS>
MINISGL_AMX_INT8 inline void tile_amx_int8(const uint8_t* a, int64_t lda, const int8_t* panel, int64_t panel_bytes,
                                           int64_t K4, int32_t* sums, const int8_t* next = nullptr) {
  _tile_zero(0);
  if constexpr (PANELS == 2) _tile_zero(1);
  if constexpr (RT == 2) _tile_zero(2);
  if constexpr (RT == 2 && PANELS == 2) _tile_zero(3);
  for (int64_t k4 = 0; k4 < K4; k4 += AMX_BLOCK_K4) {
    if (next) {
      for (int64_t off = 0; off < AMX_BLOCK_K4 * INT8_ROW_BYTES; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(next + k4 * INT8_ROW_BYTES + off), _MM_HINT_T1);
        if constexpr (PANELS == 2) {
          _mm_prefetch(reinterpret_cast<const char*>(next + panel_bytes + k4 * INT8_ROW_BYTES + off), _MM_HINT_T1);
        }
      }
    }
    _tile_loadd(6, panel + k4 * INT8_ROW_BYTES, INT8_ROW_BYTES);
    if constexpr (PANELS == 2) _tile_loadd(7, panel + panel_bytes + k4 * INT8_ROW_BYTES, INT8_ROW_BYTES);
    _tile_loadd(4, a + 4 * k4, lda);
    _tile_dpbusd(0, 4, 6);
    if constexpr (PANELS == 2) _tile_dpbusd(1, 4, 7);
    if constexpr (RT == 2) {
      _tile_loadd(5, a + AMX_TILE_ROWS * lda + 4 * k4, lda);
      _tile_dpbusd(2, 5, 6);
      if constexpr (PANELS == 2) _tile_dpbusd(3, 5, 7);
    }
  }
  constexpr int64_t ld = 2 * INT8_PANEL_N * sizeof(int32_t), group = AMX_TILE_ROWS * 2 * INT8_PANEL_N;
  _tile_stored(0, sums, ld);
  if constexpr (PANELS == 2) _tile_stored(1, sums + INT8_PANEL_N, ld);
  if constexpr (RT == 2) _tile_stored(2, sums + group, ld);
  if constexpr (RT == 2 && PANELS == 2) _tile_stored(3, sums + group + INT8_PANEL_N, ld);
}

}  // namespace minisgl
