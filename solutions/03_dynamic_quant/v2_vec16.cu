// v2_vec16 — 16-byte loads and 8-byte stores; a warp per short row, a block per long one.
//
// Since v1: a thread's unit is a chunk of eight BF16, one LDG.E.128, quantized into eight codes
// stored with one STG.E.64; each thread loads all its kChunks chunks before it reduces, so
// 64 bytes per thread are in flight. Rows of up to 1024 elements get one warp each (eight rows
// per block): the reduction is five shuffles, no shared memory, no __syncthreads. Longer rows
// get a block of ceil(d / 32) threads, reducing through one shared word per warp; unaligned
// rows take a scalar path (quant_v2_vec16). Per group: a half-warp per 1 × 128 group, four
// groups per half-warp. Per tensor: v0's three kernels, 16 bytes wide, the quantize pass
// walking the tensor from its far end (per_tensor_v2_quantize_kernel says why).
// Expect: per token and per group ≈ 90% of the copy ceiling at T = 8192, d = 4096 (3 B per
// element); per tensor below that (x read twice). SASS: LDG.E.128 and STG.E.64; on sm_89+ the
// FP8 kernels convert with F2FP; no local memory.
#include <algorithm>

#include "dynamic_quant.cuh"

namespace lkw::quant {
namespace {

constexpr int kVec = 8;            // BF16 per 16-byte chunk
constexpr int kChunks = 4;         // chunks per thread on the vector path
constexpr int kScalarChunks = 16;  // elements per thread on the scalar path
constexpr int kMaxThreads = 1024;
constexpr int kRowsPerBlock = 8;                                       // warp-per-row blocks
constexpr int kWarpRowMaxD = 32 * kChunks * kVec;                      // 1024: rows a warp holds
constexpr int64_t kMaxD = int64_t(kMaxThreads) * kChunks * kVec;       // 32768
constexpr int64_t kMaxScalarD = int64_t(kMaxThreads) * kScalarChunks;  // 16384

// A thread's unit of work: eight BF16 in a 16-byte vector, or one BF16 on the scalar path.
template <int kWidth>
struct Chunk;
template <>
struct Chunk<kVec> {
  using In = uint4;
  template <class Quant>
  using Out = uint2;
  static __device__ __forceinline__ uint4 zero() { return make_uint4(0, 0, 0, 0); }
  static __device__ __forceinline__ float absmax(uint4 v, float m) { return absmax8(v, m); }
  template <class Quant>
  static __device__ __forceinline__ uint2 quantize(uint4 v, float inv) {
    return quantize8<Quant>(v, inv);
  }
};
template <>
struct Chunk<1> {
  using In = __nv_bfloat16;
  template <class Quant>
  using Out = typename Quant::Code;
  static __device__ __forceinline__ __nv_bfloat16 zero() { return __ushort_as_bfloat16(0); }
  static __device__ __forceinline__ float absmax(__nv_bfloat16 v, float m) {
    return fmaxf(m, fabsf(__bfloat162float(v)));
  }
  template <class Quant>
  static __device__ __forceinline__ typename Quant::Code quantize(__nv_bfloat16 v, float inv) {
    return Quant::code(__bfloat162float(v), inv);
  }
};

// Stages: load every chunk, reduce the absmax, store the scale, quantize and store the codes.
template <class Quant, int kWidth, int kPerThread, bool kWarpPerRow>
__global__ void __launch_bounds__(kMaxThreads)
    quant_v2_vec16_kernel(const __nv_bfloat16* __restrict__ x, typename Quant::Code* __restrict__ q,
                          float* __restrict__ scales, int64_t t, int d, float scale_ub) {
  using C = Chunk<kWidth>;
  const int lane_idx = threadIdx.x % 32;
  const int64_t row =
      kWarpPerRow ? int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
  const int rank = kWarpPerRow ? lane_idx : int(threadIdx.x);  // this thread's place in the row
  const int row_threads = kWarpPerRow ? 32 : int(blockDim.x);
  if (kWarpPerRow && row >= t) return;  // a whole warp, and nothing below waits for it
  const int chunks = d / kWidth;
  const auto* x_row = reinterpret_cast<const typename C::In*>(x + row * d);       // (T, d/kWidth)
  auto* q_row = reinterpret_cast<typename C::template Out<Quant>*>(q + row * d);  // (T, d/kWidth)
  // Load chunks rank + c·row_threads, c < kPerThread (C::zero() beyond the row), before anything
  // else; their absmax, reduced by warp_max (kWarpPerRow) or block_max; the scale, which rank 0
  // stores, and its inverse; quantize and store each chunk.
  // BEGIN SOLUTION: load, reduce, quantize, store
  typename C::In x_rg[kPerThread];
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int i = rank + c * row_threads;
    x_rg[c] = i < chunks ? x_row[i] : C::zero();
  }
  float absmax = 0.0f;
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) absmax = C::absmax(x_rg[c], absmax);
  if constexpr (kWarpPerRow) {
    absmax = warp_max(absmax);
  } else {
    __shared__ float red_sh[kMaxThreads / 32];
    absmax = block_max(absmax, red_sh);
  }
  const float scale = Quant::scale(absmax, scale_ub);
  const float inv = Quant::inverse(scale);
  if (rank == 0) scales[row] = scale;
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int i = rank + c * row_threads;
    if (i < chunks) q_row[i] = C::template quantize<Quant>(x_rg[c], inv);
  }
  // END SOLUTION
}

// A 16-byte load needs its address 16-byte aligned, so every row start must be: when d is not a
// multiple of 8 (or x or q is not aligned) the whole tensor takes the scalar path, the same
// kernel with one-element chunks. Rows are held in registers: d ≤ 32768 (scalar: ≤ 16384).
template <const QuantOp& kOp, class Quant>
Status quant_v2_vec16(const QuantArgs& a, cudaStream_t stream) {
  const bool vec = a.d % kVec == 0 && is_aligned(a.x, 16) && is_aligned(a.q, 8);
  Status s = validate_quant(kOp, a, {vec ? kMaxD : kMaxScalarD});
  if (!s.ok()) return s;
  auto* q = static_cast<typename Quant::Code*>(a.q);
  const int d = int(a.d);
  if (vec && d <= kWarpRowMaxD) {
    quant_v2_vec16_kernel<Quant, kVec, kChunks, true>
        <<<unsigned(ceil_div(a.t, kRowsPerBlock)), 32 * kRowsPerBlock, 0, stream>>>(
            a.x, q, a.scales, a.t, d, a.scale_ub);
  } else if (vec) {
    quant_v2_vec16_kernel<Quant, kVec, kChunks, false>
        <<<unsigned(a.t), round_up_to_warp(ceil_div(d / kVec, kChunks)), 0, stream>>>(
            a.x, q, a.scales, a.t, d, a.scale_ub);
  } else {
    quant_v2_vec16_kernel<Quant, 1, kScalarChunks, false>
        <<<unsigned(a.t), round_up_to_warp(ceil_div(d, kScalarChunks)), 0, stream>>>(
            a.x, q, a.scales, a.t, d, a.scale_ub);
  }
  return last_launch_status(kOp.name);
}

// ---------------------------------------------------------------------------------------------
// Per group: a half-warp per group, each lane one chunk of it.
constexpr int kGroupThreads = 256;
constexpr int kLanesPerGroup = kGroup / kVec;                   // 16
constexpr int kGroupsPerPass = kGroupThreads / kLanesPerGroup;  // 16 half-warps per block
constexpr int kGroupPasses = 4;                                 // groups per half-warp

__global__ void __launch_bounds__(kGroupThreads)
    per_group_v2_vec16_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ q,
                              float* __restrict__ scales, int64_t t, int64_t groups_per_row,
                              bool scales_row_major) {
  // Groups are numbered along memory: group g is elements 128g .. 128g + 127 of x, which is
  // row g / groups_per_row, group g % groups_per_row (d is a multiple of 128).
  const uint4* x_vec = reinterpret_cast<const uint4*>(x);  // (T·d/128, 16) chunks
  uint2* q_vec = reinterpret_cast<uint2*>(q);              // (T·d/128, 16)
  const int64_t n_groups = t * groups_per_row;
  const int lane = threadIdx.x % kLanesPerGroup;
  const int64_t first =
      blockIdx.x * int64_t(kGroupsPerPass * kGroupPasses) + threadIdx.x / kLanesPerGroup;
  // Load all kGroupPasses groups' chunks first (groups first + p·kGroupsPerPass); per group:
  // half_warp_max (in every lane, also past n_groups: the shuffle needs the whole warp), the
  // scale and its inverse, eight codes per lane; lane 0 stores the scale at group_scale_index of
  // (g % groups_per_row, row).
  // BEGIN SOLUTION: load the groups, then reduce, quantize and store each
  uint4 x_rg[kGroupPasses];
#pragma unroll
  for (int p = 0; p < kGroupPasses; ++p) {
    const int64_t g = first + p * kGroupsPerPass;
    x_rg[p] = g < n_groups ? x_vec[g * kLanesPerGroup + lane] : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int p = 0; p < kGroupPasses; ++p) {
    const int64_t g = first + p * kGroupsPerPass;
    const float scale = fp8_scale(half_warp_max(absmax8(x_rg[p], 0.0f)), kNoBound);
    const float inv = fp8_inverse(scale);
    if (g < n_groups) {
      q_vec[g * kLanesPerGroup + lane] = quantize8<Fp8>(x_rg[p], inv);
      if (lane == 0)
        scales[group_scale_index(g % groups_per_row, g / groups_per_row, t, groups_per_row,
                                 scales_row_major)] = scale;
    }
  }
  // END SOLUTION
}

Status per_group_v2_vec16(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kPerGroupFp8, a, {Limits{}.max_d, 16, 8});
  if (!s.ok()) return s;
  const int64_t groups_per_row = a.d / kGroup;
  const int64_t blocks = ceil_div(a.t * groups_per_row, kGroupsPerPass * kGroupPasses);
  per_group_v2_vec16_kernel<<<unsigned(blocks), kGroupThreads, 0, stream>>>(
      a.x, static_cast<uint8_t*>(a.q), a.scales, a.t, groups_per_row, a.scales_row_major);
  return last_launch_status(kPerGroupFp8.name);
}

// ---------------------------------------------------------------------------------------------
// Per tensor: the tensor as one flat array of n = T·d elements, n / 8 chunks and n % 8 left over.
constexpr int kTensorThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread
constexpr int kChunksPerBlock = kTensorThreads * kUnroll;

__global__ void __launch_bounds__(kTensorThreads)
    per_tensor_v2_absmax_kernel(const __nv_bfloat16* __restrict__ x, float* scale, int64_t n) {
  __shared__ float red_sh[kTensorThreads / 32];
  const uint4* x_vec = reinterpret_cast<const uint4*>(x);  // (n/8) chunks
  const int64_t n_vec = n / kVec;
  // A grid-stride loop over kChunksPerBlock chunks a block, kUnroll loads first, then their
  // absmax; block 0 adds the n % 8 tail elements; block_max; thread 0 merges the block's scale.
  // BEGIN SOLUTION: the grid-stride absmax and the merge
  float absmax = 0.0f;
  for (int64_t base = blockIdx.x * int64_t(kChunksPerBlock) + threadIdx.x; base < n_vec;
       base += int64_t(gridDim.x) * kChunksPerBlock) {
    uint4 x_rg[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kTensorThreads;
      x_rg[u] = i < n_vec ? x_vec[i] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) absmax = absmax8(x_rg[u], absmax);
  }
  const int64_t tail = n_vec * kVec + threadIdx.x;
  if (blockIdx.x == 0 && tail < n) absmax = fmaxf(absmax, fabsf(__bfloat162float(x[tail])));
  absmax = block_max(absmax, red_sh);
  if (threadIdx.x == 0) atomic_max_scale(scale, fp8_scale(absmax, kNoBound));
  // END SOLUTION
}

// Pass 2 reads x again. Pass 1 read the far end of the tensor last, so that end is what the L2
// still holds; blocks start roughly in index order, so block b takes slice gridDim − 1 − b, and
// the first re-reads hit L2 instead of DRAM.
__global__ void __launch_bounds__(kTensorThreads)
    per_tensor_v2_quantize_kernel(const __nv_bfloat16* __restrict__ x,
                                  const float* __restrict__ scale, uint8_t* __restrict__ q,
                                  int64_t n) {
  const uint4* x_vec = reinterpret_cast<const uint4*>(x);  // (n/8) chunks
  uint2* q_vec = reinterpret_cast<uint2*>(q);              // (n/8)
  const int64_t n_vec = n / kVec;
  const int64_t slice = gridDim.x - 1 - blockIdx.x;
  const int64_t base = slice * kChunksPerBlock + threadIdx.x;
  const float inv = fp8_inverse(*scale);
  // BEGIN SOLUTION: kUnroll loads, then quantize8 and store each; slice 0 takes the n % 8 tail
  uint4 x_rg[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + u * kTensorThreads;
    if (i < n_vec) x_rg[u] = x_vec[i];
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + u * kTensorThreads;
    if (i < n_vec) q_vec[i] = quantize8<Fp8>(x_rg[u], inv);
  }
  const int64_t tail = n_vec * kVec + threadIdx.x;
  if (slice == 0 && tail < n) q[tail] = Fp8::code(__bfloat162float(x[tail]), inv);
  // END SOLUTION
}

Status per_tensor_v2_vec16(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kPerTensorFp8, a, {Limits{}.max_d, 16, 8});
  if (!s.ok()) return s;
  int resident = 0;
  s = resident_blocks(per_tensor_v2_absmax_kernel, kTensorThreads, &resident);
  if (!s.ok()) return s;
  const int64_t n = a.t * a.d;
  const int64_t blocks = std::max<int64_t>(1, ceil_div(n / kVec, kChunksPerBlock));
  reset_kernel<<<1, 1, 0, stream>>>(a.scales);
  per_tensor_v2_absmax_kernel<<<unsigned(std::min<int64_t>(resident, blocks)), kTensorThreads, 0,
                                stream>>>(a.x, a.scales, n);
  per_tensor_v2_quantize_kernel<<<unsigned(blocks), kTensorThreads, 0, stream>>>(
      a.x, a.scales, static_cast<uint8_t*>(a.q), n);
  return last_launch_status(kPerTensorFp8.name);
}

// ---------------------------------------------------------------------------------------------
// SASS facts. The FP8 convert is F2FP on sm_89 and newer (sm_80 emulates it with integer code);
// the INT8 one, cvt.rni.sat.s8.f32, is a single F2I.S8 everywhere.
std::vector<SassFact> wide(const std::string& kernel, bool fp8) {
  const char* why = "16-byte loads, 8-byte stores, nothing spilled";
  std::vector<SassFact> facts{{kernel, {}, {"LDG.E.128", "STG.E.64"}, {}, true, why}};
  if (fp8)
    facts.push_back({kernel, {"sm_89", "sm_90a"}, {"F2FP"}, {}, true, "the hardware E4M3 cvt"});
  else
    facts.push_back({kernel, {}, {"F2I.S8"}, {}, true, "one saturating F2I.S8 per element"});
  return facts;
}
std::vector<SassFact> per_token_facts(const char* quant, bool fp8) {
  const std::string kernel = std::string("quant_v2_vec16_kernel*") + quant;
  const char* why = "the scalar path (d % 8 != 0): 2-byte loads, nothing spilled";
  std::vector<SassFact> facts = wide(kernel + "*Li8E", fp8);
  facts.push_back({kernel + "*Li1E", {}, {}, {"LDG.E.128"}, true, why});
  return facts;
}
std::vector<SassFact> per_tensor_facts() {
  std::vector<SassFact> facts{
      {"reset_kernel", {}, {}, {}, true, "one store"},
      {"per_tensor_v2_absmax_kernel", {}, {"LDG.E.128"}, {}, true, "16-byte loads"}};
  for (SassFact& f : wide("per_tensor_v2_quantize_kernel", true)) facts.push_back(f);
  return facts;
}

constexpr const char* kSummary = "16-byte loads, 8-byte stores, a warp per row up to d = 1024";
const Register kFp8Registered{quant_version(kPerTokenFp8, "v2_vec16", kSummary, per_token_fp8_vec16,
                                            per_token_facts("Fp8", true))};
const Register kInt8Registered{quant_version(kPerTokenInt8, "v2_vec16", kSummary,
                                             per_token_int8_vec16, per_token_facts("Int8", false))};
const Register kPerGroupRegistered{
    quant_version(kPerGroupFp8, "v2_vec16", "a half-warp per group, 16-byte loads, 8-byte stores",
                  per_group_v2_vec16, wide("per_group_v2_vec16_kernel", true))};
// The reset kernel runs first, so its fact comes first (the ncu pass matches kernels by order).
const Register kPerTensorRegistered{quant_version(
    kPerTensorFp8, "v2_vec16", "v0's three kernels with 16-byte accesses, pass 2 from the far end",
    per_tensor_v2_vec16, per_tensor_facts(), 3)};

}  // namespace

Status per_token_fp8_vec16(const QuantArgs& a, cudaStream_t stream) {
  return quant_v2_vec16<kPerTokenFp8, Fp8>(a, stream);
}
Status per_token_int8_vec16(const QuantArgs& a, cudaStream_t stream) {
  return quant_v2_vec16<kPerTokenInt8, Int8>(a, stream);
}

}  // namespace lkw::quant
