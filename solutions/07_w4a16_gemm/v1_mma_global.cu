// v1_mma_global — the tensor cores, fed straight from global memory.
//
// Since v0: one kernel, and the weights never exist in BF16 outside registers. y = x · W^T is the
// mma's A·B with A = x (tokens are rows, row-major, as mma wants) and B = W^T, whose "col" layout
// is W's own row-major [N, K]: a lane's B fragment of an n8-tile is two pairs of consecutive k of
// one output channel (k = 2t, 2t + 1 and 2t + 8, 2t + 9, channel g). In the natural packing those
// are nibbles 2t and 2t + 1 of two neighbouring words: one 8-byte load per n8-tile and k-step, a
// byte of each word unpacked with the 128 + q magic (no convert; the bias 128 + z leaves q − z) and
// scaled in BF16 (W_hat rounded to BF16, as cuBLAS on v0's copy). A block is 4 warps × 64 channels
// by 16·kMTiles tokens.
// Expect: far fewer bytes than v0, but every load is small and the four lanes of a quad read the
// same 8 bytes; no data reuse across warps. Slower than the bound at every M: the next versions
// fix the feeding, not the math. SASS: HMMA, no I2F.
#include "w4a16_gemm.cuh"
#include "lkw/ptx.cuh"

namespace lkw::w4a16 {
namespace {

template <int kMTiles>
__global__ void __launch_bounds__(kWarps * 32)
    gemm_v1_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                   const __nv_bfloat16* __restrict__ scales, const uint8_t* __restrict__ zeros,
                   __nv_bfloat16* __restrict__ y, int64_t m, int64_t n, int64_t k,
                   int group_shift) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = blockIdx.x * int64_t(kBlockN) + warp * kWarpN;  // this warp's 64 channels
  const int64_t m0 = blockIdx.y * int64_t(16 * kMTiles);
  if (n0 >= n) return;  // N is a multiple of 64: a warp is wholly in or out
  const int64_t words = k / 8;
  float acc[kMTiles][kNTiles][4] = {};

  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    // Load A: a lane's pairs of x (rows g and g + 8 of each m16 tile), zero past M.
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int64_t r0 = m0 + 16 * mt + g, r1 = r0 + 8;
      const uint32_t* x0 = reinterpret_cast<const uint32_t*>(x + r0 * k + k0) + t;  // (M, K)
      const uint32_t* x1 = reinterpret_cast<const uint32_t*>(x + r1 * k + k0) + t;
      a[mt][0] = r0 < m ? x0[0] : 0u;
      a[mt][1] = r1 < m ? x1[0] : 0u;
      a[mt][2] = r0 < m ? x0[4] : 0u;
      a[mt][3] = r1 < m ? x1[4] : 0u;
    }
    const int64_t group_idx = k0 >> group_shift;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      // Load B: words k0/8 and k0/8 + 1 of channel n0 + 8j + g hold k0 .. k0 + 15.
      const int64_t col = n0 + 8 * j + g;
      const uint2 wd = *reinterpret_cast<const uint2*>(w + col * words + k0 / 8);  // (N, K/8)
      const __nv_bfloat162 s2 = scale_pair(scales, group_idx, col, n);
      const uint32_t bias = zero_bias_at(zeros, group_idx, col, n);
      // BEGIN SOLUTION: byte t of each word is this lane's pair (k = 2t, 2t + 1 and + 8): its
      //   q − z pair (the bias), times the scale.
      const uint32_t b0 = bits_of(__hmul2(nibble_pair_minus_zero(wd.x >> (8 * t), bias), s2));
      const uint32_t b1 = bits_of(__hmul2(nibble_pair_minus_zero(wd.y >> (8 * t), bias), s2));
      // STUB: const uint32_t b0 = 0, b1 = 0;
      // END SOLUTION
      // Compute: the same B fragment for every m16 tile.
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) ptx::mma_bf16_16816(acc[mt][j], a[mt], b0, b1);
    }
  }

  // Store: each accumulator tile to y in BF16 pairs.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) store_c(y, acc[mt][j], m0 + 16 * mt + g, n0 + 8 * j + 2 * t, m, n);
}

template <int kMTiles>
struct LaunchV1 {
  static Status run(const GemmArgs& a, cudaStream_t stream) {
    const dim3 grid(unsigned((a.n + kBlockN - 1) / kBlockN), unsigned((a.m + 16 * kMTiles - 1) / (16 * kMTiles)));
    gemm_v1_kernel<kMTiles><<<grid, kWarps * 32, 0, stream>>>(
        a.x, a.w, a.scales, a.zeros, a.y, a.m, a.n, a.k, group_shift_of(a.group, a.k));
    return last_launch_status(kW4a16Gemm.name);
  }
};

Status gemm_v1(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16Gemm, a);
  if (!s.ok()) return s;
  return launch_by_m<LaunchV1>(a, stream);
}

const Register kRegistered{gemm_version(
    kW4a16Gemm, "v1_mma_global", "mma.sync m16n8k16, x and the INT4 weights straight from global", gemm_v1,
    {{"gemm_v1_kernel", {}, {"HMMA"}, {"I2F", "I2FP"}, true, "tensor cores, no integer→float convert"}})};

}  // namespace
}  // namespace lkw::w4a16
