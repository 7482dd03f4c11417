// v0_warp_per_column — the teaching kernel: one warp per output column, a word per lane.
//
// Warp n computes y[:, n] = x · W_hat[n, :]^T. Its 32 lanes stride along row n of the packed
// weights one 32-bit word (8 weights) at a time, so each warp-wide load reads 128 contiguous
// bytes. A lane unpacks its word with shifts, masks and integer→float converts (I2F), subtracts
// the bias 8, and multiplies with 8 activations (one 16-byte load per activation row) in FP32.
// The 8 weights of a word share one group (8 | G), so the scale is applied once per word, to
// the word's partial sum. At the end five shuffle steps add up the lanes' sums.
// Expect: the right answer at every M, far from the bound: 4-byte loads, one word in flight per
// lane, about 5 instructions per weight plus 2 per weight and row of x; SASS: an
// integer→float convert per weight (I2F on sm_80, I2FP on sm_89 and sm_90).
#include "int4_gemv.cuh"

namespace lkw::gemv {
namespace {

constexpr int kWarps = 4;  // columns per block

__global__ void __launch_bounds__(kWarps * 32, 8)
    gemv_v0_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                   const __nv_bfloat16* __restrict__ scales, __nv_bfloat16* __restrict__ y,
                   int m_rows, int64_t n, int64_t k, int group_shift) {
  const int lane = threadIdx.x % 32;
  const int64_t col = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (col >= n) return;  // the whole warp: the shuffles below need all 32 lanes
  const int64_t words = k / 8;
  const uint32_t* w_row = w + col * words;                       // (N, K/8)
  const __nv_bfloat16* s_row = scales + col * (k >> group_shift);  // (N, K/G)

  float acc[kMaxM] = {};
  // BEGIN SOLUTION: per word: load it and its group's scale, unpack 8 floats q − 8 (shift, mask, I2F), then per row m < M: 8 FMAs with x[m, 8i .. 8i+8) and one FMA by the scale.
  for (int64_t i = lane; i < words; i += 32) {
    const uint32_t packed = w_row[i];
    const float s = __bfloat162float(s_row[(8 * i) >> group_shift]);
    float q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = float(int((packed >> (4 * j)) & 0xfu)) - 8.0f;
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
      if (m >= m_rows) break;
      const uint4 xv = *reinterpret_cast<const uint4*>(x + m * k + 8 * i);  // (M, K)
      const uint32_t xp[4] = {xv.x, xv.y, xv.z, xv.w};
      float partial = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        partial = fmaf(q[2 * j], bf16_lo_to_f32(xp[j]), partial);
        partial = fmaf(q[2 * j + 1], bf16_hi_to_f32(xp[j]), partial);
      }
      acc[m] = fmaf(s, partial, acc[m]);
    }
  }
  // END SOLUTION
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) {
    if (m >= m_rows) break;
    const float sum = warp_sum(acc[m]);
    if (lane == 0) y[m * n + col] = __float2bfloat16_rn(sum);  // (M, N)
  }
}

Status gemv_v0(const GemvArgs& a, cudaStream_t stream) {
  Status s = validate_gemv(kInt4Gemv, a, 4);
  if (!s.ok()) return s;
  const unsigned blocks = unsigned((a.n + kWarps - 1) / kWarps);
  gemv_v0_kernel<<<blocks, kWarps * 32, 0, stream>>>(a.x, a.w, a.scales, a.y, int(a.m), a.n, a.k,
                                                     log2_of(a.group));
  return last_launch_status(kInt4Gemv.name);
}

const Register kRegistered{gemv_version(
    kInt4Gemv, "v0_warp_per_column", "warp per column, word per lane: shift, I2F, FP32 FMA",
    gemv_v0,
    // sm_80 converts with I2F; sm_89 and sm_90 have the faster I2FP for int32 → FP32.
    {{"gemv_v0_kernel", {"sm_80"}, {"I2F"}, {}, true, "the integer→float convert (I2F) per weight"},
     {"gemv_v0_kernel", {"sm_89", "sm_90a"}, {"I2FP"}, {}, true,
      "the integer→float convert (I2FP) per weight"}})};

}  // namespace
}  // namespace lkw::gemv
