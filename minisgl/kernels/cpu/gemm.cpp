// Dense GEMM for linear layers, on a weight packed once into column panels (mirrors
// sgl-kernel/csrc/cpu/gemm.cpp: convert_weight_packed and weight_packed_linear).
//
// y[M, N] = x[M, K] W[N, K]^T + bias. convert_weight_packed lays W out as [N / BLOCK_N][K][BLOCK_N]:
// panel j holds output columns BLOCK_N j .. BLOCK_N j + BLOCK_N - 1, and one k-step of it is two
// vector registers of float32 (BLOCK_N = 32 with AVX-512, 16 with AVX2). A tile of up to MAX_ROWS
// rows of x keeps MAX_ROWS x 2 accumulators in registers while it walks one panel front to back;
// the other tiles of the same rows walk it again from cache. The code is the same at both widths:
// at::vec::Vectorized<float> is one zmm register with AVX-512 and one ymm with AVX2.
//
// Why not oneDNN, which minisgl used before: in decode a GEMM has few rows (one per running
// request) and its weights come from DRAM, not cache. oneDNN leaves the FMA units idle while the
// weights arrive. Here each thread walks one run of consecutive panels, and while the first tile of
// rows multiplies a k-step it prefetches the weights 4 KB further along the run into L2, so loading
// what comes next overlaps computing this (up to how many rows that pays depends on the CPU's
// hardware prefetcher: gemm.h, prefetch_rows).
//
// Weights are kept in the model's dtype: a bf16 or fp16 panel is widened to float32 in registers as
// it is read (exact: every bf16 and fp16 value is a float32 value), so a 16-bit model streams half
// the bytes of a float32 one and keeps no float32 copy. Activations are float32 inside (16-bit ones
// are widened once per call), products are accumulated in float32 and rounded to the output dtype as
// they are stored: the result differs from F.linear on the float32 weights only in summation order.
// A 16-bit weight packed in the VNNI layout instead (4-D, from convert_weight_packed_vnni) goes to
// the CPU's matrix engines, AMX or AVX512-BF16 (gemm_vnni.cpp). What SGLang's version has and this
// one omits: int8/fp8 weights.
#include <optional>

#include "gemm.h"

namespace minisgl {
namespace {

// Rows [m_begin, m_end) (at most GEMM_CHUNK_M) against the consecutive panels [nb_begin, nb_end), each
// tile prefetching a fixed distance ahead in the run (gemm_panel with stream_rows = GEMM_CHUNK_M).
template <typename w_t, typename out_t>
void gemm_rows(const float* A, int64_t lda, const w_t* B, out_t* C, int64_t N, int64_t K, const out_t* bias,
               int64_t m_begin, int64_t m_end, int64_t nb_begin, int64_t nb_end) {
  const int64_t panel_size = K * BLOCK_N;
  for (int64_t nb = nb_begin; nb < nb_end; ++nb) {
    const w_t* panel = B + nb * panel_size;
    const out_t* panel_bias = bias ? bias + nb * BLOCK_N : nullptr;
    gemm_panel(A + m_begin * lda, lda, panel, K, C + m_begin * N + nb * BLOCK_N, N, panel_bias, m_end - m_begin,
               /*next=*/static_cast<const w_t*>(nullptr), /*stream_rows=*/GEMM_CHUNK_M);
  }
}

// Calls fn.template operator()<w_t>() for the weight's dtype: float32, or the output's own 16-bit dtype.
template <typename out_t, typename Fn>
void with_weight_type(at::ScalarType weight, Fn&& fn) {
  if (weight == at::kFloat) {
    fn.template operator()<float>();
  } else if constexpr (!std::is_same_v<out_t, float>) {
    TORCH_CHECK(weight == c10::CppTypeToScalarType<out_t>::value, "weight_packed_linear: a ", weight,
                " weight multiplies float32 or ", weight, " activations, got ", c10::CppTypeToScalarType<out_t>::value);
    fn.template operator()<out_t>();
  } else {
    TORCH_CHECK(false, "weight_packed_linear: a ", weight, " weight multiplies ", weight, " activations, got float32");
  }
}

}  // namespace

// W [N, K] -> panels [N / BLOCK_N, K, BLOCK_N] in W's own dtype. The 3-D shape is how apply_linear
// tells a packed weight from a plain one. A stack of experts' weights [E, N, K] packs to
// [E, N / BLOCK_N, K, BLOCK_N], each expert as its own [N, K] would (what fused_experts_cpu reads).
at::Tensor convert_weight_packed(const at::Tensor& weight) {
  CHECK_CPU(weight);
  const int64_t d = weight.dim();
  TORCH_CHECK((d == 2 || d == 3) && weight.size(d - 2) % BLOCK_N == 0, "convert_weight_packed: expects [N, K] or ",
              "[E, N, K] with N a multiple of ", BLOCK_N, ", got ", weight.sizes());
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "convert_weight_packed: expects a float32, bfloat16 or float16 weight, got ", dtype);
  const int64_t E = d == 3 ? weight.size(0) : 1, N = weight.size(d - 2), K = weight.size(d - 1);
  auto packed = weight.reshape({E, N / BLOCK_N, BLOCK_N, K}).transpose(2, 3).contiguous();
  return d == 3 ? packed : packed.squeeze(0);
}

at::Tensor weight_packed_linear_vnni(const at::Tensor& mat1, const at::Tensor& mat2,
                                     const std::optional<at::Tensor>& bias);  // gemm_vnni.cpp

at::Tensor weight_packed_linear(const at::Tensor& mat1, const at::Tensor& mat2, const std::optional<at::Tensor>& bias) {
  if (mat2.dim() == 4) return weight_packed_linear_vnni(mat1, mat2, bias);  // the matrix engines' layout
  CHECK_CPU(mat1);
  CHECK_INPUT(mat2);
  TORCH_CHECK(mat1.dim() == 2 && mat2.dim() == 3 && mat2.size(2) == BLOCK_N,
              "weight_packed_linear: expects mat1 [M, K] and mat2 from convert_weight_packed");
  TORCH_CHECK(mat1.size(1) == mat2.size(1), "weight_packed_linear: mat1 has K=", mat1.size(1), ", mat2 has K=",
              mat2.size(1));
  // 16-bit activations are widened once here; the tiles broadcast one float32 value per row and k-step.
  const at::Tensor a = mat1.scalar_type() == at::kFloat && mat1.stride(1) == 1 ? mat1 : mat1.to(at::kFloat).contiguous();
  const int64_t M = a.size(0), K = a.size(1), NB = mat2.size(0), N = NB * BLOCK_N;
  if (bias.has_value()) {  // read in place, in the activations' dtype: no conversion per call
    CHECK_INPUT(*bias);
    TORCH_CHECK(bias->numel() == N, "weight_packed_linear: bias has ", bias->numel(), " values for N=", N);
    TORCH_CHECK(bias->scalar_type() == mat1.scalar_type(), "weight_packed_linear: bias is ", bias->scalar_type(),
                ", activations are ", mat1.scalar_type());
  }
  at::Tensor out = at::empty({M, N}, mat1.options());
  const float* A = a.data_ptr<float>();
  MINISGL_DISPATCH_FLOATING_TYPES(out.scalar_type(), "weight_packed_linear", [&] {
    using out_t = scalar_t;
    out_t* C = out.data_ptr<out_t>();
    const out_t* bias_ptr = bias.has_value() ? bias->data_ptr<out_t>() : nullptr;
    with_weight_type<out_t>(mat2.scalar_type(), [&]<typename w_t>() {
      const w_t* B = static_cast<const w_t*>(mat2.data_ptr());
      const auto rows = [&](int64_t m0, int64_t m1, int64_t nb0, int64_t nb1) {
        gemm_rows(A, a.stride(0), B, C, N, K, bias_ptr, m0, m1, nb0, nb1);
      };
      // Up to a whole chunk each thread streams one run of panels (for_each_gemm_run), as at STREAM_ROWS:
      // a run's panels meet all of its rows before the next, as a unit's do. On a 2-core Zen 4 EPYC, up to
      // one tile's rows (each panel read once, by one tile), SmolLM2's 120 layer GEMMs and LM head from
      // DRAM, runs against units alternated in one process (10 rounds a run, median of the paired ratios):
      // 0.93 and 0.95 of the time at 8 rows, 0.95 at 10 and 12, 0.93 at 6. Above that, on a 2-core Xeon
      // with AMX (family 6 model 167), the 120 layer GEMMs on huge pages in a scratch loop, switched per
      // call by a temporary variable (three rounds): 0.92, 0.93, 0.94 and 0.94 at 16, 32, 64 and 128 rows;
      // compiled float32 decode steps (benchmarks/profile_loop.py, alternated three times) 0.92 of the
      // replay at 16 requests and 0.95 at 64. Not measured above 12 rows on an AMD CPU.
      for_each_gemm_run(M, NB, GEMM_CHUNK_M, rows, [] {}, GEMM_CHUNK_M);
    });
  });
  return out;
}

// Rows of W [N, K] read back out of its packed layout: out[t] = W[ids[t]]. Both layouts are
// [N / B][K / p][B][p] (convert_weight_packed: B = BLOCK_N, p = 1; convert_weight_packed_vnni:
// B = 32, p = 2), so W[n, k] sits at ((n / B) (K / p) + k / p) B p + (n % B) p + k % p. A tied
// embedding looks its tokens up here, in the weight its LM head packed in place, so that a model keeps
// one copy of its vocabulary matrix instead of a plain one beside the packed one (SGLang, whose tied head
// multiplies by the plain embedding, also keeps one). A row is K / p strided reads of p values, a
// cache line each, where a plain row is K contiguous values: the price is paid per prompt token, once.
at::Tensor packed_weight_rows(const at::Tensor& packed, const at::Tensor& ids) {
  CHECK_INPUT(packed);
  CHECK_CPU(ids);
  const int64_t d = packed.dim();
  TORCH_CHECK(d == 3 || (d == 4 && packed.size(3) == 2),
              "packed_weight_rows: expects a weight from convert_weight_packed or convert_weight_packed_vnni, got ",
              packed.sizes());
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1, "packed_weight_rows: expects 1-D int64 ids");
  const int64_t B = packed.size(2), p = d == 4 ? 2 : 1, K = packed.size(1) * p, N = packed.size(0) * B;
  const at::Tensor idx = ids.contiguous();
  const int64_t* id = idx.data_ptr<int64_t>();
  const int64_t T = idx.numel();
  at::Tensor out = at::empty({T, K}, packed.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, packed.scalar_type(), "packed_weight_rows", [&] {
    const scalar_t* P = packed.data_ptr<scalar_t>();
    scalar_t* O = out.data_ptr<scalar_t>();
    at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t n = id[t];
        TORCH_CHECK(0 <= n && n < N, "packed_weight_rows: id ", n, " is out of range for ", N, " rows");
        const scalar_t* row = P + (n / B) * K * B + (n % B) * p;
        for (int64_t k = 0; k < K; k += p) {
          for (int64_t j = 0; j < p; ++j) O[t * K + k + j] = row[k * B + j];
        }
      }
    });
  });
  return out;
}

// The panel width, for callers that must know which N convert_weight_packed accepts.
int64_t weight_packed_block_n() { return BLOCK_N; }

}  // namespace minisgl
