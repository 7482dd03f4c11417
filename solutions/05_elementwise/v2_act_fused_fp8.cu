// v2_act_fused_fp8 — SiLU-and-mul with chapter 03's FP8 quantization in the same kernel.
//
// Since v1: y never reaches memory. The kernel rounds y to BF16 (yb, the value an unfused chain
// would store) and quantizes yb by chapter 03's rules (quant_math.cuh), so q and the scales equal
// the two-kernel chain's bit for bit — at 5 bytes per element instead of 9 (y's 2 bytes written
// and read back are gone; q is 1 byte). Each granularity needs a different shape of cooperation:
//   per token   the absmax of a whole row: a block per row (a cluster at decode, the blocks'
//               absmaxes exchanged in distributed shared memory), its yb in registers (up to 4
//               units of 8 a thread) through a block reduction, then quantized
//   per group   1 × 128 groups: a half-warp per group, a unit per lane, four shuffles
//   per tensor  the scale is an input (a calibrated activation scale): no reduction at all, v1's
//               flat unit loop with an 8-byte store of codes. A dynamic per-tensor scale would
//               need the whole tensor's absmax before the first code: two passes, not a fusion.
// Expect: ≥ 90% of the copy ceiling at T = 8192 for all three (5 B per element; the per-token
// block per row is the hardest to keep full); SASS: LDG.E.128, STG.E.64, F2FP on sm_89+.
#include "elementwise.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"

namespace lkw::elementwise {
namespace {

using quant::fp8_inverse;
using quant::fp8_scale;
using quant::quantize_e4m3x2;

// 8 (or 1) yb of a unit → their E4M3 codes, 8 bytes (or 1).
template <int kVec>
struct Codes {
  using Word = std::conditional_t<kVec == 8, uint2, uint8_t>;
};

template <int kVec>
__device__ __forceinline__ typename Codes<kVec>::Word quantize_unit(const Bf16Vec<kVec>& yb,
                                                                     float inv) {
  // BEGIN SOLUTION: v2 — codes of the unit's yb times inv (quantize_e4m3x2: low byte first)
  if constexpr (kVec == 8) {
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t lo = quantize_e4m3x2(get(yb, 4 * h), get(yb, 4 * h + 1), inv);
      const uint32_t hi = quantize_e4m3x2(get(yb, 4 * h + 2), get(yb, 4 * h + 3), inv);
      w[h] = lo | hi << 16;
    }
    return make_uint2(w[0], w[1]);
  } else {
    return uint8_t(quantize_e4m3x2(get(yb, 0), 0.0f, inv) & 0xff);
  }
  // STUB: return {};
  // END SOLUTION
}

// Stage: yb of one unit from its gate and up (in place of the gate), and its absmax.
template <int kVec>
__device__ __forceinline__ float silu_unit(Bf16Vec<kVec>& gate, const Bf16Vec<kVec>& up) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    put(gate, j, act_and_mul<Act::kSilu>(get(gate, j), get(up, j), 0.0f));
    amax = fmaxf(amax, fabsf(get(gate, j)));  // of yb, the rounded value the chain would store
  }
  return amax;
}

// ---- per token: a block (or a cluster of kCluster blocks) per row ------------------------------
constexpr int kTokenUnits = 4;  // units per thread: d ≤ 1024 · 4 · 8 = 32768 (1024 · 4 for kVec 1)
constexpr int kMaxThreads = 1024;
constexpr int kMaxCluster = 8;  // CTAs a row at most: the portable cluster size

// Reduce (a cluster's rows): every CTA's block absmax, through distributed shared memory. Each
// CTA leaves its own in shared memory; after the first cluster barrier every thread reads all
// kCluster of them (max: the order does not matter, the bits are the one-block row's); the
// second keeps every CTA's shared memory alive until the last read of it.
template <int kCluster>
__device__ __forceinline__ float cluster_max(float block_amax) {
  if constexpr (kCluster == 1) {
    return block_amax;
  } else {
    __shared__ float amax_sh;
    if (threadIdx.x == 0) amax_sh = block_amax;
    ptx::cluster_sync();
    float amax = block_amax;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) amax = fmaxf(amax, ptx::ld_shared_cluster_f32(&amax_sh, r));
    ptx::cluster_sync();
    return amax;
  }
}

// Block b takes row b / kCluster, units [rank · slice, + slice) of it (rank: b's place in its
// cluster; slice = row_units with one CTA a row).
template <int kVec, int kCluster>
__global__ void __launch_bounds__(kMaxThreads)
    per_token_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ q,
                     float* __restrict__ scales, int row_units, int slice, float scale_ub) {
  const int64_t row = blockIdx.x / kCluster;
  const unsigned rank = kCluster > 1 ? ptx::cluster_ctarank() : 0;
  const int first = int(rank) * slice, units = min(slice, row_units - first);
  const auto* x_vec = reinterpret_cast<const Bf16Vec<kVec>*>(x) + row * 2 * row_units + first;
  auto* q_row = reinterpret_cast<typename Codes<kVec>::Word*>(q + (row * row_units + first) * kVec);
  Bf16Vec<kVec> gate[kTokenUnits], up[kTokenUnits];
  // Stage: load the thread's units of the slice (gates, then ups, row_units apart).
#pragma unroll
  for (int u = 0; u < kTokenUnits; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    if (i < units) {
      gate[u] = x_vec[i];              // (T, d/kVec) of the first half
      up[u] = x_vec[row_units + i];    // (T, d/kVec) of the second
    }
  }
  // Stage: yb and the slice's absmax (units past it add nothing).
  float amax = 0.0f;
#pragma unroll
  for (int u = 0; u < kTokenUnits; ++u)
    if (threadIdx.x + u * blockDim.x < units) amax = fmaxf(amax, silu_unit(gate[u], up[u]));
  // BEGIN SOLUTION: v2 — the row's absmax (the block's, then the cluster's), its scale (stored once), the codes
  amax = cluster_max<kCluster>(rmsnorm::block_reduce<rmsnorm::Max>(amax));
  const float scale = fp8_scale(amax, scale_ub);
  if (threadIdx.x == 0 && rank == 0) scales[row] = scale;  // (T, 1)
  const float inv = fp8_inverse(scale);
#pragma unroll
  for (int u = 0; u < kTokenUnits; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    if (i < units) q_row[i] = quantize_unit(gate[u], inv);  // (T, d/kVec) × 8 B
  }
  // END SOLUTION
}

// ---- per group: a half-warp per 1 × 128 group ------------------------------------------------
constexpr int kGroupThreads = 256;
constexpr int kLanesPerGroup = kGroup / 8;  // 16

__global__ void __launch_bounds__(kGroupThreads)
    per_group_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ q,
                     float* __restrict__ scales, int64_t t, int64_t groups_per_row,
                     bool scales_row_major) {
  const int64_t group = (blockIdx.x * int64_t(kGroupThreads) + threadIdx.x) / kLanesPerGroup;
  const int lane = threadIdx.x % kLanesPerGroup;
  const bool active = group < t * groups_per_row;  // the last half-warp may have no group
  const int64_t row = group / groups_per_row, g = group % groups_per_row;
  const int64_t row_units = groups_per_row * kLanesPerGroup, unit = g * kLanesPerGroup + lane;
  const auto* x_vec = reinterpret_cast<const Bf16Vec<8>*>(x) + row * 2 * row_units;
  Bf16Vec<8> gate{}, up{};
  if (active) {
    gate = x_vec[unit];              // (T, d/8)
    up = x_vec[row_units + unit];
  }
  float amax = silu_unit(gate, up);
  // BEGIN SOLUTION: v2 — the group's absmax over its 16 lanes, then scale, codes, one scale store
#pragma unroll
  for (int offset = kLanesPerGroup / 2; offset > 0; offset >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (!active) return;
  const float scale = fp8_scale(amax, 0.0f);
  reinterpret_cast<uint2*>(q)[row * row_units + unit] = quantize_unit(gate, fp8_inverse(scale));
  if (lane == 0) scales[scales_row_major ? row * groups_per_row + g : g * t + row] = scale;
  // END SOLUTION
}

// ---- per tensor: v1's flat loop, the scale an input ------------------------------------------
constexpr int kTensorThreads = 128;
constexpr int kTensorUnits = 2;

template <int kVec>
__global__ void __launch_bounds__(kTensorThreads)
    per_tensor_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ q,
                      const float* __restrict__ scale, int64_t units, int64_t row_units) {
  const auto* x_vec = reinterpret_cast<const Bf16Vec<kVec>*>(x);
  auto* q_vec = reinterpret_cast<typename Codes<kVec>::Word*>(q);
  const int64_t first = blockIdx.x * int64_t(kTensorThreads * kTensorUnits) + threadIdx.x;
  Bf16Vec<kVec> gate[kTensorUnits], up[kTensorUnits];
#pragma unroll
  for (int u = 0; u < kTensorUnits; ++u) {
    const int64_t unit = first + u * kTensorThreads;
    if (unit >= units) break;
    const int64_t row = unit / row_units, c = unit % row_units;
    gate[u] = x_vec[row * 2 * row_units + c];  // (T, 2 row_units)
    up[u] = x_vec[row * 2 * row_units + row_units + c];
  }
  const float inv = fp8_inverse(*scale);  // fp32(1 / scale), as quant.quantize_fp8
#pragma unroll
  for (int u = 0; u < kTensorUnits; ++u) {
    const int64_t unit = first + u * kTensorThreads;
    if (unit >= units) break;
    silu_unit(gate[u], up[u]);
    q_vec[unit] = quantize_unit(gate[u], inv);  // (T, row_units) × 8 B
  }
}

// ---- launchers ---------------------------------------------------------------------------------
int vec_for(int64_t d) { return d % 8 == 0 ? 8 : 1; }

// CTAs a row: one where the rows fill the SMs or clusters do not exist (before sm_90); else as
// many as fill them, a power of two up to kMaxCluster, while a slice keeps a warp's units.
int cluster_for(int64_t t, int row_units, bool clusters) {
  int c = 1;
  if (clusters)
    while (c < kMaxCluster && t * 2 * c <= sm_count() && row_units / (2 * c) >= 32) c *= 2;
  return c;
}

template <int kVec, int kCluster>
Status launch_per_token(const ActArgs& a, int row_units, cudaStream_t stream) {
  const int slice = (row_units + kCluster - 1) / kCluster;
  // As few whole warps as hold the slice at kTokenUnits units a thread.
  const int threads = int((slice + kTokenUnits * 32 - 1) / (kTokenUnits * 32) * 32);
  const dim3 grid(unsigned(a.t * kCluster));
  if constexpr (kCluster == 1) {
    per_token_kernel<kVec, 1><<<grid, threads, 0, stream>>>(a.x, a.q, a.scales, row_units, slice, a.scale_ub);
    return last_launch_status(kSiluFp8PerToken.name);
  } else {
    return launch_cluster(per_token_kernel<kVec, kCluster>, grid, kCluster, threads, 0, stream,
                          kSiluFp8PerToken.name, a.x, a.q, a.scales, row_units, slice, a.scale_ub);
  }
}

// The version splits decode rows over clusters; ablation_v2_one_block_a_row keeps a block a row.
template <bool kClusters>
Status per_token(const ActArgs& a, cudaStream_t stream) {
  const int vec = vec_for(a.d);
  Status s = validate_act(kSiluFp8PerToken, a, vec, int64_t(kMaxThreads) * kTokenUnits * vec);
  if (!s.ok()) return s;
  const int row_units = int(a.d / vec);
  static const bool can_cluster = device_arch() >= 90;
  if (vec == 1) return launch_per_token<1, 1>(a, row_units, stream);
  switch (cluster_for(a.t, row_units, kClusters && can_cluster)) {
    case 8: return launch_per_token<8, 8>(a, row_units, stream);
    case 4: return launch_per_token<8, 4>(a, row_units, stream);
    case 2: return launch_per_token<8, 2>(a, row_units, stream);
    default: return launch_per_token<8, 1>(a, row_units, stream);
  }
}

Status per_group(const ActArgs& a, cudaStream_t stream) {
  Status s = validate_act(kSiluFp8PerGroup, a, 8, std::numeric_limits<int32_t>::max());
  if (!s.ok()) return s;
  const int64_t groups = a.t * (a.d / kGroup), per_block = kGroupThreads / kLanesPerGroup;
  per_group_kernel<<<unsigned((groups + per_block - 1) / per_block), kGroupThreads, 0, stream>>>(
      a.x, a.q, a.scales, a.t, a.d / kGroup, a.scales_row_major);
  return last_launch_status(kSiluFp8PerGroup.name);
}

Status per_tensor(const ActArgs& a, cudaStream_t stream) {
  const int vec = vec_for(a.d);
  Status s = validate_act(kSiluFp8PerTensor, a, vec, std::numeric_limits<int32_t>::max());
  if (!s.ok()) return s;
  const int64_t row_units = a.d / vec, units = a.t * row_units;
  const int64_t per_block = int64_t(kTensorThreads) * kTensorUnits;
  const unsigned blocks = unsigned((units + per_block - 1) / per_block);
  if (vec == 8) {
    per_tensor_kernel<8><<<blocks, kTensorThreads, 0, stream>>>(a.x, a.q, a.scale, units,
                                                                row_units);
  } else {
    per_tensor_kernel<1><<<blocks, kTensorThreads, 0, stream>>>(a.x, a.q, a.scale, units,
                                                                row_units);
  }
  return last_launch_status(kSiluFp8PerTensor.name);
}

std::vector<SassFact> wide(const std::string& kernel) {
  return {{kernel, {}, {"LDG.E.128", "STG.E.64"}, {}, true, "16-byte loads, 8-byte code stores"},
          {kernel, {"sm_89", "sm_90a"}, {"F2FP"}, {}, true, "the hardware E4M3 cvt"}};
}

std::vector<SassFact> clustered() {
  auto facts = wide("per_token_kernelILi8ELi1E");
  facts.push_back({"per_token_kernelILi8ELi8E", {"sm_90a"}, {"UCGABAR_ARV", "UCGABAR_WAIT", "LDG.E.128"}, {}, true,
                   "a cluster of 8 a row: its barriers around the absmax exchange, 16-byte loads"});
  return facts;
}

const Register kPerTokenRegistered{act_version(
    kSiluFp8PerToken, "v2_act_fused_fp8",
    "fused per-token FP8: a block (a cluster, at decode) per row, yb in registers through the absmax",
    per_token<true>, clustered())};
const Register kPerTokenOneBlock{act_version(
    kSiluFp8PerToken, "ablation_v2_one_block_a_row",
    "v2 per token with one block a row at every T (no clusters)", per_token<false>,
    wide("per_token_kernelILi8ELi1E"), Kind::kAblation)};
const Register kPerGroupRegistered{act_version(
    kSiluFp8PerGroup, "v2_act_fused_fp8", "fused 1 x 128 FP8: a half-warp per group", per_group,
    wide("per_group_kernel"))};
const Register kPerTensorRegistered{act_version(
    kSiluFp8PerTensor, "v2_act_fused_fp8", "fused static per-tensor FP8: v1's loop, q not y",
    per_tensor, wide("per_tensor_kernelILi8E"))};

}  // namespace
}  // namespace lkw::elementwise
