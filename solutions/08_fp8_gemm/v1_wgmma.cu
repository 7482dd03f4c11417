// v1_wgmma — Hopper's FP8 rate: the warpgroup MMA, both operands read from shared memory.
//
// Since v0: on sm_90a mma.sync E4M3 runs as converts and FP16 HMMA. wgmma.mma_async m64nNk32
// E4M3 multiplies a 64 × 32 A tile by a 32 × N B tile at the full FP8 rate, both read by the
// tensor core itself through shared-memory descriptors: no ldmatrix, no fragment registers. A
// block of two warpgroups owns a 128 × 128 tile of y, each warpgroup 64 rows (wgmma's M) by the
// 128 columns (its N). A stage is 128 k: one 128-byte row of the 128-byte swizzle per operand row,
// which is what the descriptor names (16-byte chunk c of row r sits at chunk c ^ (r % 8)); the
// cp.async pieces are written where the swizzle puts them, and fenced to the async proxy that
// wgmma reads through before the barrier that opens the stage. Four k32 wgmmas a stage, committed
// as one group and waited for before the next barrier (the slot they read is refilled after it).
// The scales stay in the epilogue, as in v0. Blockwise scales are refused (v4).
// Expect: several times v0 at large shapes; the loads are still issued by the same threads that
// wait for the tensor core (v2 hands them to TMA). SASS: QGMMA (FP8 wgmma), LDGSTS, no HMMA.
#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"

namespace lkw::fp8 {
namespace {

constexpr int kThreads = 256;  // two warpgroups, 64 rows of the tile each
constexpr int kBlockM = 128, kBlockN = 128;
constexpr int kBlockK = 128;   // bytes of k per stage: one 128-byte swizzle row
constexpr int kStages = 4;
constexpr int kTileBytes = kBlockM * kBlockK;  // one operand's stage (kBlockN == kBlockM)
constexpr int kStageBytes = 2 * kTileBytes;
static_assert(kTileBytes % 1024 == 0, "swizzle atoms (8 rows of 128 bytes) stay 1024-aligned");

// Stage kt of 128 rows of a K-major operand into a swizzled tile: piece c of row r (k = 128·kt +
// 16c..) to byte 128·r + 16·(c ^ (r % 8)); zeros past the matrix, which add nothing to the sums.
__device__ __forceinline__ void load_tile(unsigned char* tile_sh, const uint8_t* src, int64_t row0,
                                          int64_t rows_total, int64_t k, int kt) {
#pragma unroll
  for (int i = threadIdx.x; i < kBlockM * 8; i += kThreads) {
    // BEGIN SOLUTION: piece i is row i / 8, chunk i % 8; the swizzle moves the chunk, not the row
    const int r = i / 8, c = i % 8;
    const int64_t gr = row0 + r, gk = int64_t(kt) * kBlockK + 16 * c;
    const bool valid = gr < rows_total && gk < k;
    ptx::cp_async_16(tile_sh + r * 128 + 16 * (c ^ (r % 8)), valid ? src + gr * k + gk : src, valid);  // (rows, K)
    // END SOLUTION
  }
}

__global__ void __launch_bounds__(kThreads) fp8_v1_kernel(const GemmArgs a) {
  extern __shared__ unsigned char smem_raw[];
  // The descriptors' swizzle is applied on the full address: atoms must be 1024-aligned.
  unsigned char* const smem = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  const int g = lane / 4, t = lane % 4;
  const int64_t m0 = int64_t(blockIdx.y) * kBlockM, n0 = int64_t(blockIdx.x) * kBlockN;
  const int k_tiles = int((a.k + kBlockK - 1) / kBlockK);
  auto a_tile = [&](int kt) { return smem + (kt % kStages) * kStageBytes; };
  auto b_tile = [&](int kt) { return a_tile(kt) + kTileBytes; };
  auto load_stage = [&](int kt) {
    if (kt < k_tiles) {
      load_tile(a_tile(kt), a.a, m0, a.m, a.k, kt);
      load_tile(b_tile(kt), a.b, n0, a.n, a.k, kt);
    }
    ptx::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kBlockN / 2] = {};  // 64 × 128 FP32 over the warpgroup's 128 threads
  ptx::wgmma_fence_operands(acc);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_stage(s);

  for (int kt = 0; kt < k_tiles; ++kt) {
    // Wait: this thread's pieces of stage kt landed and are handed to the async proxy; the
    // barrier covers every thread's, and every warpgroup finished stage kt − 1 (it waited for
    // its wgmmas below), so that slot is refilled now.
    ptx::cp_async_wait<kStages - 2>();
    ptx::fence_proxy_async_shared();
    __syncthreads();
    load_stage(kt + kStages - 1);
    // Compute: warpgroup `group` takes rows 64·group.. of the A tile; k-step ks is 32 bytes
    // further along both tiles' rows (2 in the descriptors' 16-byte units).
    const uint64_t desc_a = ptx::wgmma_desc_k_major_sw128(a_tile(kt) + group * 64 * 128);
    const uint64_t desc_b = ptx::wgmma_desc_k_major_sw128(b_tile(kt));
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBlockK / 32; ++ks)
      ptx::wgmma_e4m3_ss<kBlockN>(acc, desc_a + 2 * ks, desc_b + 2 * ks, true);
    ptx::wgmma_commit();
    ptx::wgmma_fence_operands(acc);
    ptx::wgmma_wait<0>();
    ptx::wgmma_fence_operands(acc);
  }
  ptx::cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits

  // Store: accumulator j of a thread is row 16·warp + g + 8·((j / 2) % 2) of the warpgroup's 64,
  // column 8·(j / 4) + 2t + j % 2 (store_wgmma_tile); y = bf16(s_a · (s_b · acc)).
  store_wgmma_tile<kBlockN>(a, acc, m0 + group * 64 + 16 * warp + g, n0, t);
}

Status gemm_v1(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise}, 90, "v1_wgmma");
  if (!s.ok()) return s;
  const dim3 grid(unsigned((a.n + kBlockN - 1) / kBlockN), unsigned((a.m + kBlockM - 1) / kBlockM));
  return launch_with_smem(fp8_v1_kernel, grid, kThreads, kStages * kStageBytes + 1024, stream, kOp, a);
}

const Register kRegistered{gemm_version(
    kOp, "v1_wgmma", "wgmma m64n128k32 E4M3 from swizzled shared memory, cp.async ring", gemm_v1, 90,
    {{"fp8_v1_kernel", {"sm_90a"}, {"QGMMA", "LDGSTS"}, {"HMMA", "QMMA"}, true,
      "FP8 wgmma (QGMMA) reading both operands from shared memory"}})};

}  // namespace
}  // namespace lkw::fp8
