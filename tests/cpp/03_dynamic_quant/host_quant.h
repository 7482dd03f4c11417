// The contract of reference/lkw/quant.py, written again in C++ for the host: the chapter's GPU
// tests compare against it on shapes the golden files do not carry (rows of 16384, 16384 rows,
// d not a multiple of 8), and a host test checks it against every golden case first.
// Host FP32 arithmetic is IEEE with round to nearest even, so each step rounds where the
// contract says; the E4M3 cast is chapter 01's integer version (formats_bits.cuh).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "01_formats/formats_bits.cuh"
#include "lkw/numeric.h"
#include "quant_math.cuh"

namespace lkw::quant::host {

struct Quantized {
  std::vector<uint8_t> q;     // [T, d]: E4M3 codes or int8 bytes
  std::vector<float> scales;  // [T], [1] or [d/128, T]
};

inline float fp8_scale(float absmax, float scale_ub) {
  const float a = scale_ub > 0.0f ? std::min(absmax, scale_ub) : absmax;
  return std::max(a / kE4m3Max, kMinScale);
}

inline uint8_t fp8_code(float x, float inv) { return formats::f32_to_e4m3_bits(x * inv); }

inline uint8_t int8_code(float x, float inv) {
  const float v = std::nearbyint(x * inv);  // the default rounding mode: half to even
  if (std::isnan(v)) return 0;
  return static_cast<uint8_t>(static_cast<int8_t>(std::clamp(v, -128.0f, 127.0f)));
}

// x: BF16 bits [T, d]. `op` is one of the chapter's four ops.
inline Quantized reference(const std::string& op, const std::vector<uint16_t>& x, int64_t t,
                           int64_t d, float scale_ub = 0.0f, bool scales_row_major = false) {
  auto value = [&](int64_t i) { return lkw::bf16_bits_to_f32(x[i]); };
  auto absmax = [&](int64_t begin, int64_t end) {
    float m = 0.0f;
    for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(value(i)));
    return m;
  };
  // Quantizes x[begin, end) with an FP8 scale, which it returns.
  Quantized r;
  r.q.resize(t * d);
  auto fp8_span = [&](int64_t begin, int64_t end, float scale) {
    const float inv = 1.0f / scale;
    for (int64_t i = begin; i < end; ++i) r.q[i] = fp8_code(value(i), inv);
    return scale;
  };
  if (op == "per_token_fp8") {
    for (int64_t row = 0; row < t; ++row)
      r.scales.push_back(
          fp8_span(row * d, row * d + d, fp8_scale(absmax(row * d, row * d + d), scale_ub)));
  } else if (op == "per_token_int8") {
    for (int64_t row = 0; row < t; ++row) {
      const float scale = absmax(row * d, row * d + d) / kInt8Max;
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (int64_t i = row * d; i < row * d + d; ++i) r.q[i] = int8_code(value(i), inv);
      r.scales.push_back(scale);
    }
  } else if (op == "per_tensor_fp8") {
    r.scales.push_back(fp8_span(0, t * d, fp8_scale(absmax(0, t * d), 0.0f)));
  } else if (op == "per_group_fp8") {
    const int64_t groups = d / 128;
    r.scales.resize(groups * t);
    for (int64_t row = 0; row < t; ++row)
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = row * d + g * 128;
        r.scales[scales_row_major ? row * groups + g : g * t + row] =  // (T, G) or (G, T)
            fp8_span(begin, begin + 128, fp8_scale(absmax(begin, begin + 128), 0.0f));
      }
  } else {
    throw std::invalid_argument("no host reference for op " + op);
  }
  return r;
}

// BF16 bits [T, d] like lkw.golden's activations: N(0, 1) samples, each row times 2^u with u
// uniform in [-4, 4] (rows of different magnitude, as real activations have).
inline std::vector<uint16_t> activations(std::mt19937& rng, int64_t t, int64_t d) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> spread(-4.0f, 4.0f);
  std::vector<uint16_t> x(t * d);
  for (int64_t row = 0; row < t; ++row) {
    const float magnitude = std::exp2(spread(rng));
    for (int64_t i = row * d; i < row * d + d; ++i)
      x[i] = formats::f32_to_bf16_bits(normal(rng) * magnitude);
  }
  return x;
}

}  // namespace lkw::quant::host
