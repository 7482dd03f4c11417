// The casts of chapter 01 written with integer operations only, for host and device.
//
// These are what the cvt instructions do, spelled out: split the sign, exponent and mantissa,
// move the binary point, round to nearest even on the integer, saturate. v0_software_bits runs
// them on the GPU (it is also the path an sm_80 GPU, which has no FP8 cvt, must take); the host
// tests run them on every BF16 pattern and every FP8 code against the Python reference.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define LKW_HD __host__ __device__ __forceinline__
#else
#define LKW_HD inline
#endif

namespace lkw::formats {

LKW_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

LKW_HD float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// x >> shift, rounded to nearest, ties to even (shift in 1..31).
LKW_HD uint32_t shift_right_rne(uint32_t x, int shift) {
  // BEGIN SOLUTION: keep x >> shift; round up when the dropped bits exceed half, or equal half
  //   and the kept value is odd.
  // STUB: return 0;
  const uint32_t kept = x >> shift;
  const uint32_t dropped = x & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((dropped > half || (dropped == half && (kept & 1))) ? 1 : 0);
  // END SOLUTION
}

// FP32 → BF16 bits, round to nearest even. BF16 is the upper half of an FP32, so rounding adds
// 0x7FFF plus the lowest kept bit and truncates; NaN must not round into Inf, so it is quieted.
LKW_HD uint16_t f32_to_bf16_bits(float x) {
  // BEGIN SOLUTION: NaN → quiet NaN of the same sign; else add 0x7FFF + the lowest kept bit
  //   and keep the top 16 bits.
  // STUB: return 0;
  const uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  // END SOLUTION
}

LKW_HD float bf16_bits_to_f32(uint16_t b) { return f32_from_bits(uint32_t(b) << 16); }

// FP32 → an FP8 with kExpBits exponent bits and kManBits mantissa bits (bias 2^(E-1) - 1),
// round to nearest even, saturating to ±max_bits (the largest finite code) and keeping NaN.
// E4M3 (e4m3fn): bias 7, max 448 = 0x7E, NaN 0x7F. E5M2: bias 15, max 57344 = 0x7B, NaN 0x7F.
template <int kExpBits, int kManBits>
LKW_HD uint8_t f32_to_fp8_satfinite_bits(float x, uint32_t max_bits) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr int kShift = 23 - kManBits;        // mantissa bits dropped from FP32
  const uint32_t u = f32_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t mag = u & 0x7fffffffu;
  // BEGIN SOLUTION: NaN → 0x7F; |x| ≥ max → max; below the smallest FP8 normal, round the
  //   mantissa with its hidden 1 to a subnormal count; else re-bias the exponent and round
  //   away kShift bits.
  // STUB: return sign;
  if (mag > 0x7f800000u) return uint8_t(sign | 0x7f);
  // The largest finite FP8 value as an FP32 pattern; everything at or above it saturates.
  const uint32_t max_f32 =
      (uint32_t((max_bits >> kManBits) - kBias + 127) << 23) | ((max_bits & ((1u << kManBits) - 1)) << kShift);
  if (mag >= max_f32) return uint8_t(sign | max_bits);
  if (mag < 0x00800000u) return sign;  // FP32 zero or subnormal: far below the FP8 range
  const int exp = int(mag >> 23) - 127;
  if (exp < 1 - kBias) {
    // Subnormal FP8: value = m · 2^(1 - bias - M). The FP32 value is (2^23 + mantissa) ·
    // 2^(exp - 23), so the count m is that integer shifted right by (1 - bias - M) - (exp - 23).
    const int shift = (1 - kBias - kManBits) - (exp - 23);
    if (shift > 25) return sign;  // below half the smallest subnormal: rounds to zero
    return uint8_t(sign | shift_right_rne((mag & 0x7fffffu) | 0x800000u, shift));
  }
  // Normal: re-bias the exponent in place, then drop kShift mantissa bits with RNE. A carry out
  // of the mantissa moves into the exponent, which is exactly the right rounding.
  const uint32_t rebiased = (uint32_t(exp + kBias) << 23) | (mag & 0x7fffffu);
  return uint8_t(sign | shift_right_rne(rebiased, kShift));
  // END SOLUTION
}

LKW_HD uint8_t f32_to_e4m3_bits(float x) { return f32_to_fp8_satfinite_bits<4, 3>(x, 0x7e); }
LKW_HD uint8_t f32_to_e5m2_bits(float x) { return f32_to_fp8_satfinite_bits<5, 2>(x, 0x7b); }

// FP8 → BF16, exact, by the bit trick: move the exponent and mantissa bits to their FP32 places
// (the FP8 exponent field lands in the low bits of the FP32 exponent field), which reads as the
// value times 2^(bias_fp8 - 127); one multiply by 2^(127 - bias_fp8) corrects the bias and also
// normalizes FP8 subnormals. The special codes are patched separately.
LKW_HD uint16_t e4m3_to_bf16_bits(uint8_t q) {
  // BEGIN SOLUTION: bits 0..6 to bit 20 (mantissa top at bit 22), sign to bit 31; × 2^120;
  //   NaN (S.1111.111) → BF16 NaN.
  // STUB: return 0;
  const uint32_t sign = uint32_t(q & 0x80u) << 24;
  if ((q & 0x7fu) == 0x7fu) return uint16_t((sign >> 16) | 0x7fc0u);
  const float scaled = f32_from_bits(sign | (uint32_t(q & 0x7fu) << 20)) * 0x1p120f;
  return uint16_t(f32_bits(scaled) >> 16);  // exact: 3 mantissa bits fit in BF16's 7
  // END SOLUTION
}

LKW_HD uint16_t e5m2_to_bf16_bits(uint8_t q) {
  // BEGIN SOLUTION: E5M2 is the top byte of an FP16: bits 0..6 to bit 21, × 2^112;
  //   exponent all ones → Inf or NaN.
  // STUB: return 0;
  const uint32_t sign = uint32_t(q & 0x80u) << 24;
  if ((q & 0x7cu) == 0x7cu) {
    const bool is_nan = (q & 0x03u) != 0;
    return uint16_t((sign >> 16) | (is_nan ? 0x7fc0u : 0x7f80u));
  }
  const float scaled = f32_from_bits(sign | (uint32_t(q & 0x7fu) << 21)) * 0x1p112f;
  return uint16_t(f32_bits(scaled) >> 16);
  // END SOLUTION
}

}  // namespace lkw::formats
