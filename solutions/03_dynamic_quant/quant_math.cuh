// The per-element and per-row arithmetic of dynamic quantization, shared by every chapter that
// quantizes activations: 03 (standalone quant), 04 (fused add + RMSNorm + quant), 08 (FP8 GEMM).
// It is the device half of reference/lkw/quant.py's contract and rounds exactly where that file
// says — each function names its rounding with an _rn intrinsic, so no -use_fast_math or FMA
// contraction can move a bit:
//
//   FP8:  scale = max(fp32(min(absmax, ub) / 448), MIN_SCALE), inv = fp32(1 / scale),
//         q = e4m3_satfinite(fp32(x · inv))
//   INT8: scale = fp32(absmax / 127), inv = fp32(1 / scale) or 0 when scale == 0,
//         q = sat_s8(rint(fp32(x · inv)))
//
// Absmax is exact in any order (max is associative), so the reductions are free to be shaped
// however a kernel likes; only these few lines have to agree bit for bit between kernels.
#pragma once
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lkw::quant {

constexpr float kE4m3Max = 448.0f;
constexpr float kInt8Max = 127.0f;
// vLLM's minimum FP8 scale, 1 / (448 · 512): an all-zero row gets a finite scale, never 0/0.
// 229376 is a power-of-two multiple of 7, so the quotient is the RN FP32 division's result.
constexpr float kMinScale = 1.0f / 229376.0f;

// FP8 scale of one row (or group, or tensor). `scale_ub` ≤ 0 means "no upper bound"; with one,
// the absmax is clamped before the division, as vLLM does.
__device__ __forceinline__ float fp8_scale(float absmax, float scale_ub) {
  const float a = scale_ub > 0.0f ? fminf(absmax, scale_ub) : absmax;
  return fmaxf(__fdiv_rn(a, kE4m3Max), kMinScale);
}

// INT8 scale: no minimum, so an all-zero row stores 0.
__device__ __forceinline__ float int8_scale(float absmax) { return __fdiv_rn(absmax, kInt8Max); }

// The reciprocal every element is multiplied by (computed once per row).
__device__ __forceinline__ float fp8_inverse(float scale) { return __frcp_rn(scale); }
__device__ __forceinline__ float int8_inverse(float scale) {
  return scale > 0.0f ? __frcp_rn(scale) : 0.0f;  // 1/0 · 0 would be NaN
}

// Two values → two E4M3 codes (low byte = a): the product rounded to FP32 first (__fmul_rn
// forbids contraction into anything else), then one cvt.rn.satfinite.e4m3x2.f32 on sm_89+
// (cuda_fp8.h emulates the same rounding on sm_80).
__device__ __forceinline__ uint16_t quantize_e4m3x2(float a, float b, float inv) {
  const float2 v = make_float2(__fmul_rn(a, inv), __fmul_rn(b, inv));
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3));
}

// cvt.rni.sat.s8.f32: round half to even and saturate to [-128, 127] in one instruction (the
// C++ route, __float2int_rn and a clamp, is three). Why inline PTX: there is no intrinsic for
// the saturating 8-bit form.
__device__ __forceinline__ int8_t cvt_rni_sat_s8(float v) {
  uint32_t r;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(v));
  return static_cast<int8_t>(r & 0xff);
}
__device__ __forceinline__ int8_t quantize_int8(float x, float inv) {
  return cvt_rni_sat_s8(__fmul_rn(x, inv));
}

// Max over a warp of non-negative values (every lane gets it).
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

}  // namespace lkw::quant
