// v1_vec16 — 16-byte stores of 8 weights at a time, the same per-element arithmetic as v0.
//
// Since v0: a thread converts units of 8 weights (one INT4 word or two 8-bit words in, 16 bytes
// out), two units a thread at a stride of the block size (int4_dequant.cuh says why that
// layout), reading each unit's scale once. The weight loads are 4 or 8 bytes per thread but
// contiguous across the warp, so each load instruction still moves whole lines; the output,
// four times wider, is what must be written 16 bytes at a time. The arithmetic is unchanged —
// one I2F (or one hardware cvt for FP8) per element — which is what v2.. remove next.
// Expect: far closer to the bound than v0; SASS: STG.E.128 and I2F.
#include <cuda_fp8.h>

#include "int4_dequant.cuh"

namespace lkw::int4 {
namespace {

// INT4, natural order: element j of the word is bits 4j..4j+3.
struct Int4ShiftF16 {
  using Pair = half2;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
    // BEGIN SOLUTION: for each pair j: nibbles 2j and 2j+1 → I2F → minus 8 → times the scale.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q0 = (word >> (8 * j)) & 0xf, q1 = (word >> (8 * j + 4)) & 0xf;
      out[j] = __hmul2(__halves2half2(__int2half_rn(q0 - 8), __int2half_rn(q1 - 8)), s);
    }
    // END SOLUTION
  }
};
struct Int4ShiftBf16 {
  using Pair = __nv_bfloat162;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, __nv_bfloat162 s, __nv_bfloat162,
                             __nv_bfloat162* out) const {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q0 = (word >> (8 * j)) & 0xf, q1 = (word >> (8 * j + 4)) & 0xf;
      out[j] = __hmul2(__halves2bfloat162(__int2bfloat16_rn(q0 - 8), __int2bfloat16_rn(q1 - 8)), s);
    }
  }
};
// UINT8 with bias 128.
struct Int8ConvertF16 {
  using Pair = half2;
  static constexpr int kPerWord = 4;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b0 = (word >> (16 * j)) & 0xff, b1 = (word >> (16 * j + 8)) & 0xff;
      out[j] = __hmul2(__halves2half2(__int2half_rn(b0 - 128), __int2half_rn(b1 - 128)), s);
    }
  }
};
// FP8 E4M3 by the hardware cvt (sm_89+; cuda_fp8.h emulates it on sm_80).
struct E4m3CvtF16 {
  using Pair = half2;
  static constexpr int kPerWord = 4;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
    out[0] = __hmul2(half2(__nv_cvt_fp8x2_to_halfraw2(word & 0xffff, __NV_E4M3)), s);
    out[1] = __hmul2(half2(__nv_cvt_fp8x2_to_halfraw2(word >> 16, __NV_E4M3)), s);
  }
};
struct E4m3CvtBf16 {
  using Pair = __nv_bfloat162;
  static constexpr int kPerWord = 4;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, __nv_bfloat162 s, __nv_bfloat162,
                             __nv_bfloat162* out) const {
    // FP8 → FP16 (exact) → FP32; the scale product is exact in FP32; one rounding to BF16.
    const float2 sf = __bfloat1622float2(s);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float2 v = __half22float2(half2(__nv_cvt_fp8x2_to_halfraw2(word >> (16 * j), __NV_E4M3)));
      out[j] = __floats2bfloat162_rn(v.x * sf.x, v.y * sf.y);
    }
  }
};

template <const DequantOp& kOp, class Unpack>
Status dequant_v1(const DequantArgs& a, cudaStream_t stream) {
  return launch_units<Unpack>(kOp, a, stream);
}

std::vector<SassFact> wide(const char* unpack, std::vector<std::string> must) {
  must.push_back("STG.E.128");
  return {{std::string("dequant_units_kernel*") + unpack, {}, must, {}, true,
           "16-byte stores; the convert is still there"}};
}

constexpr const char* kSummary = "16-byte stores of 8 weights, per-element convert";
const Register kRegisteredInt4F16{dequant_version(kInt4F16, "v1_vec16", kSummary,
                                                  dequant_v1<kInt4F16, Int4ShiftF16>,
                                                  wide("Int4ShiftF16", {"I2F"}))};
const Register kRegisteredInt4Bf16{dequant_version(kInt4Bf16, "v1_vec16", kSummary,
                                                   dequant_v1<kInt4Bf16, Int4ShiftBf16>,
                                                   wide("Int4ShiftBf16", {"I2F"}))};
const Register kRegisteredInt8{dequant_version(kInt8F16, "v1_vec16", kSummary,
                                               dequant_v1<kInt8F16, Int8ConvertF16>,
                                               wide("Int8ConvertF16", {"I2F"}))};
const Register kRegisteredE4m3F16{dequant_version(kE4m3F16, "v1_vec16", kSummary,
                                                  dequant_v1<kE4m3F16, E4m3CvtF16>,
                                                  wide("E4m3CvtF16", {}))};
const Register kRegisteredE4m3Bf16{dequant_version(kE4m3Bf16, "v1_vec16", kSummary,
                                                   dequant_v1<kE4m3Bf16, E4m3CvtBf16>,
                                                   wide("E4m3CvtBf16", {}))};

}  // namespace
}  // namespace lkw::int4
