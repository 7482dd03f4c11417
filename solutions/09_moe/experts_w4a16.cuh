// Chapter 09 — moe_grouped_gemm_w4a16, the grouped GEMM with INT4 experts (chapter 07's repacked
// words and group scales): its arguments, checks, byte model and registry entry (v10).
#pragma once
#include "experts.cuh"

namespace lkw::moe {

constexpr const char* kGroupedW4a16Op = "moe_grouped_gemm_w4a16";
// The repacked layout's channel block (lkw.w4a16.BLOCK_N): for every k16 step, a lane's 16 bytes
// are its B fragments of 64 output channels.
constexpr int kRepackN = 64;

struct GroupedW4a16Args {
  const __nv_bfloat16* x;       // [T, K]: token t serves slots t·topk .. t·topk + topk − 1
  const uint32_t* w;            // [E, N/64, 8K]: expert e's words repacked (lkw.w4a16.repack)
  const __nv_bfloat16* scales;  // [E, K/G, N]: group-major per expert, as chapter 07's
  const int32_t* sorted_ids;    // [rows], as moe_grouped_gemm's
  const int32_t* expert_ids;    // [rows / block_m]
  __nv_bfloat16* out;           // [T·topk, N]
  int64_t t, n, k, group;
  int num_experts, topk, block_m;
  int64_t rows;
};

using GroupedW4a16Launch = Status (*)(const GroupedW4a16Args& a, cudaStream_t stream);

// moe_grouped_gemm's checks of the schedule, and chapter 07's of the weights: N in whole 64-channel
// blocks of the repacked layout, K in whole 32-k halves of a stage (each half reads one scale row,
// so no k16 step straddles two groups), G one of 32, 64, 128 or K.
inline Status validate_grouped_w4a16(const GroupedW4a16Args& a) {
  const int64_t groups = a.group > 0 ? a.k / a.group : 0;
  return check_schedule(a, a.n)
      .not_null(a.w, "w")
      .not_null(a.scales, "scales")
      .that(a.n <= 65535 * int64_t(256), "N must be at most 65535·256 (the grid's y)")
      .that(a.topk <= (1 << 20), "topk must be at most 2^20 (a Divisor's range)")
      .that(a.n % kRepackN == 0, "N = " + std::to_string(a.n) +
                                     " must be a multiple of 64 (whole 64-channel blocks of the "
                                     "repacked layout)")
      .that(a.k % 32 == 0, "K = " + std::to_string(a.k) +
                               " must be a multiple of 32 (whole halves of a 64-k stage)")
      .that(a.group == 32 || a.group == 64 || a.group == 128 || a.group == a.k,
            "group size must be 32, 64, 128 or K (got " + std::to_string(a.group) + ")")
      .multiple_of(a.k, a.group > 0 ? a.group : 1, "K")
      .aligned(a.w, 16, "w")
      .aligned(a.scales, 16, "scales")
      .disjoint(a.out, 2 * a.t * a.topk * a.n, a.w, a.num_experts * a.n * a.k / 2, "out and w")
      .disjoint(a.out, 2 * a.t * a.topk * a.n, a.scales, 2 * a.num_experts * groups * a.n,
                "out and scales")
      .arch_at_least(80)
      .status();
}

// Generic Args → GroupedW4a16Args: inputs x, w, scales, sorted_token_ids, expert_ids; output
// out; params topk and block_m. E and N come from the scales [E, K/G, N], K from x, G = K / (K/G).
inline Status grouped_w4a16_args(const Args& a, GroupedW4a16Args* out) {
  Status s = Check()
                 .that(a.inputs.size() == 5 && a.outputs.size() == 1,
                       "moe_grouped_gemm_w4a16 takes x, w, scales, sorted_token_ids, expert_ids "
                       "and writes out")
                 .that(a.params.count("topk") == 1 && a.params.count("block_m") == 1,
                       "moe_grouped_gemm_w4a16 needs the params topk and block_m")
                 .status();
  if (!s.ok()) return s;
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &sc = a.inputs[2], &sorted = a.inputs[3],
                  &experts = a.inputs[4], &y = a.outputs[0];
  s = Check()
          .that(x.dtype == DType::kBF16 && x.shape.size() == 2, "x is bfloat16 [T, K]")
          .that(w.dtype == DType::kU32 && w.shape.size() == 3,
                "w is uint32 [E, N/64, 8K] (each expert repacked, lkw.w4a16.repack)")
          .that(sc.dtype == DType::kBF16 && sc.shape.size() == 3, "scales are bfloat16 [E, K/G, N]")
          .that(sorted.dtype == DType::kI32 && sorted.shape.size() == 1 &&
                    experts.dtype == DType::kI32 && experts.shape.size() == 1,
                "sorted_token_ids and expert_ids are int32 vectors")
          .that(y.dtype == DType::kBF16 && y.shape.size() == 2, "out is bfloat16 [T·topk, N]")
          .status();
  if (!s.ok()) return s;
  const double topk = a.params.at("topk"), m = a.params.at("block_m");
  const int64_t e = sc.dim(0), groups = sc.dim(1), n = sc.dim(2), k = x.dim(1);
  s = Check()
          .that(topk >= 1 && topk < (1 << 20) && topk == std::floor(topk),
                "topk must be a positive integer")
          .that(m >= 1 && m <= kMaxBlockM && m == std::floor(m), "block_m must be in 1..1024")
          .that(groups > 0 && k % groups == 0,
                "scales must be [E, K/G, N]: K = " + std::to_string(k) +
                    " is no multiple of their K/G = " + std::to_string(groups))
          .that(n % kRepackN == 0,
                "N = " + std::to_string(n) + " (the scales' last side) must be a multiple of 64")
          .status();
  if (!s.ok()) return s;
  s = Check()
          .that(w.dim(0) == e && w.dim(1) * kRepackN == n && w.dim(2) == 8 * k,
                "w must be repacked words [E, N/64, 8K] = [" + std::to_string(e) + ", " +
                    std::to_string(n / kRepackN) + ", " + std::to_string(8 * k) +
                    "] (E and N from the scales, K from x)")
          .that(y.dim(0) == x.dim(0) * int64_t(topk) && y.dim(1) == n,
                "out must be [T·topk, N] = [" + std::to_string(x.dim(0) * int64_t(topk)) + ", " +
                    std::to_string(n) + "]")
          .that(experts.dim(0) * int64_t(m) == sorted.dim(0),
                "expert_ids must hold one id per block_m rows of sorted_token_ids")
          .status();
  if (!s.ok()) return s;
  *out = GroupedW4a16Args{static_cast<const __nv_bfloat16*>(x.data),
                          static_cast<const uint32_t*>(w.data),
                          static_cast<const __nv_bfloat16*>(sc.data),
                          static_cast<const int32_t*>(sorted.data),
                          static_cast<const int32_t*>(experts.data),
                          static_cast<__nv_bfloat16*>(y.data),
                          x.dim(0),
                          n,
                          k,
                          k / groups,
                          int(e),
                          int(topk),
                          int(m),
                          sorted.dim(0)};
  return {};
}

// moe_grouped_gemm's byte model with a routed expert's weights as stored: its INT4 words (N·K/2
// bytes) and its scales (N·K/G·2), half a byte and 2/G bytes per weight (v7's BF16: 2).
inline double grouped_w4a16_bytes(const Args& a) {
  const TensorRef &x = a.inputs.at(0), &w = a.inputs.at(1), &sc = a.inputs.at(2);
  const double experts = double(sc.dim(0)), slots = double(x.dim(0)) * a.param("topk", 1.0);
  const double routed = a.param("routed_experts", std::min(experts, slots));
  return double(x.bytes() + a.inputs.at(3).bytes() + a.inputs.at(4).bytes() +
                a.outputs.at(0).bytes()) +
         routed * double(w.bytes() + sc.bytes()) / experts;
}

inline Version grouped_w4a16_version(const char* id, const char* summary, GroupedW4a16Launch launch,
                                     std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, kGroupedW4a16Op, id, summary, kind, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    GroupedW4a16Args ga;
    Status s = grouped_w4a16_args(a, &ga);
    return s.ok() ? launch(ga, stream) : s;
  };
  v.bytes = grouped_w4a16_bytes;
  // 2·N·K per real row, as moe_grouped_gemm's (the unpack and the scaling are not counted).
  v.flops = [](const Args& a) {
    const TensorRef &x = a.inputs.at(0), &sc = a.inputs.at(2);
    return 2.0 * double(x.dim(0)) * a.param("topk", 1.0) * double(sc.dim(2)) * double(x.dim(1));
  };
  return v;
}

}  // namespace lkw::moe
