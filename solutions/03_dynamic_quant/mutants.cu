// Mutants of chapter 03, each a plausible slip that the golden cases must catch:
//   per_token_fp8/mutant_no_min_scale      scale = absmax / 448 without MIN_SCALE: the all-zero
//                                          row gets scale 0, inv = Inf and NaN codes
//                                          (per_token_fp8_zero_row_t5_d4096)
//   per_token_int8/mutant_truncate         a C++ cast, rounding toward zero, instead of rint
//                                          (every case)
//   per_group_fp8/mutant_row_major_scales  scales stored [T, d/128] instead of [d/128, T]
//                                          (every case with T > 1 and more than one group)
//   per_tensor_fp8/mutant_no_reset         the scale word is never reset, so the blocks merge
//                                          into whatever it held: the tests poison outputs with
//                                          0xFF bytes, the largest pattern (a NaN), so every
//                                          case catches it
// Each runs v0's kernels with the slip put in.
#include <algorithm>

#include "dynamic_quant.cuh"

namespace lkw::quant {
namespace {

constexpr int kThreads = 256;

struct Fp8WithoutMinScale : Fp8 {
  static __device__ __forceinline__ float scale(float absmax, float scale_ub) {
    return __fdiv_rn(scale_ub > 0.0f ? fminf(absmax, scale_ub) : absmax, kE4m3Max);
  }
};
struct Int8Truncated : Int8 {
  static __device__ __forceinline__ int8_t code(float x, float inv) {
    return static_cast<int8_t>(static_cast<int>(__fmul_rn(x, inv)));
  }
};

template <class Quant>
__global__ void __launch_bounds__(kThreads)
    mutant_per_token_kernel(const __nv_bfloat16* __restrict__ x,
                            typename Quant::Code* __restrict__ q, float* __restrict__ scales,
                            int64_t d, float scale_ub) {
  __shared__ float red_sh[kThreads / 32];
  const __nv_bfloat16* x_row = x + blockIdx.x * d;
  typename Quant::Code* q_row = q + blockIdx.x * d;
  float absmax = 0.0f;
  for (int64_t col = threadIdx.x; col < d; col += kThreads)
    absmax = fmaxf(absmax, fabsf(__bfloat162float(x_row[col])));
  absmax = block_max(absmax, red_sh);
  const float scale = Quant::scale(absmax, scale_ub);
  const float inv = Quant::inverse(scale);
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  for (int64_t col = threadIdx.x; col < d; col += kThreads)
    q_row[col] = Quant::code(__bfloat162float(x_row[col]), inv);
}

template <const QuantOp& kOp, class Quant>
Status mutant_per_token(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kOp, a);
  if (!s.ok()) return s;
  mutant_per_token_kernel<Quant><<<unsigned(a.t), kThreads, 0, stream>>>(
      a.x, static_cast<typename Quant::Code*>(a.q), a.scales, a.d, a.scale_ub);
  return last_launch_status(kOp.name);
}

__global__ void __launch_bounds__(kThreads)
    mutant_row_major_scales_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ q,
                                   float* __restrict__ scales, int64_t d) {
  const int warp_idx = threadIdx.x / 32, lane_idx = threadIdx.x % 32;
  const int64_t row = blockIdx.x, groups = d / kGroup;
  for (int64_t g = warp_idx; g < groups; g += kThreads / 32) {
    const __nv_bfloat16* x_group = x + row * d + g * kGroup;
    float absmax = 0.0f;
    for (int k = lane_idx; k < kGroup; k += 32)
      absmax = fmaxf(absmax, fabsf(__bfloat162float(x_group[k])));
    const float scale = fp8_scale(warp_max(absmax), kNoBound);
    const float inv = fp8_inverse(scale);
    if (lane_idx == 0) scales[row * groups + g] = scale;  // wrong: (T, d/128)
    for (int k = lane_idx; k < kGroup; k += 32)
      q[row * d + g * kGroup + k] = Fp8::code(__bfloat162float(x_group[k]), inv);
  }
}

Status mutant_row_major_scales(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kPerGroupFp8, a);
  if (!s.ok()) return s;
  mutant_row_major_scales_kernel<<<unsigned(a.t), kThreads, 0, stream>>>(
      a.x, static_cast<uint8_t*>(a.q), a.scales, a.d);
  return last_launch_status(kPerGroupFp8.name);
}

__global__ void __launch_bounds__(kThreads)
    mutant_absmax_kernel(const __nv_bfloat16* __restrict__ x, float* scale, int64_t n) {
  __shared__ float red_sh[kThreads / 32];
  float absmax = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    absmax = fmaxf(absmax, fabsf(__bfloat162float(x[i])));
  absmax = block_max(absmax, red_sh);
  if (threadIdx.x == 0) atomic_max_scale(scale, fp8_scale(absmax, kNoBound));
}

__global__ void __launch_bounds__(kThreads)
    mutant_quantize_kernel(const __nv_bfloat16* __restrict__ x, const float* __restrict__ scale,
                           uint8_t* __restrict__ q, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (i < n) q[i] = Fp8::code(__bfloat162float(x[i]), fp8_inverse(*scale));
}

Status mutant_no_reset(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kPerTensorFp8, a);
  if (!s.ok()) return s;
  int blocks = 0;
  s = resident_blocks(mutant_absmax_kernel, kThreads, &blocks);
  if (!s.ok()) return s;
  const int64_t n = a.t * a.d;
  mutant_absmax_kernel<<<unsigned(std::min<int64_t>(blocks, ceil_div(n, kThreads))), kThreads, 0,
                         stream>>>(a.x, a.scales, n);
  mutant_quantize_kernel<<<unsigned(ceil_div(n, kThreads)), kThreads, 0, stream>>>(
      a.x, a.scales, static_cast<uint8_t*>(a.q), n);
  return last_launch_status(kPerTensorFp8.name);
}

const Register kNoMinScale{quant_version(
    kPerTokenFp8, "mutant_no_min_scale", "no minimum scale: a zero row divides by zero",
    mutant_per_token<kPerTokenFp8, Fp8WithoutMinScale>, {}, 1, Kind::kMutant)};
const Register kTruncate{
    quant_version(kPerTokenInt8, "mutant_truncate", "INT8 codes rounded toward zero",
                  mutant_per_token<kPerTokenInt8, Int8Truncated>, {}, 1, Kind::kMutant)};
const Register kRowMajor{quant_version(kPerGroupFp8, "mutant_row_major_scales",
                                       "group scales stored [T, d/128]", mutant_row_major_scales,
                                       {}, 1, Kind::kMutant)};
const Register kNoReset{quant_version(kPerTensorFp8, "mutant_no_reset",
                                      "the scale word is never reset before the atomicMax",
                                      mutant_no_reset, {}, 2, Kind::kMutant)};

}  // namespace
}  // namespace lkw::quant
