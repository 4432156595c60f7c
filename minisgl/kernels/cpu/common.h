// Shared helpers for minisgl's CPU kernels (mirrors sgl-kernel/csrc/cpu/common.h and vec.h).
//
// Every kernel reads its inputs in the model's dtype (float32, bfloat16 or float16), computes in
// float32 and rounds to the model's dtype at the same points as the PyTorch reference it replaces,
// so greedy tokens stay identical to Hugging Face's. The file is compiled with the vector ISA ATen
// itself picked for this CPU (CPU_CAPABILITY_AVX512 / AVX2), which is what at::vec keys on.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/Utils.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <type_traits>

#define CHECK_CPU(x) TORCH_CHECK((x).device().is_cpu(), #x " must be a CPU tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define CHECK_LAST_DIM_CONTIGUOUS(x) TORCH_CHECK((x).stride(-1) == 1, #x " must be contiguous in its last dimension")
#define CHECK_INPUT(x) \
  CHECK_CPU(x);        \
  CHECK_CONTIGUOUS(x)

// The model dtypes every kernel accepts. (Loops inside these lambdas use _Pragma("omp simd"):
// a #pragma line cannot sit inside a macro argument.)
#define MINISGL_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...)                 \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) \
                         AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

namespace minisgl {

// The register type under at::vec::Vectorized<float>, for arrays of accumulators: GCC keeps an
// array of raw __m512 or __m256 in registers, but spills an array of Vectorized<float> objects to
// the stack, which makes every FMA a load and a store (the AVX2 GEMM measured at a third of
// oneDNN's rate before it used these).
#if defined(CPU_CAPABILITY_AVX512)
using Reg = __m512;
#elif defined(CPU_CAPABILITY_AVX2)
using Reg = __m256;
#else
using Reg = at::vec::Vectorized<float>;
#endif

// Round a float32 value to the model dtype and back: the reference rounds here too.
template <typename scalar_t>
inline float round_to(float x) {
  return static_cast<float>(static_cast<scalar_t>(x));
}

// Calls fn.template operator()<R>() for the runtime value rows in [1, N]: tile heights are template
// parameters, so that a tile's accumulators are registers.
template <int N, typename Fn>
inline void with_rows(int64_t rows, Fn&& fn) {
  if constexpr (N > 0) {
    if (rows == N) {
      fn.template operator()<N>();
    } else {
      with_rows<N - 1>(rows, fn);
    }
  }
}

// Vec::size() consecutive values of a model-dtype row, or of a KV pool row, as float32 (bf16, fp16
// and both fp8 formats all widen exactly).
template <typename T>
inline at::vec::Vectorized<float> load_float(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return at::vec::Vectorized<float>::loadu(p);
  } else if constexpr (std::is_same_v<T, c10::Float8_e5m2> || std::is_same_v<T, c10::Float8_e4m3fn>) {
    // Both fp8 formats widen through float16 lanes, which F16C converts. e5m2 is float16's top byte
    // (same exponent, two of its ten mantissa bits): the byte shifted up 8 is the float16 of the same
    // value. e4m3's seven low bits shifted up 7 are a float16 of the value over 2^8 (exponent biases 7
    // and 15; subnormals land on float16 subnormals alike), its sign moved to bit 15. e4m3's two NaN
    // codes read as +-480, but stores saturate at +-448 (as torch's cast does), so only a NaN stored
    // as NaN reads otherwise.
    constexpr bool e5m2 = std::is_same_v<T, c10::Float8_e5m2>;
#if defined(CPU_CAPABILITY_AVX512)
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    if constexpr (e5m2) return _mm512_cvtph_ps(_mm256_slli_epi16(w, 8));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                                      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f));
#elif defined(CPU_CAPABILITY_AVX2)
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    if constexpr (e5m2) return _mm256_cvtph_ps(_mm_slli_epi16(w, 8));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.f));
#else
    float buf[at::vec::Vectorized<float>::size()];
    for (int64_t i = 0; i < at::vec::Vectorized<float>::size(); ++i) buf[i] = static_cast<float>(p[i]);
    return at::vec::Vectorized<float>::loadu(buf);
#endif
  } else {
    at::vec::Vectorized<float> out;
    at::vec::load_to_float<T>(p, out);
    return out;
  }
}

// Rows of a 16-bit dtype are widened to float32 once, computed on in float32 and narrowed once
// (rounding to nearest even, as .to() does), all in vector registers: converting element by element
// inside the arithmetic made the bf16 kernels 4-8x slower than the float32 ones. For float32 rows
// as_float hands back the row itself and store_row does nothing, so that path has no copies.
template <typename T>
inline const float* as_float(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    constexpr int64_t width = at::vec::Vectorized<float>::size();
    int64_t i = 0;
    for (; i + width <= n; i += width) load_float(src + i).store(buf + i);
    for (; i < n; ++i) buf[i] = static_cast<float>(src[i]);
    return buf;
  }
}

template <typename T>
inline void store_row(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, c10::Float8_e5m2> || std::is_same_v<T, c10::Float8_e4m3fn>) {
    // Only the new tokens' K/V are stored, a small share of what attention reads: c10's scalar
    // rounding, the one torch's .to() uses (saturating e4m3 at +-448), so both backends' pools hold
    // the same bytes.
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  } else if constexpr (!std::is_same_v<T, float>) {
    using fVec = at::vec::Vectorized<float>;
    int64_t i = 0;
    for (; i + 2 * fVec::size() <= n; i += 2 * fVec::size()) {
      at::vec::convert_from_float<T>(fVec::loadu(src + i), fVec::loadu(src + i + fVec::size())).store(dst + i);
    }
    for (; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

// Two vectors of float32 stored as 2 * Vec::size() values of T: a 16-bit T rounded to nearest even
// (as .to() does) straight from the registers, as store_row does.
template <typename T>
inline void store_float2(T* dst, at::vec::Vectorized<float> lo, at::vec::Vectorized<float> hi) {
  if constexpr (std::is_same_v<T, float>) {
    lo.store(dst);
    hi.store(dst + lo.size());
  } else {
    at::vec::convert_from_float<T>(lo, hi).store(dst);
  }
}

// (lo, hi) rounded to T and widened back: the value a model-dtype intermediate of the reference holds.
template <typename T>
inline std::tuple<at::vec::Vectorized<float>, at::vec::Vectorized<float>> round_float2(at::vec::Vectorized<float> lo,
                                                                                       at::vec::Vectorized<float> hi) {
  if constexpr (std::is_same_v<T, float>) {
    return {lo, hi};
  } else {
    return at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(lo, hi));
  }
}

// Whether the CPU has `feature`, as ATen's cpuinfo names it (the table that
// torch._C._cpu._get_cpu_capability() shows). Kernels that use an ISA beyond the build's carry it in a
// target attribute and ask this first (gemm_vnni.cpp, gemm_int8_vnni.cpp, gemm_gguf_vnni.cpp).
inline bool cpu_has(const char* feature) {
  const auto caps = at::cpu::get_cpu_capabilities();
  return caps.count(feature) && caps.at(feature).toBool();
}

// vpdpbusd on 512-bit registers, and the byte and 256-bit instructions the VNNI kernels use beside it.
inline bool cpu_has_avx512_vnni() {
  static const bool has = cpu_has("avx512_vnni") && cpu_has("avx512_bw") && cpu_has("avx512_vl");
  return has;
}

// vdpbf16ps, and the 16-bit and 256-bit instructions its kernels use beside it (gemm_vnni.cpp,
// attention_dpbf16.h), which carry them in this target attribute.
#define MINISGL_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
inline bool cpu_has_avx512_bf16() {
  static const bool has = cpu_has("avx512_bf16") && cpu_has("avx512_bw") && cpu_has("avx512_vl");
  return has;
}

// The matrix engines of this CPU, for the GEMMs (gemm_vnni.cpp, gemm_int8_vnni.cpp) and the fused MoE.
struct Engines {
  bool avx512_bf16, amx_bf16, amx_fp16, amx_int8;
};

// Asked once: the answer cannot change while the process runs.
inline const Engines& engines() {
  static const Engines e = [] {
    // AMX also needs the kernel's permission to use the tile registers; init_amx asks for it. And
    // oneDNN, which multiplies on them for minisgl (brgemm), must be allowed to: ONEDNN_MAX_CPU_ISA
    // below AMX keeps it off them (below AVX-512 its brgemm raises), and then the blocks stay on
    // minisgl's own kernels. features.py's _onednn_may_use_amx reads the variable the same way.
    const char* cap_env = std::getenv("ONEDNN_MAX_CPU_ISA");
    std::string cap = cap_env ? cap_env : "";
    std::transform(cap.begin(), cap.end(), cap.begin(), [](unsigned char c) { return std::toupper(c); });
    const bool onednn_amx = cap.empty() || cap == "DEFAULT" || cap == "ALL" || cap.find("AMX") != std::string::npos;
    const bool amx = onednn_amx && cpu_has("amx_tile") && at::cpu::init_amx();
    return Engines{cpu_has_avx512_bf16(), amx && cpu_has("amx_bf16"), amx && cpu_has("amx_fp16"),
                   amx && cpu_has("amx_int8")};
  }();
  return e;
}

// Whether oneDNN's brgemm ukernel runs here for A x B -> C: torch 2.13's at::native::cpublas::brgemm
// calls it wherever oneDNN's device check passes (AVX-512 on the CPUs seen so far, AMX or not) and
// raises otherwise. Asked once per type, by one tiny call.
template <typename A, typename B, typename C>
bool brgemm_runs() {
  static const bool runs = [] {
    alignas(64) A a[4] = {};
    alignas(64) B b[4 * 16] = {};  // K = 4 by N = 16, in the VNNI layout (pairs or quads of K)
    alignas(64) C c[16];
    try {
      at::native::cpublas::brgemm(1, 16, 4, 4, 16, 16, /*add_C=*/false, a, b, c);
      at::native::cpublas::brgemm_release();
      return true;
    } catch (const c10::Error&) {
      return false;
    }
  }();
  return runs;
}

// Whether blocks of more than 4 rows take the AMX path, at::native::cpublas::brgemm (the dense bf16
// and int8 GEMMs: minisgl's own AMX tiles, gemm_amx.h, unless brgemm_asked()), given whether this CPU has the
// AMX tiles for the dtype (`amx`; `int8`: u8 x s8, else bf16): by default exactly then, as
// sgl-kernel decides. The environment variable MINISGL_BRGEMM=1 sends them to brgemm on any CPU whose
// oneDNN runs brgemm without the tiles, with its AVX-512 (vdpbf16ps, vpdpbusd) code: that is how a
// machine without AMX runs, and tests, every line of the AMX path but the tile instructions, and how
// the two are timed side by side (MINISGL_BRGEMM=0 keeps an AMX CPU on minisgl's register tiles).
// Read on every call, so that a test can switch it; getenv costs well under a microsecond.
inline bool use_brgemm(bool amx, bool int8 = false) {
  const char* value = std::getenv("MINISGL_BRGEMM");
  if (value == nullptr || value[0] == '\0') return amx;
  TORCH_CHECK((value[0] == '0' || value[0] == '1') && value[1] == '\0', "MINISGL_BRGEMM must be 0 or 1, got '",
              value, "'");
  if (value[0] == '0') return false;
  const bool runs = int8 ? brgemm_runs<uint8_t, int8_t, int32_t>() : brgemm_runs<at::BFloat16, at::BFloat16, float>();
  TORCH_CHECK(amx || runs, "MINISGL_BRGEMM=1, but oneDNN's brgemm does not take ", int8 ? "u8 x s8" : "bf16",
              " on this CPU (it needs AVX-512 there; ONEDNN_MAX_CPU_ISA may hold oneDNN below it)");
  return true;
}

// Whether MINISGL_BRGEMM=1 names oneDNN's brgemm: the dense bf16 and int8 GEMMs then take it on an
// AMX CPU too, instead of their own tiles (gemm_amx.h), so that the two can be timed side by side.
// use_brgemm has checked the value by then.
inline bool brgemm_asked() {
  const char* value = std::getenv("MINISGL_BRGEMM");
  return value != nullptr && value[0] == '1';
}

// Calls fn(u) for every u in [0, units), on all threads at once in one parallel region, each thread
// taking the next u from a shared counter (why, below at for_each_unit); then after() once on every
// thread that took part (where a thread releases its AMX tiles: moe.cpp).
template <typename Fn, typename After = void (*)()>
void for_each_index(int64_t units, Fn&& fn, After&& after = [] {}) {
  if (units <= 0) return;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), units), 1, [&](int64_t, int64_t) {
    for (int64_t u = next.fetch_add(1); u < units; u = next.fetch_add(1)) fn(u);
    after();
  });
}

// Calls fn(m0, m1, nb0, nb1) for every unit of work, a chunk_m-row chunk of M by a run of the NB
// column panels, on all threads at once, in one parallel region (the packed GEMMs: gemm.cpp,
// gemm_int8_vnni.cpp; the fused MoE, with a block of one expert's rows as its chunk: moe.cpp), then
// after() on each thread. Threads take units one at a time from a shared counter instead of a fixed
// share each: on a shared machine (a cloud VM) one core often runs slower than the other for a
// while, and with fixed shares (a parallel region per row chunk, its panels halved) the faster
// thread waited for it at the end of every region: sampled with perf over 30 layers' prefill GEMMs,
// libgomp's waiting took 10% of the time then and 6% now. About 8 units per thread keeps the last
// wait to a fraction of a unit. A unit's panels are consecutive, so within a unit each panel can
// prefetch the next (gemm.h's gemm_panel). Which thread computes a unit never changes its result.
template <typename Fn, typename After = void (*)()>
void for_each_unit(int64_t M, int64_t NB, int64_t chunk_m, Fn&& fn, After&& after = [] {}) {
  if (M == 0 || NB == 0) return;  // an empty batch: no units (and no division by zero chunks)
  const int64_t chunks = (M + chunk_m - 1) / chunk_m, threads = at::get_num_threads();
  const int64_t wanted = std::min(NB, std::max<int64_t>(1, (8 * threads + chunks - 1) / chunks));  // per chunk
  const int64_t panels_per_unit = (NB + wanted - 1) / wanted;
  const int64_t units_per_chunk = (NB + panels_per_unit - 1) / panels_per_unit;
  for_each_index(
      chunks * units_per_chunk,
      [&](int64_t u) {
        const int64_t m0 = u / units_per_chunk * chunk_m, nb0 = u % units_per_chunk * panels_per_unit;
        fn(m0, std::min(M, m0 + chunk_m), nb0, std::min(NB, nb0 + panels_per_unit));
      },
      after);
}

// Rows per unit of work in the packed GEMMs (gemm.cpp, gemm_vnni.cpp, gemm_int8.cpp, gemm_int8_vnni.cpp):
// all tiles of a chunk re-read a panel while it is still in L2 (a 576-deep float32 panel is 72 KiB
// with AVX-512), and the chunk's activations stay there too. On 2,048 rows, whole-M passes or 256-row
// chunks measured 5-10% slower in the float32 GEMM.
constexpr int64_t GEMM_CHUNK_M = 128;

// Up to this many rows (a decode batch of a few requests) a GEMM only streams its weights from DRAM,
// and each thread takes one contiguous part of the panels instead of for_each_unit's small units:
// one long stream per core keeps its hardware prefetcher running, where every unit started a new one.
// Over SmolLM2's 120 GEMMs at 1-4 rows, weights from memory, alternated in one process: float32 panels
// on an AVX-512 AMD EPYC 4-18% less time in each of five comparisons (bf16 panels and 4 rows too);
// VNNI panels (vdpbf16ps) on a 2-core Xeon with AMX 10-16% (1 row 10.8 -> 9.1 ms, 4 rows 15.1 -> 13.0).
constexpr int64_t STREAM_ROWS = 4;
// How far ahead a tile that streams a thread's run of consecutive panels prefetches the weights (the float panels'
// tile in gemm.h up to STREAM_ROWS rows; the vdpbf16ps tile at the heights gemm_vnni.h's dpbf16_prefetch_ahead()
// names; the AMX tiles' first block of a unit or run, gemm_amx.h): a fixed distance into the run, where it used to
// prefetch the whole next panel, which starts 36 to 192 KB ahead at SmolLM2's depths (K = 576 or 1,536, bfloat16 or
// float32). On a 2-core Zen 4 EPYC, SmolLM2's 120 layer GEMMs and LM head, weights from DRAM, the two rules
// alternated in one process (12-20 rounds a run, median of the paired ratios): at 1 row, bfloat16 took 0.88 of the
// time while a plain read of the same bytes ran at 50 GB/s and 0.93-0.99 in the host's slower hours (26-33 GB/s;
// eight runs), float32 0.91-0.95 (three runs); at 2 rows 0.94 and 0.97, at 4 rows (bfloat16) 0.97. 6 KB measured
// about as 4 KB, 8 to 16 KB 0.94-1.03, no prefetch at all 1.00-1.10 (weights in 4 KiB pages; on huge pages see
// dpbf16_prefetch_ahead()). On an Intel CPU measured for the AMX tiles only (gemm_amx.h).
constexpr int64_t STREAM_PREFETCH_BYTES = 4096;

// for_each_unit for a GEMM's rows and panels, except that up to stream_rows rows (STREAM_ROWS unless
// the caller says otherwise) each thread takes one contiguous run of the panels (fn(0, M, nb0, nb1)
// once per thread, then after()).
template <typename Fn, typename After = void (*)()>
void for_each_gemm_run(int64_t M, int64_t NB, int64_t chunk_m, Fn&& fn, After&& after = [] {},
                       int64_t stream_rows = STREAM_ROWS) {
  if (M > stream_rows) return for_each_unit(M, NB, chunk_m, fn, after);
  if (M == 0 || NB == 0) return;
  at::parallel_for(0, NB, 1, [&](int64_t nb0, int64_t nb1) {
    fn(0, M, nb0, nb1);
    after();
  });
}

// max(x[0], ..., x[n - 1]) for n >= 1, NaN if any x[i] is NaN, as torch.max (std::max_element is
// scalar, since it tracks where the max is, and std::max drops a NaN in its second argument).
// at::vec::maximum propagates NaN lane by lane. Four accumulators: with one (a chain of dependent
// max/compare/or steps), argmax_cpu took 1.2 ms through this function on 48 x 49,152 logits on a
// 2-core AMD EPYC, against 0.6 ms for its own loop before; with four, 0.54 against 0.56.
inline float max_of(const float* x, int64_t n) {
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t kStep = 4 * Vec::size();
  const auto fold = [](float m, float v) { return std::isnan(m) || m >= v ? m : v; };
  float m = x[0];
  int64_t i = 0;
  if (n >= Vec::size()) {
    Vec m0 = Vec::loadu(x), m1 = m0, m2 = m0, m3 = m0;  // a repeated value cannot change a max
    for (i = Vec::size(); i + kStep <= n; i += kStep) {
      m0 = at::vec::maximum(m0, Vec::loadu(x + i));
      m1 = at::vec::maximum(m1, Vec::loadu(x + i + Vec::size()));
      m2 = at::vec::maximum(m2, Vec::loadu(x + i + 2 * Vec::size()));
      m3 = at::vec::maximum(m3, Vec::loadu(x + i + 3 * Vec::size()));
    }
    for (; i + Vec::size() <= n; i += Vec::size()) m0 = at::vec::maximum(m0, Vec::loadu(x + i));
    if (i < n) {  // the tail in one masked step; the lanes past n keep m0's values
      m0 = at::vec::maximum(m0, Vec::set(m0, Vec::loadu(x + i, n - i), n - i));
      i = n;
    }
    float lanes[Vec::size()];
    at::vec::maximum(at::vec::maximum(m0, m1), at::vec::maximum(m2, m3)).store(lanes);
    for (float lane : lanes) m = fold(m, lane);
  }
  for (; i < n; ++i) m = fold(m, x[i]);
  return m;
}

// x[i] = exp(x[i] - shift) for i < n, returning the sum of the results (softmax's denominator).
inline float exp_and_sum(float* x, int64_t n, float shift) {
  using Vec = at::vec::Vectorized<float>;
  const Vec vshift(shift);
  Vec vsum(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec e = (Vec::loadu(x + i) - vshift).exp_u20();
    e.store(x + i);
    vsum = vsum + e;
  }
  // The tail in one masked step rather than a scalar std::exp each: attention rows end anywhere,
  // and that loop (a libm call per key) took about 5% of extend attention's time.
  if (i < n) {
    const Vec e = Vec::set(Vec(0.f), (Vec::loadu(x + i, n - i) - vshift).exp_u20(), n - i);
    e.store(x + i, n - i);
    vsum = vsum + e;
    i = n;
  }
  float lanes[Vec::size()];
  vsum.store(lanes);
  float sum = 0.f;
  for (float lane : lanes) sum += lane;
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

}  // namespace minisgl
