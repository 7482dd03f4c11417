// Host-side bit helpers for the narrow formats: decode to float/double, order-preserving
// integer keys for ulp distances. These are for checking results; the kernels' own conversions
// are the subject of chapter 01 and live there.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "lkw/tensor.h"

namespace lkw {

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// BF16 is the top half of an FP32.
inline float bf16_bits_to_f32(uint16_t b) { return bits_to_f32(uint32_t(b) << 16); }

// A small float with E exponent bits, M mantissa bits and an IEEE-like layout. E4M3FN has no
// infinities and one NaN pattern per sign (all ones); E5M2 and FP16 have IEEE Inf/NaN.
inline double minifloat_to_f64(uint32_t bits, int E, int M, bool fn_variant) {
  const uint32_t sign = (bits >> (E + M)) & 1u;
  const uint32_t exp = (bits >> M) & ((1u << E) - 1);
  const uint32_t man = bits & ((1u << M) - 1);
  const int bias = (1 << (E - 1)) - 1;
  const uint32_t exp_max = (1u << E) - 1;
  double v;
  if (fn_variant && exp == exp_max && man == (1u << M) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (!fn_variant && exp == exp_max) {
    v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(double(man), 1 - bias - M);
  } else {
    v = std::ldexp(double(man | (1u << M)), int(exp) - bias - M);
  }
  return sign ? -v : v;
}

inline double f16_bits_to_f64(uint16_t b) { return minifloat_to_f64(b, 5, 10, false); }
inline double e4m3_bits_to_f64(uint8_t b) { return minifloat_to_f64(b, 4, 3, true); }
inline double e5m2_bits_to_f64(uint8_t b) { return minifloat_to_f64(b, 5, 2, false); }

// Element i of a host array of dtype t, as a double (integers exactly).
inline double element_as_f64(const void* data, DType t, int64_t i) {
  auto p = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::kF32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case DType::kF16: { uint16_t b; std::memcpy(&b, p + 2 * i, 2); return f16_bits_to_f64(b); }
    case DType::kBF16: { uint16_t b; std::memcpy(&b, p + 2 * i, 2); return bf16_bits_to_f32(b); }
    case DType::kE4M3: return e4m3_bits_to_f64(p[i]);
    case DType::kE5M2: return e5m2_bits_to_f64(p[i]);
    case DType::kI8: return static_cast<int8_t>(p[i]);
    case DType::kU8: return p[i];
    case DType::kI32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::kU32: { uint32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::kI64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return double(v); }
  }
  return 0;
}

// Raw bits of element i (zero-extended).
inline uint64_t element_bits(const void* data, DType t, int64_t i) {
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const uint8_t*>(data) + dtype_size(t) * i, dtype_size(t));
  return v;
}

// Maps the bits of a float format onto integers so that neighbouring values differ by one:
// |key(a) - key(b)| is the distance in ulps (+0 and -0 both map to 0).
inline int64_t ordered_key(uint64_t bits, DType t) {
  const int nbits = 8 * dtype_size(t);
  const uint64_t sign_bit = uint64_t(1) << (nbits - 1);
  const int64_t magnitude = static_cast<int64_t>(bits & (sign_bit - 1));
  return (bits & sign_bit) ? -magnitude : magnitude;
}

}  // namespace lkw
