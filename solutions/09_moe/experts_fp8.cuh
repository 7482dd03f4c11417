// Chapter 09 — the grouped GEMMs with FP8 experts (W8A8, chapter 08's blockwise scales): their
// arguments, checks, byte models and registry entries (v15). Three ops mirror the BF16 ones:
//   moe_grouped_gemm_fp8       x E4M3 [T, K], w E4M3 [E, N, K] → out BF16 [T·topk, N]
//   moe_grouped_gemm_silu_fp8  the same with w = gate || up → out [T·topk, N/2] = silu(g) · u
//   moe_grouped_gemm_sum_fp8   x [T·topk, K] (a row per slot), topk_weights FP32 [T, topk] →
//                              out [T, N] = Σ_j weights[t, j] · (x[t·topk + j] · w[e]ᵀ)
// Scales (lkw.fp8_gemm's blockwise layouts): x_scales FP32 [K/128, rows of x], one per token (or
// slot) and 128-wide K block, column-major as chapter 03's per_group_fp8 writes them; w_scales
// FP32 [E, ceil(N/128), K/128], one per 128 × 128 block of each expert's [N, K] (gate_up: of the
// whole gate || up matrix, as vLLM's w13 scales). Element (n, k) of expert e is
// decode(w[e, n, k]) · w_scales[e, n / 128, k / 128]; K must be a multiple of 128.
#pragma once
#include "08_fp8_gemm/fp8_gemm.cuh"
#include "experts.cuh"

namespace lkw::moe {

constexpr const char* kGroupedFp8Op = "moe_grouped_gemm_fp8";
constexpr const char* kGroupedSiluFp8Op = "moe_grouped_gemm_silu_fp8";
constexpr const char* kGroupedSumFp8Op = "moe_grouped_gemm_sum_fp8";
constexpr int kFp8Block = fp8::kScaleBlock;  // 128: the scales' blocks along K and N

enum class Fp8Epilogue { kStore, kSilu, kSum };

struct GroupedFp8Args {
  const uint8_t* x;           // [T, K] E4M3 (sum: [T·topk, K], a row per slot)
  const float* x_scales;      // [K/128, rows of x]
  const uint8_t* w;           // [E, N, K] E4M3
  const float* w_scales;      // [E, ceil(N/128), K/128]
  const int32_t* sorted_ids;  // [rows], an align's
  const int32_t* expert_ids;  // [rows / block_m]
  __nv_bfloat16* out;         // [T·topk, N], [T·topk, N/2] (silu) or [T, N] (sum)
  int64_t t, n, k;
  int num_experts, topk, block_m;
  int64_t rows;
  Fp8Epilogue epilogue;
  const float* weights = nullptr;  // [T, topk]: sum only
};

using GroupedFp8Launch = Status (*)(const GroupedFp8Args& a, cudaStream_t stream);

inline const char* fp8_op_name(Fp8Epilogue e) {
  return e == Fp8Epilogue::kSilu ? kGroupedSiluFp8Op
         : e == Fp8Epilogue::kSum ? kGroupedSumFp8Op
                                  : kGroupedFp8Op;
}
inline int64_t fp8_x_rows(const GroupedFp8Args& a) {
  return a.epilogue == Fp8Epilogue::kSum ? a.t * a.topk : a.t;
}
inline int64_t fp8_out_rows(const GroupedFp8Args& a) {
  return a.epilogue == Fp8Epilogue::kSum ? a.t : a.t * a.topk;
}
inline int64_t fp8_out_n(const GroupedFp8Args& a) {
  return a.epilogue == Fp8Epilogue::kSilu ? a.n / 2 : a.n;
}
__host__ __device__ inline int64_t fp8_n_blocks(int64_t n) {
  return (n + kFp8Block - 1) / kFp8Block;
}

// moe_grouped_gemm's checks of the schedule (x one byte an element) and chapter 08's FP8 rules:
// K a multiple of 128 (blockwise scales), N of 16 (16-byte rows; gate_up: halves of n8 tiles).
inline Status validate_grouped_fp8(const GroupedFp8Args& a) {
  const bool silu = a.epilogue == Fp8Epilogue::kSilu, sum = a.epilogue == Fp8Epilogue::kSum;
  const int64_t out_bytes = 2 * fp8_out_rows(a) * fp8_out_n(a);
  const int64_t kb = a.k / kFp8Block;
  return check_schedule(a, fp8_x_rows(a), fp8_out_rows(a), fp8_out_n(a), 1)
      .not_null(a.w, "w")
      .not_null(a.x_scales, "x_scales")
      .not_null(a.w_scales, "w_scales")
      .that(!sum || a.weights != nullptr, "topk_weights must not be null")
      .that(a.k % kFp8Block == 0, "K = " + std::to_string(a.k) +
                                      " must be a multiple of 128 (whole 128-wide scale blocks)")
      .that(a.n % 16 == 0, "N = " + std::to_string(a.n) +
                               " must be a multiple of 16 (chapter 08's FP8 rows" +
                               (silu ? "; gate and up halves of whole n8 tiles)" : ")"))
      .that(a.n <= 65535 * int64_t(128), "N must be at most 65535·128 (the grid's y)")
      .that(int64_t(a.num_experts) * a.n < (int64_t(1) << 31),
            "E·N must be below 2^31 (TMA row coordinates)")
      .that(a.topk <= (1 << 20) && a.block_m <= (1 << 20) && a.t * a.n < (int64_t(1) << 31),
            "topk and block_m must be at most 2^20 and T·N fit int32")
      .aligned(a.w, 16, "w")
      .aligned(a.x_scales, 4, "x_scales")
      .aligned(a.w_scales, 4, "w_scales")
      .aligned(a.weights, 4, "topk_weights")
      .disjoint(a.out, out_bytes, a.w, a.num_experts * a.n * a.k, "out and w")
      .disjoint(a.out, out_bytes, a.x_scales, 4 * kb * fp8_x_rows(a), "out and x_scales")
      .disjoint(a.out, out_bytes, a.w_scales, 4 * a.num_experts * fp8_n_blocks(a.n) * kb,
                "out and w_scales")
      .disjoint(a.out, out_bytes, a.weights, sum ? 4 * a.t * a.topk : 0, "out and topk_weights")
      .arch_at_least(90)  // wgmma: sm_90a
      .status();
}

// Generic Args → GroupedFp8Args: inputs x, w, x_scales, w_scales (chapter 08's order: A, B, s_a,
// s_b), sorted_token_ids, expert_ids (, topk_weights); output out; params topk (not for sum:
// the weights' columns) and block_m.
inline Status grouped_fp8_args(const Args& a, Fp8Epilogue epi, GroupedFp8Args* out) {
  const bool sum = epi == Fp8Epilogue::kSum, silu = epi == Fp8Epilogue::kSilu;
  const std::string name = fp8_op_name(epi);
  Status s = Check()
                 .that(a.inputs.size() == (sum ? 7u : 6u) && a.outputs.size() == 1,
                       name + " takes x, w, x_scales, w_scales, sorted_token_ids, expert_ids" +
                           (sum ? ", topk_weights" : "") + " and writes out")
                 .that(a.params.count("block_m") == 1 && (sum || a.params.count("topk") == 1),
                       name + (sum ? " needs the param block_m"
                                   : " needs the params topk and block_m"))
                 .status();
  if (!s.ok()) return s;
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &xs = a.inputs[2], &ws = a.inputs[3],
                  &sorted = a.inputs[4], &experts = a.inputs[5], &y = a.outputs[0];
  s = Check()
          .that(x.dtype == DType::kE4M3 && x.shape.size() == 2, "x is float8_e4m3fn [rows, K]")
          .that(w.dtype == DType::kE4M3 && w.shape.size() == 3, "w is float8_e4m3fn [E, N, K]")
          .that(xs.dtype == DType::kF32 && ws.dtype == DType::kF32,
                "x_scales and w_scales must be float32")
          .that(sorted.dtype == DType::kI32 && sorted.shape.size() == 1 &&
                    experts.dtype == DType::kI32 && experts.shape.size() == 1,
                "sorted_token_ids and expert_ids are int32 vectors")
          .that(!sum || (a.inputs[6].dtype == DType::kF32 && a.inputs[6].shape.size() == 2),
                "topk_weights is float32 [T, topk]")
          .that(y.dtype == DType::kBF16 && y.shape.size() == 2, "out is bfloat16")
          .status();
  if (!s.ok()) return s;
  const double m = a.params.at("block_m");
  const double topk = sum ? double(a.inputs[6].dim(1)) : a.params.at("topk");
  const int64_t rows_x = x.dim(0), k = x.dim(1), e = w.dim(0), n = w.dim(1);
  const int64_t t = sum ? a.inputs[6].dim(0) : rows_x;
  s = Check()
          .that(topk >= 1 && topk < (1 << 20) && topk == std::floor(topk),
                "topk must be a positive integer")
          .that(m >= 1 && m <= kMaxBlockM && m == std::floor(m), "block_m must be in 1..1024")
          .that(w.dim(2) == k, "x [rows, K] and w [E, N, K] disagree on K")
          .that(k % kFp8Block == 0, "K = " + std::to_string(k) +
                                        " must be a multiple of 128 (whole 128-wide scale blocks)")
          .that(!sum || rows_x == t * int64_t(topk),
                "x must hold a row per slot: [T·topk, K] = [" + std::to_string(t * int64_t(topk)) +
                    ", K]")
          .status();
  if (!s.ok()) return s;
  const int64_t kb = k / kFp8Block, nb = fp8_n_blocks(n);
  const int64_t out_rows = sum ? t : t * int64_t(topk), out_n = silu ? n / 2 : n;
  s = Check()
          .that(xs.shape == std::vector<int64_t>{kb, rows_x},
                "x_scales must be float32 " + shape_text({kb, rows_x}) +
                    " = [K/128, rows of x] (1 × 128 groups, column-major as chapter 03's "
                    "per_group_fp8 writes them)")
          .that(ws.shape == std::vector<int64_t>{e, nb, kb},
                "w_scales must be float32 " + shape_text({e, nb, kb}) +
                    " = [E, ceil(N/128), K/128] (one per 128 × 128 block)")
          .that(y.dim(0) == out_rows && y.dim(1) == out_n,
                "out must be " + shape_text({out_rows, out_n}))
          .that(experts.dim(0) * int64_t(m) == sorted.dim(0),
                "expert_ids must hold one id per block_m rows of sorted_token_ids")
          .status();
  if (!s.ok()) return s;
  GroupedFp8Args g{static_cast<const uint8_t*>(x.data),
                   static_cast<const float*>(xs.data),
                   static_cast<const uint8_t*>(w.data),
                   static_cast<const float*>(ws.data),
                   static_cast<const int32_t*>(sorted.data),
                   static_cast<const int32_t*>(experts.data),
                   static_cast<__nv_bfloat16*>(y.data),
                   t,
                   n,
                   k,
                   int(e),
                   int(topk),
                   int(m),
                   sorted.dim(0),
                   epi};
  if (sum) g.weights = static_cast<const float*>(a.inputs[6].data);
  *out = g;
  return {};
}

// The roofline minimum: x, its scales, the ids, out (and topk_weights) once, and the routed
// experts' FP8 weights and block scales only (param routed_experts, as grouped_bytes).
inline double grouped_fp8_bytes(const Args& a) {
  const TensorRef &x = a.inputs.at(0), &w = a.inputs.at(1), &ws = a.inputs.at(3);
  const bool sum = a.inputs.size() == 7;
  const double slots = sum ? double(x.dim(0)) : double(x.dim(0)) * a.param("topk", 1.0);
  const double experts = double(w.dim(0));
  const double routed = a.param("routed_experts", std::min(experts, slots));
  double b = double(x.bytes() + a.inputs.at(2).bytes() + a.inputs.at(4).bytes() +
                    a.inputs.at(5).bytes() + a.outputs.at(0).bytes());
  if (sum) b += double(a.inputs.at(6).bytes());
  return b + routed * double(w.bytes() + ws.bytes()) / experts;
}

inline Version grouped_fp8_version(Fp8Epilogue epi, const char* id, const char* summary,
                                   GroupedFp8Launch launch, std::vector<SassFact> sass = {},
                                   Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, fp8_op_name(epi), id, summary, kind, std::move(sass));
  v.launch = [epi, launch](const Args& a, cudaStream_t stream) -> Status {
    GroupedFp8Args ga;
    Status s = grouped_fp8_args(a, epi, &ga);
    return s.ok() ? launch(ga, stream) : s;
  };
  v.bytes = grouped_fp8_bytes;
  v.flops = grouped_flops;  // the sum has no topk param: x's rows are already its slots
  v.min_arch = 90;
  return v;
}

}  // namespace lkw::moe
