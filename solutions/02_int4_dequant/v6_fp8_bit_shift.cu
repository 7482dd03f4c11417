// v6_fp8_bit_shift — FP8 E4M3 weights by moving bits, for GPUs without the FP8 cvt (sm_80).
//
// Since v1 (e4m3_*: hardware cvt): the sign stays, the 7 exponent+mantissa bits move to where
// FP16 (or the BF16/FP32 top half) keeps them, and one multiply by a power of two (2^8 for FP16,
// 2^120 for BF16) fixes the exponent bias. The result equals the cvt's for every finite code
// (E4M3's NaN is not a weight value). On sm_89/sm_90 it competes with one F2FP per pair.
// Expect: no F2FP.*E4M3 unpack instruction; PRMT + LOP3 + a multiply.
#include "dequant.cuh"
#include "int4_dequant.cuh"

namespace lkw::int4 {
namespace {

struct E4m3ShiftF16 {
  using Pair = half2;
  static constexpr int kPerWord = 4;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
    half2 v[2];
    e4m3_to_f16_shift(word, v);
    out[0] = __hmul2(v[0], s);  // v is exact, so the scale product rounds once
    out[1] = __hmul2(v[1], s);
  }
};
struct E4m3ShiftBf16 {
  using Pair = __nv_bfloat162;
  static constexpr int kPerWord = 4;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, __nv_bfloat162 s, __nv_bfloat162,
                             __nv_bfloat162* out) const {
    float v[4];
    e4m3_to_f32_shift(word, v);
    const float2 sf = __bfloat1622float2(s);
    out[0] = __floats2bfloat162_rn(v[0] * sf.x, v[1] * sf.y);  // exact products, one rounding
    out[1] = __floats2bfloat162_rn(v[2] * sf.x, v[3] * sf.y);
  }
};

template <const DequantOp& kOp, class Unpack>
Status dequant_v6(const DequantArgs& a, cudaStream_t stream) {
  return launch_units<Unpack>(kOp, a, stream);
}

constexpr const char* kSummary = "E4M3 by bit shift + power-of-two multiply";
const Register kRegisteredF16{dequant_version(
    kE4m3F16, "v6_fp8_bit_shift", kSummary, dequant_v6<kE4m3F16, E4m3ShiftF16>,
    {{"dequant_units_kernel*E4m3ShiftF16", {}, {"PRMT", "LOP3"}, {"F2FP"}, true,
      "bit moves, no FP8 convert instruction"}})};
const Register kRegisteredBf16{dequant_version(
    kE4m3Bf16, "v6_fp8_bit_shift", kSummary, dequant_v6<kE4m3Bf16, E4m3ShiftBf16>,
    {{"dequant_units_kernel*E4m3ShiftBf16", {}, {"PRMT", "LOP3"}, {}, true,
      "bit moves, no FP8 convert instruction"}})};

}  // namespace
}  // namespace lkw::int4
