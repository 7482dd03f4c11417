// Mutants of chapter 08, each a plausible slip the golden cases must catch
// (tests/cpp/golden_main.cu runs each on every case of its op and wants at least one failure):
//   fp8_gemm_blockwise/mutant_scale_next_block  K block kb takes the scales of block kb + 1
//   fp8_gemm_blockwise/mutant_no_promotion      the whole K summed in the tensor core, then scaled
//                                               once with the last block's scales
//   fp8_gemm_blockwise/mutant_no_full_wait      the consumers skip the "full" barrier: a stage is
//                                               read before (or while) its boxes land
//   fp8_gemm_blockwise/mutant_swizzle_64b       the descriptors name the 64-byte swizzle while TMA
//                                               wrote the 128-byte one
// One kernel, v2's ring (TMA, full barriers, a block barrier a stage) with v4's promotion, the slip
// chosen at compile time.
#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"

namespace lkw::fp8 {
namespace {

enum class Slip { kScaleNextBlock, kNoPromotion, kNoFullWait, kSwizzle64 };

constexpr int kThreads = 256, kBlockM = 128, kBlockN = 128, kBlockK = kScaleBlock;
constexpr int kStages = 4, kTileBytes = kBlockM * kBlockK, kStageBytes = 2 * kTileBytes;

template <Slip kSlip>
__global__ void __launch_bounds__(kThreads)
    mutant_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                  const GemmArgs a) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full_sh[kStages];
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  const int g = lane / 4, t = lane % 4;
  const int m0 = int(blockIdx.y) * kBlockM, n0 = int(blockIdx.x) * kBlockN;
  const int k_tiles = int(a.k / kBlockK);
  const int64_t row = m0 + group * 64 + 16 * warp + g;
  auto a_tile = [&](int kt) { return smem + (kt % kStages) * kStageBytes; };
  auto b_tile = [&](int kt) { return a_tile(kt) + kTileBytes; };
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(&full_sh[s], 1);
  if constexpr (kSlip == Slip::kNoFullWait) {
    // The ring starts as E4M3 NaN (0x7F), so a stage read before its boxes land shows as NaN
    // instead of as whatever the previous launch left there; the fence orders these generic
    // stores before the TMA writes of the async proxy.
    for (int i = threadIdx.x; i < kStages * kStageBytes / 16; i += kThreads)
      reinterpret_cast<uint4*>(smem)[i] = make_uint4(0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu);
    ptx::fence_proxy_async_shared();
  }
  __syncthreads();
  auto load_stage = [&](int kt) {
    if (threadIdx.x == 0 && kt < k_tiles) {
      ptx::mbarrier_arrive_expect_tx(&full_sh[kt % kStages], kStageBytes);
      ptx::tma_load_2d(a_tile(kt), &a_map, kt * kBlockK, m0, &full_sh[kt % kStages]);
      ptx::tma_load_2d(b_tile(kt), &b_map, kt * kBlockK, n0, &full_sh[kt % kStages]);
    }
  };
  // The 64-byte swizzle's layout code (2) where the 128-byte one's (1) belongs, bits 62..63.
  auto desc = [](const void* tile) {
    const uint64_t d = ptx::wgmma_desc_k_major_sw128(tile);
    return kSlip == Slip::kSwizzle64 ? (d & ~(uint64_t(3) << 62)) | (uint64_t(2) << 62) : d;
  };

  float acc[kBlockN / 2] = {}, total[kBlockN / 2] = {};
  ptx::wgmma_fence_operands(acc);
  for (int s = 0; s < kStages - 1; ++s) load_stage(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    __syncthreads();  // everyone retired stage kt − 1 (wait<0> below): its slot is refilled
    load_stage(kt + kStages - 1);
    if constexpr (kSlip != Slip::kNoFullWait) ptx::mbarrier_wait(&full_sh[kt % kStages], (kt / kStages) & 1);
    const uint64_t desc_a = desc(a_tile(kt) + group * 64 * 128), desc_b = desc(b_tile(kt));
    ptx::wgmma_fence();
    for (int ks = 0; ks < kBlockK / 32; ++ks)
      ptx::wgmma_e4m3_ss<kBlockN>(acc, desc_a + 2 * ks, desc_b + 2 * ks,
                                  ks > 0 || (kSlip == Slip::kNoPromotion && kt > 0));
    ptx::wgmma_commit();
    ptx::wgmma_fence_operands(acc);
    ptx::wgmma_wait<0>();
    ptx::wgmma_fence_operands(acc);
    // The slip waits after the reads, so that the ring's phases stay sound for the refills.
    if constexpr (kSlip == Slip::kNoFullWait) ptx::mbarrier_wait(&full_sh[kt % kStages], (kt / kStages) & 1);
    if constexpr (kSlip != Slip::kNoPromotion) {
      const int kb = kSlip == Slip::kScaleNextBlock ? (kt + 1) % k_tiles : kt;
      const float s0 = block_scale(a, row, n0, kb), s1 = block_scale(a, row + 8, n0, kb);
      for (int j = 0; j < kBlockN / 2; ++j) total[j] = fmaf(acc[j], (j / 2) % 2 ? s1 : s0, total[j]);
    }
  }
  if constexpr (kSlip == Slip::kNoPromotion) {
    const float s0 = block_scale(a, row, n0, k_tiles - 1), s1 = block_scale(a, row + 8, n0, k_tiles - 1);
    for (int j = 0; j < kBlockN / 2; ++j) total[j] = acc[j] * ((j / 2) % 2 ? s1 : s0);
  }
  store_wgmma_tile<kBlockN, false>(a, total, row, n0, t);
}

template <Slip kSlip>
Status run_mutant(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(a, {Granularity::kBlockwise}, 90, "the mutants");
  if (!s.ok()) return s;
  CUtensorMap a_map, b_map;
  s = operand_maps(a, kBlockM, kBlockN, &a_map, &b_map);
  if (!s.ok()) return s;
  const dim3 grid(unsigned((a.n + kBlockN - 1) / kBlockN), unsigned((a.m + kBlockM - 1) / kBlockM));
  return launch_with_smem(mutant_kernel<kSlip>, grid, kThreads, kStages * kStageBytes + 1024, stream,
                          kBlockwiseOp, a_map, b_map, a);
}

Version mutant(const char* id, const char* summary, GemmLaunch launch) {
  return gemm_version(kBlockwiseOp, id, summary, launch, 90, {}, Kind::kMutant);
}

const Register kNextBlock{mutant("mutant_scale_next_block", "K block kb scaled by block kb + 1's scales",
                                 run_mutant<Slip::kScaleNextBlock>)};
const Register kNoPromotion{mutant("mutant_no_promotion", "no promotion: one sum, the last block's scales",
                                   run_mutant<Slip::kNoPromotion>)};
const Register kNoFullWait{mutant("mutant_no_full_wait", "stages read without waiting for their boxes",
                                  run_mutant<Slip::kNoFullWait>)};
const Register kSwizzle64{mutant("mutant_swizzle_64b", "descriptors name the 64-byte swizzle",
                                 run_mutant<Slip::kSwizzle64>)};

}  // namespace
}  // namespace lkw::fp8
