// v5_int8_prmt — UINT8 weights by byte permute into an FP16 with exponent 1024.
//
// Since v1 (int8_f16): instead of two I2F per pair, one PRMT lays out (b0, 0x64, b1, 0x64) —
// two FP16 values 1024 + b — and one HSUB2 of 1152 (= 1024 + 128, the bias) leaves b − 128.
// Natural order works here: the permute picks any bytes, so no repack is needed.
// Expect: no I2F; PRMT present.
#include "dequant.cuh"
#include "int4_dequant.cuh"

namespace lkw::int4 {
namespace {

struct Int8PrmtF16 {
  using Pair = half2;
  static constexpr int kPerWord = 4;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
    half2 q[2];
    u8_to_f16_magic(word, q);
    out[0] = __hmul2(q[0], s);
    out[1] = __hmul2(q[1], s);
  }
};

Status dequant_v5(const DequantArgs& a, cudaStream_t stream) {
  return launch_units<Int8PrmtF16>(kInt8F16, a, stream);
}

const Register kRegistered{dequant_version(
    kInt8F16, "v5_int8_prmt", "UINT8: PRMT into 0x64XX, HSUB2 1152", dequant_v5,
    {{"dequant_units_kernel*Int8PrmtF16", {}, {"PRMT"}, {"I2F", "I2FP"}, true,
      "byte permute, no integer→float convert"}})};

}  // namespace
}  // namespace lkw::int4
