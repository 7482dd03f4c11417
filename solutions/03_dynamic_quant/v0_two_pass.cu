// v0_two_pass — find the absmax, then read x from global memory again to quantize it.
//
// The contract read literally. Per token: one block per row; each thread walks its strided
// share of the row (2-byte loads) for the absmax, the block reduces it (warp shuffles, one
// shared word per warp), thread 0 stores the scale, and every thread walks the row a second
// time, loading each element again to quantize it (1-byte stores). Per group: a warp per
// 1 × 128 group, the same two passes. Per tensor: three kernels in stream order — reset the
// scale word, absmax of the whole tensor into it (one atomicMax per block), quantize.
// Expect: twice the load instructions of v1, narrow accesses. A row is a few KB, so the second
// pass mostly hits L2 and DRAM bytes stay near the model (per tensor excepted: 64 MB of x no
// longer fits); the time does not. SASS: 2-byte loads only, no LDG.E.128.
#include <algorithm>

#include "dynamic_quant.cuh"

namespace lkw::quant {
namespace {

constexpr int kThreads = 256;

template <class Quant>
__global__ void __launch_bounds__(kThreads)
    quant_v0_two_pass_kernel(const __nv_bfloat16* __restrict__ x,
                             typename Quant::Code* __restrict__ q, float* __restrict__ scales,
                             int64_t d, float scale_ub) {
  __shared__ float red_sh[kThreads / 32];
  const __nv_bfloat16* x_row = x + blockIdx.x * d;   // (T, d)
  typename Quant::Code* q_row = q + blockIdx.x * d;  // (T, d)
  // Pass 1: the absmax (a strided loop, then block_max); the scale, which thread 0 stores, and its
  // inverse; pass 2: load each element again and quantize it.
  // BEGIN SOLUTION: the two passes over the row
  float absmax = 0.0f;
  for (int64_t col = threadIdx.x; col < d; col += kThreads)
    absmax = fmaxf(absmax, fabsf(__bfloat162float(x_row[col])));
  absmax = block_max(absmax, red_sh);
  const float scale = Quant::scale(absmax, scale_ub);
  const float inv = Quant::inverse(scale);
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  for (int64_t col = threadIdx.x; col < d; col += kThreads)
    q_row[col] = Quant::code(__bfloat162float(x_row[col]), inv);
  // END SOLUTION
}

template <const QuantOp& kOp, class Quant>
Status quant_v0_two_pass(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kOp, a);
  if (!s.ok()) return s;
  quant_v0_two_pass_kernel<Quant><<<unsigned(a.t), kThreads, 0, stream>>>(
      a.x, static_cast<typename Quant::Code*>(a.q), a.scales, a.d, a.scale_ub);
  return last_launch_status(kOp.name);
}

// Per group: warp w of the row's block takes groups w, w + 4, ...
constexpr int kGroupThreads = 128;

__global__ void __launch_bounds__(kGroupThreads)
    per_group_v0_two_pass_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ q,
                                 float* __restrict__ scales, int64_t t, int64_t d,
                                 bool scales_row_major) {
  const int warp_idx = threadIdx.x / 32, lane_idx = threadIdx.x % 32;
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x_row = x + row * d;  // (T, d)
  uint8_t* q_row = q + row * d;              // (T, d)
  // For each of this warp's groups: the absmax of its 128 elements (4 per lane, warp_max), the
  // scale stored at group_scale_index (column-major [g, row] by default), then load and quantize
  // the 128 elements again.
  // BEGIN SOLUTION: the group loop
  for (int64_t g = warp_idx; g < d / kGroup; g += kGroupThreads / 32) {
    const __nv_bfloat16* x_group = x_row + g * kGroup;
    float absmax = 0.0f;
    for (int k = lane_idx; k < kGroup; k += 32)
      absmax = fmaxf(absmax, fabsf(__bfloat162float(x_group[k])));
    const float scale = fp8_scale(warp_max(absmax), kNoBound);
    const float inv = fp8_inverse(scale);
    if (lane_idx == 0) scales[group_scale_index(g, row, t, d / kGroup, scales_row_major)] = scale;
    for (int k = lane_idx; k < kGroup; k += 32)
      q_row[g * kGroup + k] = Fp8::code(__bfloat162float(x_group[k]), inv);
  }
  // END SOLUTION
}

Status per_group_v0_two_pass(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kPerGroupFp8, a);
  if (!s.ok()) return s;
  per_group_v0_two_pass_kernel<<<unsigned(a.t), kGroupThreads, 0, stream>>>(
      a.x, static_cast<uint8_t*>(a.q), a.scales, a.t, a.d, a.scales_row_major);
  return last_launch_status(kPerGroupFp8.name);
}

// Per tensor, pass 1: a grid-stride absmax; each block merges its scale into *scale.
__global__ void __launch_bounds__(kThreads)
    per_tensor_v0_absmax_kernel(const __nv_bfloat16* __restrict__ x, float* scale, int64_t n) {
  __shared__ float red_sh[kThreads / 32];
  // BEGIN SOLUTION: grid-stride absmax, block_max, thread 0 merges the block's scale into *scale
  float absmax = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    absmax = fmaxf(absmax, fabsf(__bfloat162float(x[i])));
  absmax = block_max(absmax, red_sh);
  if (threadIdx.x == 0) atomic_max_scale(scale, fp8_scale(absmax, kNoBound));
  // END SOLUTION
}

// Pass 2: one element per thread, with the scale pass 1 left in *scale (stream order: pass 1
// has finished before any thread here reads it).
__global__ void __launch_bounds__(kThreads)
    per_tensor_v0_quantize_kernel(const __nv_bfloat16* __restrict__ x,
                                  const float* __restrict__ scale, uint8_t* __restrict__ q,
                                  int64_t n) {
  const int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  // BEGIN SOLUTION: guard i < n; quantize x[i] with the inverse of *scale.
  if (i < n) q[i] = Fp8::code(__bfloat162float(x[i]), fp8_inverse(*scale));
  // END SOLUTION
}

Status per_tensor_v0_two_pass(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kPerTensorFp8, a);
  if (!s.ok()) return s;
  int blocks = 0;
  s = resident_blocks(per_tensor_v0_absmax_kernel, kThreads, &blocks);
  if (!s.ok()) return s;
  const int64_t n = a.t * a.d;
  reset_kernel<<<1, 1, 0, stream>>>(a.scales);
  per_tensor_v0_absmax_kernel<<<unsigned(std::min<int64_t>(blocks, ceil_div(n, kThreads))),
                                kThreads, 0, stream>>>(a.x, a.scales, n);
  per_tensor_v0_quantize_kernel<<<unsigned(ceil_div(n, kThreads)), kThreads, 0, stream>>>(
      a.x, a.scales, static_cast<uint8_t*>(a.q), n);
  return last_launch_status(kPerTensorFp8.name);
}

SassFact narrow(const char* kernel) {
  return {kernel, {}, {}, {"LDG.E.128", "STG.E.64"}, true, "2-byte loads, 1-byte stores"};
}

constexpr const char* kSummary = "absmax pass, then a second global read to quantize";
const Register kPerTokenFp8Registered{quant_version(kPerTokenFp8, "v0_two_pass", kSummary,
                                                    quant_v0_two_pass<kPerTokenFp8, Fp8>,
                                                    {narrow("quant_v0_two_pass_kernel*Fp8")})};
const Register kPerTokenInt8Registered{quant_version(kPerTokenInt8, "v0_two_pass", kSummary,
                                                     quant_v0_two_pass<kPerTokenInt8, Int8>,
                                                     {narrow("quant_v0_two_pass_kernel*Int8")})};
const Register kPerGroupRegistered{
    quant_version(kPerGroupFp8, "v0_two_pass", "a warp per group: absmax, then a second read",
                  per_group_v0_two_pass, {narrow("per_group_v0_two_pass_kernel")})};
// The reset kernel runs first, so its fact comes first (the ncu pass matches kernels by order).
const Register kPerTensorRegistered{
    quant_version(kPerTensorFp8, "v0_two_pass",
                  "reset, absmax with one atomicMax per block, quantize", per_tensor_v0_two_pass,
                  {{"reset_kernel", {}, {}, {}, true, "one store"},
                   narrow("per_tensor_v0_absmax_kernel"),
                   narrow("per_tensor_v0_quantize_kernel")},
                  3)};

}  // namespace
}  // namespace lkw::quant
