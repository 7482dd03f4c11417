// v3_bf16_magic — the magic numbers for BF16: 0x4300 (128.0), one mask, shifts by 4.
//
// Since v2: BF16 keeps only 7 mantissa bits, so the FP16 trick of reading the high nibble as
// 1024 + 16q has no room (16·15 = 240 needs 8 bits above 128's ulp of 1). Each pair instead
// takes the low nibbles with the mask 0x000F000F after a shift by 4: four LOP3 and four subtracts
// of 136 (= 128 + 8) per word, then the scale.
// Expect: no I2F; LOP3 present; the same bytes as v2.
#include "dequant.cuh"
#include "int4_dequant.cuh"

namespace lkw::int4 {
namespace {

struct Int4MagicBf16 {
  using Pair = __nv_bfloat162;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, __nv_bfloat162 s, __nv_bfloat162,
                             __nv_bfloat162* out) const {
    __nv_bfloat162 q[4];
    u4_to_bf16_magic(word, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __hmul2(q[j], s);
  }
};

Status dequant_v3(const DequantArgs& a, cudaStream_t stream) {
  return launch_units<Int4MagicBf16>(kInt4iBf16, a, stream);
}

const Register kRegistered{dequant_version(
    kInt4iBf16, "v3_bf16_magic", "BF16 magic 0x4300: one mask, shifts by 4, sub 136",
    dequant_v3,
    {{"dequant_units_kernel*Int4MagicBf16", {}, {"LOP3", "STG.E.128"},
      {"I2F", "I2FP"}, true, "LOP3 unpack, no integer→float convert"}})};

}  // namespace
}  // namespace lkw::int4
