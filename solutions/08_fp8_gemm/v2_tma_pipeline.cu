// v2_tma_pipeline — the tiles by TMA, counted in on mbarriers; one wgmma group left in flight.
//
// Since v1: every thread issued 8 cp.async pieces a stage, waited for its own, fenced them to the
// async proxy (a CTA-wide MEMBAR) and met the others at a barrier. The tensor-memory accelerator
// copies a whole box instead: one thread asks for the stage's A box (128 rows × 128 bytes) and B
// box, both written in the 128-byte swizzle the descriptors name, on the async proxy (no fence),
// and rows or k past the matrix arrive as zeros (the tails cost nothing). Completion is counted
// in bytes on the stage's mbarrier ("full"), which the consumers wait on. And the tensor core is
// no longer drained every stage: a warpgroup waits for all but its newest wgmma group, so stage
// kt − 1's multiplies still run while stage kt's are issued; loads run kStages − 2 stages ahead,
// so the slot refilled after the barrier is one every warpgroup has finished reading.
// Expect: a step over v1 at every large shape; what remains is the barrier each stage, where the
// loader thread waits with the consumers (v3 splits them). SASS: UTMALDG, SYNCS, QGMMA, no LDGSTS.
#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"

namespace lkw::fp8 {
namespace {

constexpr int kThreads = 256;  // two warpgroups, 64 rows of the tile each
constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 128;
constexpr int kStages = 6;
constexpr int kAhead = kStages - 2;  // stages loaded ahead: one slot may still be read by wgmma
constexpr int kTileBytes = kBlockM * kBlockK;
constexpr int kStageBytes = 2 * kTileBytes;

__global__ void __launch_bounds__(kThreads)
    fp8_v2_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                  const GemmArgs a) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full_sh[kStages];  // a slot's two boxes landed (one arrival and the bytes)
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  const int g = lane / 4, t = lane % 4;
  const int m0 = int(blockIdx.y) * kBlockM, n0 = int(blockIdx.x) * kBlockN;
  const int k_tiles = int((a.k + kBlockK - 1) / kBlockK);
  auto a_tile = [&](int kt) { return smem + (kt % kStages) * kStageBytes; };
  auto b_tile = [&](int kt) { return a_tile(kt) + kTileBytes; };
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(&full_sh[s], 1);
  __syncthreads();

  // Load (thread 0): both boxes of stage kt, counted on the slot's barrier.
  auto load_stage = [&](int kt) {
    if (threadIdx.x == 0 && kt < k_tiles) {
      int k0 = 0, a_row = 0, b_row = 0;  // a box's coordinates, in elements
      // BEGIN SOLUTION: stage kt's boxes start at k = 128·kt, A's at row m0, B's at row n0
      k0 = kt * kBlockK, a_row = m0, b_row = n0;
      // END SOLUTION
      uint64_t* bar = &full_sh[kt % kStages];
      ptx::mbarrier_arrive_expect_tx(bar, kStageBytes);
      ptx::tma_load_2d(a_tile(kt), &a_map, k0, a_row, bar);  // innermost coordinate first
      ptx::tma_load_2d(b_tile(kt), &b_map, k0, b_row, bar);
    }
  };

  float acc[kBlockN / 2] = {};
  ptx::wgmma_fence_operands(acc);
#pragma unroll
  for (int s = 0; s < kAhead; ++s) load_stage(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    // Wait: every warpgroup has retired stage kt − 2's wgmmas (each waited for all but its newest
    // group at kt − 1), so after the barrier that slot takes stage kt + kAhead.
    __syncthreads();
    load_stage(kt + kAhead);
    ptx::mbarrier_wait(&full_sh[kt % kStages], (kt / kStages) & 1);
    // Compute: v1's four k32 steps, committed as a group; one group stays in flight.
    const uint64_t desc_a = ptx::wgmma_desc_k_major_sw128(a_tile(kt) + group * 64 * 128);
    const uint64_t desc_b = ptx::wgmma_desc_k_major_sw128(b_tile(kt));
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBlockK / 32; ++ks)
      ptx::wgmma_e4m3_ss<kBlockN>(acc, desc_a + 2 * ks, desc_b + 2 * ks, true);
    ptx::wgmma_commit();
    ptx::wgmma_fence_operands(acc);
    ptx::wgmma_wait<1>();
    ptx::wgmma_fence_operands(acc);
  }
  ptx::wgmma_wait<0>();
  ptx::wgmma_fence_operands(acc);

  // Store: v1's epilogue.
  store_wgmma_tile<kBlockN>(a, acc, m0 + group * 64 + 16 * warp + g, n0, t);
}

Status gemm_v2(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise}, 90, "v2_tma_pipeline");
  if (!s.ok()) return s;
  CUtensorMap a_map, b_map;  // FP8 rows in boxes of 128 × 128 bytes, 128-byte swizzle
  s = operand_maps(a, kBlockM, kBlockN, &a_map, &b_map);
  if (!s.ok()) return s;
  const dim3 grid(unsigned((a.n + kBlockN - 1) / kBlockN), unsigned((a.m + kBlockM - 1) / kBlockM));
  return launch_with_smem(fp8_v2_kernel, grid, kThreads, kStages * kStageBytes + 1024, stream, kOp,
                          a_map, b_map, a);
}

const Register kRegistered{gemm_version(
    kOp, "v2_tma_pipeline", "TMA boxes counted on mbarriers, one wgmma group in flight", gemm_v2, 90,
    {{"fp8_v2_kernel", {"sm_90a"}, {"QGMMA", "UTMALDG", "SYNCS"}, {"LDGSTS", "HMMA"}, true,
      "TMA loads (UTMALDG) on mbarriers (SYNCS), FP8 wgmma"}})};

}  // namespace
}  // namespace lkw::fp8
