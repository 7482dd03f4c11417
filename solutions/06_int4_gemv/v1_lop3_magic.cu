// v1_lop3_magic — chapter 02's magic-number unpack: no integer→float convert.
//
// Since v0: the weights come in the interleaved order, and a word unpacks with
// u4_to_bf16_magic (02_int4_dequant/dequant.cuh): four LOP3 put nibble pairs into the mantissa
// of 128.0, four packed subtracts of 136 leave (q − 8) as four exact BF16 pairs, in element
// order. BF16 pairs are exact for q − 8, but not for its products with x (8 + 4 significant
// bits do not fit BF16's 8), so the multiply-adds stay in FP32: each BF16 becomes an FP32 by a
// bit move (a shift or a mask), never by a convert instruction.
// Expect: the same memory behaviour as v0 and a few instructions per weight fewer, so a little
// faster; SASS: no I2F, LOP3 present.
#include "02_int4_dequant/dequant.cuh"
#include "int4_gemv.cuh"

namespace lkw::gemv {
namespace {

constexpr int kWarps = 4;

__global__ void __launch_bounds__(kWarps * 32, 8)
    gemv_v1_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                   const __nv_bfloat16* __restrict__ scales, __nv_bfloat16* __restrict__ y,
                   int m_rows, int64_t n, int64_t k, int group_shift) {
  const int lane = threadIdx.x % 32;
  const int64_t col = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (col >= n) return;
  const int64_t words = k / 8;
  const uint32_t* w_row = w + col * words;                         // (N, K/8)
  const __nv_bfloat16* s_row = scales + col * (k >> group_shift);  // (N, K/G)

  float acc[kMaxM] = {};
  for (int64_t i = lane; i < words; i += 32) {
    const uint32_t packed = w_row[i];
    const float s = bf16_to_f32(s_row[(8 * i) >> group_shift]);
    // BEGIN SOLUTION: unpack the word with int4::u4_to_bf16_magic (four exact pairs of q − 8), turn the 8 BF16 into FP32 by bit moves, then the same FMAs as v0.
    __nv_bfloat162 pairs[4];
    int4::u4_to_bf16_magic(packed, pairs);
    float q[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      q[2 * j] = bf16_lo_to_f32(bits_of(pairs[j]));
      q[2 * j + 1] = bf16_hi_to_f32(bits_of(pairs[j]));
    }
    // STUB: float q[8] = {};
    // END SOLUTION
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
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) {
    if (m >= m_rows) break;
    const float sum = warp_sum(acc[m]);
    if (lane == 0) y[m * n + col] = __float2bfloat16_rn(sum);  // (M, N)
  }
}

Status gemv_v1(const GemvArgs& a, cudaStream_t stream) {
  Status s = validate_gemv(kInt4iGemv, a, 4);
  if (!s.ok()) return s;
  const unsigned blocks = unsigned((a.n + kWarps - 1) / kWarps);
  gemv_v1_kernel<<<blocks, kWarps * 32, 0, stream>>>(a.x, a.w, a.scales, a.y, int(a.m), a.n, a.k,
                                                     log2_of(a.group));
  return last_launch_status(kInt4iGemv.name);
}

const Register kRegistered{gemv_version(
    kInt4iGemv, "v1_lop3_magic", "magic unpack (LOP3, BF16 128 + q): no I2F; FP32 FMA", gemv_v1,
    {{"gemv_v1_kernel", {}, {"LOP3"}, {"I2F", "I2FP"}, true,
      "LOP3 unpack, no integer→float convert"}})};

}  // namespace
}  // namespace lkw::gemv
