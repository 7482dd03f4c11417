// v4_blockwise — DeepSeek's blockwise scales: each 128-k block's sum is scaled and promoted.
//
// Since v3: tensor and rowwise scales leave the sum and wait for the epilogue. Blockwise scales
// (A 1 × 128 per token, B 128 × 128) depend on the K block, so y = Σ_kb s_a[m, kb] s_b[n/128, kb]
// · (the block's FP8 sum), and the scaling moves into the loop. A stage is one K block (128 k, the
// swizzle's row), so each consumer runs the stage's four wgmmas into a fresh tensor-core sum,
// waits for them, hands the slot back, and adds sum × s_a·s_b into a second FP32 accumulator with
// the CUDA cores: two 64 × 128 accumulators a warpgroup, which is why the tile is 128 wide. That
// add is also "promotion": the tensor core keeps fewer bits than FP32 in its running sum (about
// 14, the model in lkw.fp8_gemm), and a sum that restarts every 128 k never grows long. Rowwise and
// tensor scales take the same path with block scale 1 (the trait `promote`; off, in the ablation
// ablation_v4_no_promotion, the whole K accumulates in the tensor core as in v3): the error against
// K is the chapter's promotion experiment.
// Expect: blockwise near v3's rowwise speed (the promotion FMAs hide under the other warpgroup's
// wgmmas); rowwise error flat in K with promotion, growing as sqrt(K) without. SASS as v3.
#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"
#include "schedule.cuh"

namespace lkw::fp8 {
namespace {

constexpr int kConsumers = 2;  // warpgroups, 64 rows of the tile each
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kBlockM = 64 * kConsumers, kBlockN = 128, kBlockK = kScaleBlock;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128·40 + 256·232 = 384·168, the launch's pool
static_assert(ptx::setmaxnreg_fits(128, kProducerRegs, 128 * kConsumers, kConsumerRegs),
              "the consumers would claim registers the producers never return: setmaxnreg.inc hangs");
constexpr int kABytes = kBlockM * kBlockK, kBBytes = kBlockN * kBlockK;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kStages = 6;

// The accumulation, a trait: each 128-k block promoted into FP32 (v4's point), or the whole K in
// the tensor core's sum (v3's, the ablation). Named types, so that the SASS facts can name them.
struct V4Promoted {
  static constexpr bool kOn = true;
};
struct V4WholeK {
  static constexpr bool kOn = false;
};

template <class Promotion>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_v4_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                  const GemmArgs a, const TileSchedule sched) {
  constexpr bool kPromote = Promotion::kOn;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full_sh[kStages], empty_sh[kStages];
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int k_tiles = int((a.k + kBlockK - 1) / kBlockK);
  auto a_tile = [&](int s) { return smem + s * kStageBytes; };
  auto b_tile = [&](int s) { return a_tile(s) + kABytes; };
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full_sh[s], 1);
      ptx::mbarrier_init(&empty_sh[s], 4 * kConsumers);  // one arrival per consumer warp
    }
  __syncthreads();

  if (group == 0) {
    // Producer: v3's.
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    int it = 0;
    for (int tile = blockIdx.x; tile < sched.count(); tile += gridDim.x) {
      int m0, n0;
      sched.origin(tile, &m0, &n0);
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        ptx::mbarrier_wait(&empty_sh[s], ((it / kStages) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(&full_sh[s], kStageBytes);
        ptx::tma_load_2d(a_tile(s), &a_map, kt * kBlockK, m0, &full_sh[s]);
        ptx::tma_load_2d(b_tile(s), &b_map, kt * kBlockK, n0, &full_sh[s]);
      }
    }
    return;
  }

  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int c = group - 1, g = lane / 4, t = lane % 4;
  float acc[kBlockN / 2] = {};    // the tensor core's running sum
  float total[kBlockN / 2] = {};  // the promoted FP32 sum (kPromote)
  int it = 0;
  for (int tile = blockIdx.x; tile < sched.count(); tile += gridDim.x) {
    int m0, n0;
    sched.origin(tile, &m0, &n0);
    const int64_t row = m0 + c * 64 + 16 * warp + g;
    if constexpr (kPromote) {
#pragma unroll
      for (int j = 0; j < kBlockN / 2; ++j) total[j] = 0.f;
    }
    ptx::wgmma_fence_operands(acc);
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      // The block's scales first: their loads fly while the stage is awaited.
      const float scale0 = kPromote ? block_scale(a, row, n0, kt) : 1.f;
      const float scale1 = kPromote ? block_scale(a, row + 8, n0, kt) : 1.f;
      // Wait: the slot's boxes landed.
      ptx::mbarrier_wait(&full_sh[s], (it / kStages) & 1);
      // Compute: promoted, every block's first k-step starts a fresh sum; otherwise the tile's.
      const uint64_t desc_a = ptx::wgmma_desc_k_major_sw128(a_tile(s) + c * 64 * 128);
      const uint64_t desc_b = ptx::wgmma_desc_k_major_sw128(b_tile(s));
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBlockK / 32; ++ks)
        ptx::wgmma_e4m3_ss<kBlockN>(acc, desc_a + 2 * ks, desc_b + 2 * ks, ks > 0 || (!kPromote && kt > 0));
      ptx::wgmma_commit();
      ptx::wgmma_fence_operands(acc);
      if constexpr (kPromote) {
        // All of this block's wgmmas retired: the slot goes back, the sum is promoted.
        ptx::wgmma_wait<0>();
        ptx::wgmma_fence_operands(acc);
        if (lane == 0) ptx::mbarrier_arrive(&empty_sh[s]);
        // BEGIN SOLUTION: add each sum times its row's block scale into total (accumulator j is
        //   row g + 8·((j / 2) % 2): scale0 for rows g, scale1 for rows g + 8)
#pragma unroll
        for (int j = 0; j < kBlockN / 2; ++j) total[j] = fmaf(acc[j], (j / 2) % 2 ? scale1 : scale0, total[j]);
        // END SOLUTION
      } else {
        // v3's: one group in flight, the previous stage released.
        ptx::wgmma_wait<1>();
        ptx::wgmma_fence_operands(acc);
        if (kt > 0 && lane == 0) ptx::mbarrier_arrive(&empty_sh[(it - 1) % kStages]);
      }
    }
    if constexpr (!kPromote) {
      ptx::wgmma_wait<0>();
      ptx::wgmma_fence_operands(acc);
      if (lane == 0) ptx::mbarrier_arrive(&empty_sh[(it - 1) % kStages]);
    }
    // Store: blockwise sums are scaled already; rowwise and tensor take their epilogue scales.
    if (a.granularity == Granularity::kBlockwise)
      store_wgmma_tile<kBlockN, false>(a, total, row, n0, t);
    else
      store_wgmma_tile<kBlockN>(a, kPromote ? total : acc, row, n0, t);
  }
}

template <class Promotion>
Status gemm_v4(const GemmArgs& a, cudaStream_t stream) {
  Status s = Promotion::kOn ? validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise, Granularity::kBlockwise},
                                      90, "v4_blockwise")
                      : validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise}, 90,
                                      "ablation_v4_no_promotion");
  if (!s.ok()) return s;
  CUtensorMap a_map, b_map;
  s = operand_maps(a, kBlockM, kBlockN, &a_map, &b_map);
  if (!s.ok()) return s;
  const TileSchedule sched = plan_tiles(a.m, a.n, kBlockM, kBlockN);
  return launch_with_smem(fp8_v4_kernel<Promotion>, dim3(persistent_grid(sched, a.max_blocks)), kThreads,
                          kStages * kStageBytes + 1024, stream, kOp, a_map, b_map, a, sched);
}

const SassFact kFacts{"V4Promoted", {"sm_90a"}, {"QGMMA", "UTMALDG", "SYNCS", "USETMAXREG"},
                      {"LDGSTS", "HMMA"}, true, "v3's machinery with the promotion FMAs; no spills"};
const SassFact kWholeKFacts{"V4WholeK", {"sm_90a"}, {"QGMMA", "UTMALDG", "SYNCS", "USETMAXREG"},
                            {"LDGSTS", "HMMA"}, true, "v3's loop in v4's kernel; no spills"};
constexpr const char* kSummary = "blockwise 1x128 / 128x128 scales, each K block promoted into FP32";
const Register kRegistered{
    gemm_version(kBlockwiseOp, "v4_blockwise", kSummary, gemm_v4<V4Promoted>, 90, {kFacts})};
const Register kRowwise{gemm_version(kOp, "v4_blockwise", kSummary, gemm_v4<V4Promoted>, 90, {kFacts})};
const Register kAblation{gemm_version(
    kOp, "ablation_v4_no_promotion", "v4 with promotion off: the whole K in the tensor core's sum",
    gemm_v4<V4WholeK>, 90, {kWholeKFacts}, Kind::kAblation)};

}  // namespace
}  // namespace lkw::fp8
