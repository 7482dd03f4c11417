// Chapter 09 — the expert half: moe_grouped_gemm (plain, or gate_up with SiLU-and-mul) and moe_sum:
// their arguments, byte models and registry entries, and what every grouped GEMM shares (the
// schedule's checks, the row tile, the split plan). INT4 experts: experts_w4a16.cuh.
#pragma once
#include "lkw/launch.h"
#include "moe.cuh"

namespace lkw::moe {

constexpr const char* kGroupedOp = "moe_grouped_gemm";
constexpr const char* kGroupedSiluOp = "moe_grouped_gemm_silu";
constexpr const char* kSumOp = "moe_sum";
constexpr const char* kGroupedSumOp = "moe_grouped_gemm_sum";

// The grouped GEMM's tiles: rows come in m16 tiles (the mma's M), so an align block is a whole
// number of them; K and N come in 8-element pieces (a 16-byte cp.async of a row, an n8 tile).
constexpr int kGemmRowTile = 16;
constexpr int kGemmPiece = 8;

// n / d for 0 <= n < 2^31 and 1 <= d <= 2^20 as a multiply and a shift: m = ceil(2^p / d) with
// p = 31 + l, 2^l >= d, computed once on the host. It is exact: n·m / 2^p = n / d + n·e / 2^p
// with 0 <= e < 1, and n·e / 2^p < 2^-l <= 1/d never carries past the next integer. A kernel's
// division by a run-time int is instead a float reciprocal sequence (I2F.RP, MUFU.RCP, F2I and
// a correction), whose I2F would hide among the converts a "no I2F" SASS fact forbids.
struct Divisor {
  uint32_t magic;
  int shift;
};
inline Divisor divisor_of(int d) {
  int l = 0;
  while ((1 << l) < d) ++l;
  const uint64_t p = uint64_t(1) << (31 + l);
  return {uint32_t((p + uint64_t(d) - 1) / uint64_t(d)), 31 + l};
}
__host__ __device__ __forceinline__ int divide(int n, Divisor d) {
  return int((uint64_t(uint32_t(n)) * d.magic) >> d.shift);
}

// A grouped launch's row tile in m16 tiles (1, 2 or 4: 16, 32 or 64 rows): the largest whose rows
// divide BLOCK_M (a tile never spans two experts' blocks) and no more than the rows an expert
// gets on average need (T·topk / E, rounded up to 16), so that decode does not multiply sentinels.
template <class Grouped>
int row_tiles_for(const Grouped& a) {
  const int64_t per_expert = ceil_div(a.t * a.topk, a.num_experts);
  int tiles = per_expert <= 16 ? 1 : per_expert <= 32 ? 2 : 4;
  while (a.block_m % (16 * tiles)) tiles /= 2;
  return tiles;
}

// A grouped launch's live tiles, as the host plans them (split-K, v10): it cannot see the routing
// (the launch stays asynchronous, as a decoder's graph needs), so it counts a uniform routing's:
// min(E, T·topk) experts of ceil(T·topk / that) rows each, in tiles of `tile_rows` rows, times the
// N tiles. A skewed routing has fewer live tiles: more idle SMs, never a wrong result.
inline int64_t uniform_live_tiles(int64_t t, int64_t topk, int64_t experts, int64_t tile_rows,
                                  int64_t n_tiles) {
  const int64_t slots = t * topk, routed = std::min(experts, slots);
  if (routed <= 0) return 0;
  const int64_t rows = (slots + routed - 1) / routed;
  return routed * ((rows + tile_rows - 1) / tile_rows) * n_tiles;
}

struct GroupedArgs {
  const __nv_bfloat16* x;     // [T, K]: token t serves slots t·topk .. t·topk + topk − 1
  const __nv_bfloat16* w;     // [E, N, K]
  const int32_t* sorted_ids;  // [rows]: slots, each expert's run padded with the sentinel T·topk
  const int32_t* expert_ids;  // [rows / block_m]: −1 = no expert (the block is skipped)
  __nv_bfloat16* out;         // [T·topk, N], or [T·topk, N/2] with silu
  int64_t t, n, k;
  int num_experts, topk, block_m;
  int64_t rows;
  bool silu;
  const float* weights = nullptr;  // [T, topk]: moe_grouped_gemm_sum's (then x is [T·topk, K])
};

using GroupedLaunch = Status (*)(const GroupedArgs& a, cudaStream_t stream);

// Everything a launcher can check without reading device memory. The ids are data: a sorted id
// outside 0..T·topk − 1 (the sentinel included) is a row the kernels skip, an expert id outside
// 0..E − 1 a block they skip, so no id makes them read or write out of bounds.
// check_schedule holds what every grouped GEMM checks of x, the schedule and out (x_rows rows of
// K, out_rows rows of out_n); each op adds the checks of its weights (GroupedArgs,
// GroupedW4a16Args). x has a row per token and out one per slot, but for moe_grouped_gemm_sum,
// whose x (h) has a row per slot and out one per token. x_bytes: bytes of an x element (FP8: 1).
template <class Grouped>
Check check_schedule(const Grouped& a, int64_t x_rows, int64_t out_rows, int64_t out_n,
                     int x_bytes = 2) {
  const int64_t out_bytes = 2 * out_rows * out_n;
  Check c;
  c.not_null(a.x, "x")
      .not_null(a.sorted_ids, "sorted_token_ids")
      .not_null(a.expert_ids, "expert_ids")
      .not_null(a.out, "out")
      .positive(a.t, "T")
      .positive(a.n, "N")
      .positive(a.k, "K")
      .that(a.num_experts >= 1, "w must hold at least one expert")
      .that(a.topk >= 1, "topk must be >= 1 (got " + std::to_string(a.topk) + ")")
      .that(a.t * a.topk < (int64_t(1) << 31) && a.k < (int64_t(1) << 31),
            "T·topk and K must fit int32")
      .that(a.block_m >= kGemmRowTile && a.block_m <= kMaxBlockM && a.block_m % kGemmRowTile == 0,
            "block_m = " + std::to_string(a.block_m) +
                " must be a multiple of 16 (whole m16 tiles) in 16..1024")
      .that(a.rows >= a.block_m && a.rows % a.block_m == 0 && a.rows < (int64_t(1) << 31),
            "sorted_token_ids must hold a positive multiple of block_m entries (below 2^31)")
      .aligned(a.x, 16, "x")
      .aligned(a.out, 16, "out")
      .aligned(a.sorted_ids, 4, "sorted_token_ids")
      .aligned(a.expert_ids, 4, "expert_ids")
      .disjoint(a.out, out_bytes, a.x, x_bytes * x_rows * a.k, "out and x")
      .disjoint(a.out, out_bytes, a.sorted_ids, 4 * a.rows, "out and sorted_token_ids")
      .disjoint(a.out, out_bytes, a.expert_ids, 4 * (a.rows / a.block_m), "out and expert_ids");
  return c;
}
template <class Grouped>
Check check_schedule(const Grouped& a, int64_t out_n) {
  return check_schedule(a, a.t, a.t * a.topk, out_n);
}
inline Status validate_grouped(const GroupedArgs& a) {
  const int64_t n_piece = a.silu ? 2 * kGemmPiece : kGemmPiece;
  const int64_t out_n = a.silu ? a.n / 2 : a.n;
  return check_schedule(a, out_n)
      .not_null(a.w, "w")
      .that(a.n <= 65535 * int64_t(128), "N must be at most 65535·128 (the grid's y)")
      .that(a.n % n_piece == 0,
            "N = " + std::to_string(a.n) + " must be a multiple of " + std::to_string(n_piece) +
                (a.silu ? " (gate and up halves of whole n8 tiles)" : " (whole n8 tiles)"))
      .that(a.k % kGemmPiece == 0,
            "K = " + std::to_string(a.k) + " must be a multiple of 8 (16-byte rows)")
      .aligned(a.w, 16, "w")
      .disjoint(a.out, 2 * a.t * a.topk * out_n, a.w, 2 * a.num_experts * a.n * a.k, "out and w")
      .arch_at_least(80)
      .status();
}

// Generic Args → GroupedArgs: inputs x, w, sorted_token_ids, expert_ids; output out; params
// topk and block_m (the align's).
inline Status grouped_args(const Args& a, bool silu, GroupedArgs* out) {
  const char* name = silu ? kGroupedSiluOp : kGroupedOp;
  Status s = Check()
                 .that(a.inputs.size() == 4 && a.outputs.size() == 1,
                       std::string(name) +
                           " takes x, w, sorted_token_ids, expert_ids and writes out")
                 .that(a.params.count("topk") == 1 && a.params.count("block_m") == 1,
                       std::string(name) + " needs the params topk and block_m")
                 .status();
  if (!s.ok()) return s;
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &sorted = a.inputs[2],
                  &experts = a.inputs[3], &y = a.outputs[0];
  s = Check()
          .that(x.dtype == DType::kBF16 && x.shape.size() == 2, "x is bfloat16 [T, K]")
          .that(w.dtype == DType::kBF16 && w.shape.size() == 3, "w is bfloat16 [E, N, K]")
          .that(sorted.dtype == DType::kI32 && sorted.shape.size() == 1 &&
                    experts.dtype == DType::kI32 && experts.shape.size() == 1,
                "sorted_token_ids and expert_ids are int32 vectors")
          .that(y.dtype == DType::kBF16 && y.shape.size() == 2, "out is bfloat16 [T·topk, N]")
          .status();
  if (!s.ok()) return s;
  const double topk = a.params.at("topk"), m = a.params.at("block_m");
  s = Check()
          .that(topk >= 1 && topk < (1 << 20) && topk == std::floor(topk),
                "topk must be a positive integer")
          .that(m >= 1 && m <= kMaxBlockM && m == std::floor(m), "block_m must be in 1..1024")
          .that(w.dim(2) == x.dim(1), "x [T, K] and w [E, N, K] disagree on K")
          .status();
  if (!s.ok()) return s;
  const int64_t out_n = silu ? w.dim(1) / 2 : w.dim(1);
  s = Check()
          .that(y.dim(0) == x.dim(0) * int64_t(topk) && y.dim(1) == out_n,
                std::string("out must be [T·topk, ") + (silu ? "N/2" : "N") + "] = [" +
                    std::to_string(x.dim(0) * int64_t(topk)) + ", " + std::to_string(out_n) +
                    "]")
          .that(experts.dim(0) * int64_t(m) == sorted.dim(0),
                "expert_ids must hold one id per block_m rows of sorted_token_ids")
          .status();
  if (!s.ok()) return s;
  *out = GroupedArgs{static_cast<const __nv_bfloat16*>(x.data),
                     static_cast<const __nv_bfloat16*>(w.data),
                     static_cast<const int32_t*>(sorted.data),
                     static_cast<const int32_t*>(experts.data),
                     static_cast<__nv_bfloat16*>(y.data),
                     x.dim(0),
                     w.dim(1),
                     x.dim(1),
                     int(w.dim(0)),
                     int(topk),
                     int(m),
                     sorted.dim(0),
                     silu};
  return {};
}

// Bytes of the roofline minimum: x, the ids and out once, and the weights of the ROUTED experts
// only (a decode step touches a few of E). Which experts are routed is data on the device, so
// the caller says how many (param routed_experts: the distinct ids >= 0 in expert_ids,
// lkw.moe.routed_experts); without it, min(E, T·topk), the most a routing can touch.
inline double grouped_bytes(const Args& a) {
  const TensorRef &x = a.inputs.at(0), &w = a.inputs.at(1);
  const double slots = double(x.dim(0)) * a.param("topk", 1.0);
  const double routed = a.param("routed_experts", std::min(double(w.dim(0)), slots));
  return double(x.bytes() + a.inputs.at(2).bytes() + a.inputs.at(3).bytes() +
                a.outputs.at(0).bytes()) +
         routed * 2.0 * double(w.dim(1)) * double(w.dim(2));
}

// 2·N·K per real row (x's rows times topk: the slots; padding rows are work, not FLOPs); the SiLU
// and the products of an epilogue are not counted.
inline double grouped_flops(const Args& a) {
  const TensorRef &x = a.inputs.at(0), &w = a.inputs.at(1);
  return 2.0 * double(x.dim(0)) * a.param("topk", 1.0) * double(w.dim(1)) * double(w.dim(2));
}

inline Version grouped_version(bool silu, const char* id, const char* summary,
                               GroupedLaunch launch, std::vector<SassFact> sass = {},
                               Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, silu ? kGroupedSiluOp : kGroupedOp, id, summary, kind,
                         std::move(sass));
  v.launch = [silu, launch](const Args& a, cudaStream_t stream) -> Status {
    GroupedArgs ga;
    Status s = grouped_args(a, silu, &ga);
    return s.ok() ? launch(ga, stream) : s;
  };
  v.bytes = grouped_bytes;
  v.flops = grouped_flops;
  return v;
}

// ---- moe_grouped_gemm_sum: the down GEMM with moe_sum in its epilogue
// x holds a row per slot (h [T·topk, K]: row s is slot s's), out a row per token [T, N]:
// out[t] = sum_j weights[t, j] · (x[t·topk + j] · w[e]ᵀ), FP32, rounded once; a slot in no run
// (a masked id) adds nothing, and every token's row is written.
inline Status validate_grouped_sum(const GroupedArgs& a) {
  const int64_t slots = a.t * a.topk;
  return check_schedule(a, slots, a.t, a.n)
      .not_null(a.w, "w")
      .not_null(a.weights, "topk_weights")
      .that(a.topk <= (1 << 20) && a.t * a.n < (int64_t(1) << 31),
            "topk must be at most 2^20 and T·N fit int32")
      .that(a.n % kGemmPiece == 0 && a.k % kGemmPiece == 0,
            "N and K must be multiples of 8 (16-byte pieces)")
      .aligned(a.w, 16, "w")
      .aligned(a.weights, 4, "topk_weights")
      .disjoint(a.out, 2 * a.t * a.n, a.w, 2 * a.num_experts * a.n * a.k, "out and w")
      .disjoint(a.out, 2 * a.t * a.n, a.weights, 4 * slots, "out and topk_weights")
      .arch_at_least(80)
      .status();
}

// Generic Args → GroupedArgs: inputs x [T·topk, K], w, sorted_token_ids, expert_ids,
// topk_weights FP32 [T, topk]; output out [T, N]; param block_m (topk is the weights' columns).
inline Status grouped_sum_args(const Args& a, GroupedArgs* out) {
  Status s = Check()
                 .that(a.inputs.size() == 5 && a.outputs.size() == 1,
                       std::string(kGroupedSumOp) +
                           " takes x, w, sorted_token_ids, expert_ids, topk_weights and writes out")
                 .that(a.params.count("block_m") == 1, std::string(kGroupedSumOp) + " needs the param block_m")
                 .status();
  if (!s.ok()) return s;
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &sorted = a.inputs[2],
                  &experts = a.inputs[3], &weights = a.inputs[4], &y = a.outputs[0];
  const double m = a.params.at("block_m");
  s = Check()
          .that(x.dtype == DType::kBF16 && x.shape.size() == 2, "x is bfloat16 [T·topk, K]")
          .that(w.dtype == DType::kBF16 && w.shape.size() == 3, "w is bfloat16 [E, N, K]")
          .that(sorted.dtype == DType::kI32 && sorted.shape.size() == 1 &&
                    experts.dtype == DType::kI32 && experts.shape.size() == 1,
                "sorted_token_ids and expert_ids are int32 vectors")
          .that(weights.dtype == DType::kF32 && weights.shape.size() == 2, "topk_weights is float32 [T, topk]")
          .that(y.dtype == DType::kBF16 && y.shape.size() == 2, "out is bfloat16 [T, N]")
          .that(m >= 1 && m <= kMaxBlockM && m == std::floor(m), "block_m must be in 1..1024")
          .status();
  if (!s.ok()) return s;
  const int64_t t = weights.dim(0), topk = weights.dim(1);
  s = Check()
          .that(x.dim(0) == t * topk, "x must hold a row per slot: [T·topk, K] = [" +
                                          std::to_string(t * topk) + ", K]")
          .that(w.dim(2) == x.dim(1), "x [T·topk, K] and w [E, N, K] disagree on K")
          .that(y.dim(0) == t && y.dim(1) == w.dim(1), "out must be [T, N] = [" + std::to_string(t) +
                                                          ", " + std::to_string(w.dim(1)) + "]")
          .that(experts.dim(0) * int64_t(m) == sorted.dim(0),
                "expert_ids must hold one id per block_m rows of sorted_token_ids")
          .status();
  if (!s.ok()) return s;
  GroupedArgs g{static_cast<const __nv_bfloat16*>(x.data), static_cast<const __nv_bfloat16*>(w.data),
                static_cast<const int32_t*>(sorted.data), static_cast<const int32_t*>(experts.data),
                static_cast<__nv_bfloat16*>(y.data), t, w.dim(1), x.dim(1), int(w.dim(0)), int(topk),
                int(m), sorted.dim(0), false};
  g.weights = static_cast<const float*>(weights.data);
  *out = g;
  return {};
}

// The roofline minimum: grouped_bytes (x has a row per slot here, so no topk param: its rows are
// the slots) and the weights once; the FP32 accumulator the epilogue adds into (zeroed, added to,
// converted) is the fusion's cost.
inline Version grouped_sum_version(const char* id, const char* summary, GroupedLaunch launch,
                                   std::vector<SassFact> sass = {}) {
  Version v = version_of(kChapter, kGroupedSumOp, id, summary, Kind::kVersion, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    GroupedArgs ga;
    Status s = grouped_sum_args(a, &ga);
    return s.ok() ? launch(ga, stream) : s;
  };
  v.bytes = [](const Args& a) { return grouped_bytes(a) + double(a.inputs.at(4).bytes()); };
  v.flops = grouped_flops;
  return v;
}

// ---- moe_sum

struct SumArgs {
  const __nv_bfloat16* y;  // [T, k, d]: row t·k + j is slot (t, j)'s expert output
  const float* weights;    // [T, k]
  __nv_bfloat16* out;      // [T, d]
  int64_t t, d;
  int k;
};

using SumLaunch = Status (*)(const SumArgs& a, cudaStream_t stream);

inline Status validate_sum(const SumArgs& a) {
  return Check()
      .not_null(a.y, "y")
      .not_null(a.weights, "topk_weights")
      .not_null(a.out, "out")
      .positive(a.t, "T")
      .positive(a.d, "d")
      .that(a.k >= 1, "k must be >= 1 (got " + std::to_string(a.k) + ")")
      .that(a.t < (int64_t(1) << 31), "T must be below 2^31")
      .that(a.d % 8 == 0, "d = " + std::to_string(a.d) + " must be a multiple of 8 (16-byte rows)")
      .aligned(a.y, 16, "y")
      .aligned(a.out, 16, "out")
      .aligned(a.weights, 4, "topk_weights")
      .disjoint(a.out, 2 * a.t * a.d, a.y, 2 * a.t * a.k * a.d, "out and y")
      .disjoint(a.out, 2 * a.t * a.d, a.weights, 4 * a.t * a.k, "out and topk_weights")
      .arch_at_least(80)
      .status();
}

inline Version sum_version(const char* id, const char* summary, SumLaunch launch,
                           std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, kSumOp, id, summary, kind, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 2 && a.outputs.size() == 1,
                         "moe_sum takes y and topk_weights and writes out")
                   .status();
    if (!s.ok()) return s;
    const TensorRef &y = a.inputs[0], &w = a.inputs[1], &out = a.outputs[0];
    s = Check()
            .that(y.dtype == DType::kBF16 && y.shape.size() == 3, "y is bfloat16 [T, k, d]")
            .that(w.dtype == DType::kF32 && w.shape.size() == 2, "topk_weights is float32 [T, k]")
            .that(out.dtype == DType::kBF16 && out.shape.size() == 2, "out is bfloat16 [T, d]")
            .status();
    if (!s.ok()) return s;
    s = Check()
            .that(w.dim(0) == y.dim(0) && w.dim(1) == y.dim(1), "topk_weights must be y's [T, k]")
            .that(out.dim(0) == y.dim(0) && out.dim(1) == y.dim(2), "out must be [T, d]")
            .that(y.dim(1) < (1 << 20), "k must be below 2^20")
            .status();
    if (!s.ok()) return s;
    return launch(SumArgs{static_cast<const __nv_bfloat16*>(y.data),
                          static_cast<const float*>(w.data), static_cast<__nv_bfloat16*>(out.data),
                          y.dim(0), y.dim(2), int(y.dim(1))},
                  stream);
  };
  v.bytes = tensor_bytes;
  v.flops = [](const Args& a) { return 2.0 * double(a.inputs.at(0).numel()); };  // an FMA each
  return v;
}

}  // namespace lkw::moe
