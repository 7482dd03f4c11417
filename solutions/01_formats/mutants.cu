// Mutants of chapter 01: plausible wrong casts. Each must fail at least one golden case.
//   f32_to_bf16/mutant_truncate       drops the low half instead of rounding (wrong rounding)
//   f32_to_bf16/mutant_nan_rounds     rounds NaN like a number: some NaNs carry into -0 / Inf
//   f32_to_e4m3/mutant_no_satfinite   cvt without saturation: beyond 448 becomes NaN
//   e4m3_to_bf16/mutant_skips_tail    the vector body only: the last n % 16 elements unwritten
#include "formats.cuh"
#include "formats_bits.cuh"

namespace lkw::formats {
namespace {

struct Truncate {
  __device__ uint16_t operator()(float x) const { return uint16_t(f32_bits(x) >> 16); }
};
struct NanRounds {
  __device__ uint16_t operator()(float x) const {
    const uint32_t u = f32_bits(x);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};
struct NoSatfinite {
  __device__ uint8_t operator()(float x) const {
    return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3);
  }
};

template <class In, class Out, class Cast>
__global__ void cast_mutant_kernel(const In* src, Out* dst, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = Cast{}(src[i]);
}

__global__ void e4m3_to_bf16_no_tail_kernel(const uint8_t* src, uint16_t* dst, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n / 16 * 16) dst[i] = e4m3_to_bf16_bits(src[i]);
}

template <const CastOp& kOp, class In, class Out, class Cast>
Status launch_mutant(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  Status s = validate_cast(kOp, src, dst, n, 1, 1);
  if (!s.ok()) return s;
  cast_mutant_kernel<In, Out, Cast><<<blocks_for(n, 1, 256), 256, 0, stream>>>(
      static_cast<const In*>(src), static_cast<Out*>(dst), n);
  return last_launch_status(kOp.name);
}

Status launch_no_tail(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  Status s = validate_cast(kE4m3ToBf16, src, dst, n, 16, 16);
  if (!s.ok()) return s;
  e4m3_to_bf16_no_tail_kernel<<<blocks_for(n, 1, 256), 256, 0, stream>>>(
      static_cast<const uint8_t*>(src), static_cast<uint16_t*>(dst), n);
  return last_launch_status("e4m3_to_bf16_no_tail_kernel");
}

const Register kTruncate{cast_version(kF32ToBf16, "mutant_truncate", "truncates instead of RNE",
                                      launch_mutant<kF32ToBf16, float, uint16_t, Truncate>, {},
                                      Kind::kMutant)};
const Register kNanRounds{cast_version(kF32ToBf16, "mutant_nan_rounds", "rounds NaN like a number",
                                       launch_mutant<kF32ToBf16, float, uint16_t, NanRounds>, {},
                                       Kind::kMutant)};
const Register kNoSat{cast_version(kF32ToE4m3, "mutant_no_satfinite", "no saturation: NaN above 448",
                                   launch_mutant<kF32ToE4m3, float, uint8_t, NoSatfinite>, {},
                                   Kind::kMutant)};
const Register kNoTail{cast_version(kE4m3ToBf16, "mutant_skips_tail", "skips the n % 16 tail",
                                    launch_no_tail, {}, Kind::kMutant)};

}  // namespace
}  // namespace lkw::formats
