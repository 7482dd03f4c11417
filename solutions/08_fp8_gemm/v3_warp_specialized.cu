// v3_warp_specialized — a producer warpgroup loads, two consumer warpgroups multiply, and each
// block stays resident and walks many tiles.
//
// Since v2: every stage began with a block-wide barrier, so the thread that issued TMA waited with
// the consumers, and a block's epilogue left the tensor core idle. Here the roles split. Warpgroup
// 0 is the producer: it gives most of its registers away (setmaxnreg.dec) and one thread issues
// the boxes as soon as a slot is free; warpgroups 1 and 2 claim them (setmaxnreg.inc) for 64 × 256
// FP32 accumulators each. Two barriers a slot replace __syncthreads: "full" (bytes landed, the
// consumers wait on it) and "empty" (each consumer warp arrives once its wgmmas on the slot are
// retired, the producer waits on it). The grid is one block per SM (persistent); a block takes
// tiles b, b + grid, ... (schedule.cuh), so while its consumers store one tile the producer
// already loads the next one's stages. Tile width 256 when the tiles fill the SMs, else 128.
// Blockwise scales are refused (v4).
// Expect: near the FP8 peak at large shapes. SASS: USETMAXREG, UTMALDG, QGMMA; no spills.
#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"
#include "schedule.cuh"

namespace lkw::fp8 {
namespace {

constexpr int kConsumers = 2;  // warpgroups, 64 rows of the tile each
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kBlockM = 64 * kConsumers, kBlockK = 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128·40 + 256·232 = 384·168, the launch's pool
static_assert(ptx::setmaxnreg_fits(128, kProducerRegs, 128 * kConsumers, kConsumerRegs),
              "the consumers would claim registers the producers never return: setmaxnreg.inc hangs");

template <int kBlockN>
struct Tile {
  static constexpr int kABytes = kBlockM * kBlockK, kBBytes = kBlockN * kBlockK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = kBlockN == 256 ? 4 : 6;  // ring of about 192 KB
};

template <int kBlockN>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_v3_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                  const GemmArgs a, const TileSchedule sched) {
  using T = Tile<kBlockN>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full_sh[T::kStages], empty_sh[T::kStages];
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int k_tiles = int((a.k + kBlockK - 1) / kBlockK);
  auto a_tile = [&](int s) { return smem + s * T::kStageBytes; };
  auto b_tile = [&](int s) { return a_tile(s) + T::kABytes; };
  if (threadIdx.x == 0)
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(&full_sh[s], 1);
      ptx::mbarrier_init(&empty_sh[s], 4 * kConsumers);  // one arrival per consumer warp
    }
  __syncthreads();

  if (group == 0) {
    // Producer. `it` counts stages over all of the block's tiles: slot it % kStages, pass
    // it / kStages; a fresh "empty" barrier passes the first wait (parity 1).
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    int it = 0;
    for (int tile = blockIdx.x; tile < sched.count(); tile += gridDim.x) {
      int m0, n0;
      sched.origin(tile, &m0, &n0);
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % T::kStages;
        ptx::mbarrier_wait(&empty_sh[s], ((it / T::kStages) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(&full_sh[s], T::kStageBytes);
        ptx::tma_load_2d(a_tile(s), &a_map, kt * kBlockK, m0, &full_sh[s]);
        ptx::tma_load_2d(b_tile(s), &b_map, kt * kBlockK, n0, &full_sh[s]);
      }
    }
    return;
  }

  // Consumers: warpgroup c = group − 1 takes rows 64·c.. of each tile.
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int c = group - 1, g = lane / 4, t = lane % 4;
  float acc[kBlockN / 2] = {};
  int it = 0;
  for (int tile = blockIdx.x; tile < sched.count(); tile += gridDim.x) {
    // The tile's first row and column, as the producer loaded it (schedule.cuh's order).
    int m0 = 0, n0 = 0;
    // BEGIN SOLUTION: tiles are numbered M-fastest: tile % tiles_m along M, tile / tiles_m along N
    m0 = (tile % sched.tiles_m) * kBlockM;
    n0 = (tile / sched.tiles_m) * kBlockN;
    // END SOLUTION
    ptx::wgmma_fence_operands(acc);
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int s = it % T::kStages;
      // Wait: the slot's boxes landed.
      ptx::mbarrier_wait(&full_sh[s], (it / T::kStages) & 1);
      // Compute: v2's four k32 steps; the tile's first step starts the sum (no zeroing).
      const uint64_t desc_a = ptx::wgmma_desc_k_major_sw128(a_tile(s) + c * 64 * 128);
      const uint64_t desc_b = ptx::wgmma_desc_k_major_sw128(b_tile(s));
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBlockK / 32; ++ks)
        ptx::wgmma_e4m3_ss<kBlockN>(acc, desc_a + 2 * ks, desc_b + 2 * ks, kt > 0 || ks > 0);
      ptx::wgmma_commit();
      ptx::wgmma_fence_operands(acc);
      ptx::wgmma_wait<1>();
      ptx::wgmma_fence_operands(acc);
      // Release: the previous stage's wgmmas are retired, its slot goes back to the producer.
      if (kt > 0 && lane == 0) ptx::mbarrier_arrive(&empty_sh[(it - 1) % T::kStages]);
    }
    ptx::wgmma_wait<0>();
    ptx::wgmma_fence_operands(acc);
    if (k_tiles > 0 && lane == 0) ptx::mbarrier_arrive(&empty_sh[(it - 1) % T::kStages]);
    // Store: straight from the registers, while the producer fills the next tile's stages.
    store_wgmma_tile<kBlockN>(a, acc, m0 + c * 64 + 16 * warp + g, n0, t);
  }
}

template <int kBlockN>
Status launch_v3(const GemmArgs& a, cudaStream_t stream) {
  CUtensorMap a_map, b_map;
  Status s = operand_maps(a, kBlockM, kBlockN, &a_map, &b_map);
  if (!s.ok()) return s;
  const TileSchedule sched = plan_tiles(a.m, a.n, kBlockM, kBlockN);
  using T = Tile<kBlockN>;
  return launch_with_smem(fp8_v3_kernel<kBlockN>, dim3(persistent_grid(sched, a.max_blocks)), kThreads,
                          T::kStages * T::kStageBytes + 1024, stream, kOp, a_map, b_map, a, sched);
}

Status gemm_v3(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise}, 90, "v3_warp_specialized");
  if (!s.ok()) return s;
  // 256-wide tiles halve the A traffic per FLOP, but only pay while they still fill the SMs.
  return block_n_for(a.m, a.n, false, sm_count()) == 256 ? launch_v3<256>(a, stream)
                                                          : launch_v3<128>(a, stream);
}

const Register kRegistered{gemm_version(
    kOp, "v3_warp_specialized", "producer warpgroup and two consumers, setmaxnreg, persistent tiles",
    gemm_v3, 90,
    {{"fp8_v3_kernel", {"sm_90a"}, {"QGMMA", "UTMALDG", "SYNCS", "USETMAXREG"}, {"LDGSTS", "HMMA"},
      true, "warp-specialized: registers moved by setmaxnreg, TMA loads, FP8 wgmma"}})};

}  // namespace
}  // namespace lkw::fp8
