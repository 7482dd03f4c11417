// v0_software_bits — every cast by integer bit manipulation, one element per thread.
//
// The conversions of formats_bits.cuh run unchanged on the GPU: shifts, masks, an integer
// round-to-nearest-even and a compare for saturation. No conversion instruction is used, so this
// is the path for GPUs without FP8 cvt (sm_80) and the reference for what F2FP does in one step.
// Expect: correct everywhere, bit for bit; slower than v1 where the integer work shows.
// SASS: no F2FP (no hardware float conversion) and no local memory.
#include "formats.cuh"
#include "formats_bits.cuh"

namespace lkw::formats {
namespace {

struct F32ToBf16Sw {
  __device__ uint16_t operator()(float x) const { return f32_to_bf16_bits(x); }
};
struct Bf16ToF32Sw {
  __device__ float operator()(uint16_t b) const { return bf16_bits_to_f32(b); }
};
struct F32ToE4m3Sw {
  __device__ uint8_t operator()(float x) const { return f32_to_e4m3_bits(x); }
};
struct F32ToE5m2Sw {
  __device__ uint8_t operator()(float x) const { return f32_to_e5m2_bits(x); }
};
struct E4m3ToBf16Sw {
  __device__ uint16_t operator()(uint8_t q) const { return e4m3_to_bf16_bits(q); }
};
struct E5m2ToBf16Sw {
  __device__ uint16_t operator()(uint8_t q) const { return e5m2_to_bf16_bits(q); }
};

template <class In, class Out, class Cast>
__global__ void cast_v0_kernel(const In* __restrict__ src, Out* __restrict__ dst, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = Cast{}(src[i]);
}

template <const CastOp& kOp, class In, class Out, class Cast>
Status launch_v0(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  Status s = validate_cast(kOp, src, dst, n, 1, 1);
  if (!s.ok()) return s;
  constexpr int kThreads = 256;
  cast_v0_kernel<In, Out, Cast><<<blocks_for(n, 1, kThreads), kThreads, 0, stream>>>(
      static_cast<const In*>(src), static_cast<Out*>(dst), n);
  return last_launch_status(kOp.name);
}

// The promise of this version, for each of its kernels.
std::vector<SassFact> software_only(const char* functor) {
  return {{std::string("cast_v0_kernel*") + functor, {}, {}, {"F2FP", "F2F"}, true,
           "integer operations only: no conversion instruction"}};
}

constexpr const char* kSummary = "integer bit manipulation, one element per thread";

const Register kRegisteredF32ToBf16{cast_version(kF32ToBf16, "v0_software_bits", kSummary,
                                       launch_v0<kF32ToBf16, float, uint16_t, F32ToBf16Sw>,
                                       software_only("F32ToBf16Sw"))};
const Register kRegisteredBf16ToF32{cast_version(kBf16ToF32, "v0_software_bits", kSummary,
                                       launch_v0<kBf16ToF32, uint16_t, float, Bf16ToF32Sw>,
                                       software_only("Bf16ToF32Sw"))};
const Register kRegisteredF32ToE4m3{cast_version(kF32ToE4m3, "v0_software_bits", kSummary,
                                       launch_v0<kF32ToE4m3, float, uint8_t, F32ToE4m3Sw>,
                                       software_only("F32ToE4m3Sw"))};
const Register kRegisteredF32ToE5m2{cast_version(kF32ToE5m2, "v0_software_bits", kSummary,
                                       launch_v0<kF32ToE5m2, float, uint8_t, F32ToE5m2Sw>,
                                       software_only("F32ToE5m2Sw"))};
const Register kRegisteredE4m3ToBf16{cast_version(kE4m3ToBf16, "v0_software_bits", kSummary,
                                        launch_v0<kE4m3ToBf16, uint8_t, uint16_t, E4m3ToBf16Sw>,
                                        software_only("E4m3ToBf16Sw"))};
const Register kRegisteredE5m2ToBf16{cast_version(kE5m2ToBf16, "v0_software_bits", kSummary,
                                        launch_v0<kE5m2ToBf16, uint8_t, uint16_t, E5m2ToBf16Sw>,
                                        software_only("E5m2ToBf16Sw"))};

}  // namespace
}  // namespace lkw::formats
