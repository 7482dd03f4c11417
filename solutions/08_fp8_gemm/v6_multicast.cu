// v6_multicast — v5 in pairs of CTAs (a cluster of 2) that share their A tile: each loads half of
// it by TMA multicast into both, so one L2 read feeds two SMs.
//
// Since v5: a 128 × 128 tile's stage is 32 KB from L2 per 4 M FLOPs. At the tensor cores' FP8 rate
// that is more than L2 delivers to 132 SMs at once: v5's 128-wide tiles (blockwise) stall on the
// loads, not the math. Two CTAs that take the tiles side by side along N read the same 128 rows of
// A; in a cluster each loads 64 of them, multicast to both, and its own B: a pair's stage is 48 KB
// from L2 instead of 64. The price is coupling: a CTA's producer may write a stage only once both
// CTAs' consumers are done with it, so each consumer warp releases the stage in both rings (one
// remote mbarrier arrival), and a CTA leaves only after its partner's last release. The schedule
// is v5's with tiles as wide as the pair; rank r of a pair takes its r-th half.
// Expect: blockwise and other 128-wide plans faster by up to the L2 traffic saved (a quarter);
// 256-wide ones less (A is a third of their stage); small M, where B streams from HBM, about v5.
#include "07_w4a16_gemm/gemm_plan.h"
#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"
#include "schedule.cuh"

namespace lkw::fp8 {
namespace {

constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kBlockM = 64 * kConsumers, kBlockK = kScaleBlock;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
constexpr int kGroupM = 16;  // tile rows per band: 2048 rows of A in flight at most
constexpr int kPair = 2;     // CTAs per cluster, side by side along N

// The epilogue, v5's trait: each thread's pairs to y, or the tile staged and stored by TMA.
struct StoreDirect {
  static constexpr bool kTma = false;
};
struct StoreTma {
  static constexpr bool kTma = true;
};

template <int kBlockN, class Store>
struct Tile {
  static constexpr int kABytes = kBlockM * kBlockK, kBBytes = kBlockN * kBlockK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = kBlockN == 256 ? (Store::kTma ? 3 : 4) : 6;
  static constexpr int kStagingBytes = Store::kTma ? kBlockM * kBlockN * 2 : 0;  // BF16 y tile
  static constexpr int kSmemBytes = kStages * kStageBytes + kStagingBytes + 1024;  // + alignment
};

template <bool kPromote, int kBlockN, class Store>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_v6_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                  const __grid_constant__ CUtensorMap y_map, const GemmArgs a, const TileSchedule sched,
                  float* __restrict__ partials, unsigned* __restrict__ arrivals) {
  using T = Tile<kBlockN, Store>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full_sh[T::kStages], empty_sh[T::kStages];
  __shared__ bool last_sh;
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  // The pair: both CTAs walk the same units (clusters, not blocks, are the persistent workers);
  // rank r takes columns [n0 + r·kBlockN, +kBlockN) of the unit's double-width tile.
  const unsigned rank = ptx::cluster_ctarank();
  const int cluster = blockIdx.x / kPair, clusters = gridDim.x / kPair;
  auto a_tile = [&](int s) { return smem + s * T::kStageBytes; };
  auto b_tile = [&](int s) { return a_tile(s) + T::kABytes; };
  if (threadIdx.x == 0)
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(&full_sh[s], 1);
      ptx::mbarrier_init(&empty_sh[s], 4 * kConsumers * kPair);  // both CTAs' consumer warps
    }
  ptx::cluster_sync();  // the partner's barriers are initialized before anything reaches them

  if (group == 0) {
    // Producer: v5's, with A in halves. The stage is free once all consumer warps of the pair
    // released it (the partner's half of A lands here too); this CTA's half of A goes to both,
    // its B to itself, and the full barrier counts all of it: both halves, and B.
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    int it = 0;
    for (int unit = cluster; unit < sched.count(); unit += clusters) {
      int m0, n0, kb0, kb1;
      sched.origin(unit, &m0, &n0);
      sched.k_range(unit, &kb0, &kb1);
      for (int kt = kb0; kt < kb1; ++kt, ++it) {
        const int s = it % T::kStages;
        ptx::mbarrier_wait(&empty_sh[s], ((it / T::kStages) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(&full_sh[s], T::kStageBytes);
        ptx::tma_load_2d_multicast(a_tile(s) + rank * (T::kABytes / kPair), &a_map, kt * kBlockK,
                                   m0 + rank * (kBlockM / kPair), &full_sh[s], (1u << kPair) - 1);
        ptx::tma_load_2d(b_tile(s), &b_map, kt * kBlockK, n0 + rank * kBlockN, &full_sh[s]);
      }
    }
    // Leave only after the partner's consumers' last releases, which arrive on these barriers:
    // the wait each of the next kStages loads would make.
    for (int i = 0; i < T::kStages; ++i, ++it)
      ptx::mbarrier_wait(&empty_sh[it % T::kStages], ((it / T::kStages) & 1) ^ 1);
    return;
  }

  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int c = group - 1, g = lane / 4, t = lane % 4;
  float acc[kBlockN / 2] = {}, total[kBlockN / 2] = {};  // total: the promoted sums (blockwise)
  float(&sums)[kBlockN / 2] = kPromote ? total : acc;    // what the epilogue stores
  // Store: v4's, or staged: once this warpgroup's last store has read the staging (its issuer
  // waits, the others meet it at the barrier), the pairs go in, are fenced for the copy engine,
  // and the issuer stores the tile's 64-column boxes.
  auto store = [&](int unit, int n0, int64_t row) {
    if constexpr (Store::kTma) {
      unsigned char* const staging = smem + T::kStages * T::kStageBytes + c * (64 * kBlockN * 2);
      const bool issuer = threadIdx.x % 128 == 0;  // the warpgroup's thread that issues its stores
      if (issuer) ptx::bulk_wait_group_read<0>();
      ptx::named_barrier_sync(2 + c, 128);
      stage_wgmma_tile<kBlockN, !kPromote>(a, sums, staging, 16 * warp + g, row, n0, t);
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(2 + c, 128);
      if (issuer) {
        int m0, n0;
        sched.origin(unit, &m0, &n0);  // again: kept across the staging, they would spill
        n0 += rank * kBlockN;
#pragma unroll
        for (int b = 0; b < kBlockN / 64; ++b)
          ptx::tma_store_2d(&y_map, staging + b * (64 * 128), n0 + 64 * b, m0 + 64 * c);
        ptx::bulk_commit_group();
      }
    } else {
      store_wgmma_tile<kBlockN, !kPromote>(a, sums, row, n0, t);
    }
  };
  int it = 0;
  for (int unit = cluster; unit < sched.count(); unit += clusters) {
    int m0, n0, kb0, kb1;
    sched.origin(unit, &m0, &n0);
    sched.k_range(unit, &kb0, &kb1);
    // BEGIN SOLUTION: this CTA's columns: its rank's half of the unit's double-width tile (at an
    //   odd tile count, rank 1's last half lies past N: zeros in, nothing out, scales clamped)
    n0 += rank * kBlockN;
    // END SOLUTION
    const int64_t row = m0 + c * 64 + 16 * warp + g;
    // Load and compute: block kt's stage, once landed, through the four wgmmas of its 128 k into
    // acc (added to it, or a fresh sum), committed as one group.
    auto issue = [&](int s, bool accumulate) {
      ptx::mbarrier_wait(&full_sh[s], (it / T::kStages) & 1);
      const uint64_t desc_a = ptx::wgmma_desc_k_major_sw128(a_tile(s) + c * 64 * 128);
      const uint64_t desc_b = ptx::wgmma_desc_k_major_sw128(b_tile(s));
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBlockK / 32; ++ks)
        ptx::wgmma_e4m3_ss<kBlockN>(acc, desc_a + 2 * ks, desc_b + 2 * ks, ks > 0 || accumulate);
      ptx::wgmma_commit();
      ptx::wgmma_fence_operands(acc);
    };
    ptx::wgmma_fence_operands(acc);
    if constexpr (kPromote) {
#pragma unroll
      for (int j = 0; j < kBlockN / 2; ++j) total[j] = 0.f;
      // The blocks in pairs, each with its own pair of scales, loaded two blocks before their
      // promotion: a scale's load from L2 takes longer than one block's wgmmas.
      float even[2], odd[2];
      auto scales = [&](float (&sc)[2], int kt) {
        if (kt < kb1) sc[0] = block_scale(a, row, n0, kt), sc[1] = block_scale(a, row + 8, n0, kt);
      };
      auto step = [&](float (&sc)[2], int kt) {
        const int s = it % T::kStages;
        issue(s, false);  // a fresh sum each block: promotion
        ptx::wgmma_wait<0>();
        ptx::wgmma_fence_operands(acc);
        if (lane < kPair) ptx::mbarrier_arrive_cluster(&empty_sh[s], lane);  // both rings
#pragma unroll
        for (int j = 0; j < kBlockN / 2; ++j) total[j] = fmaf(acc[j], sc[(j / 2) % 2], total[j]);
        scales(sc, kt + 2);  // this pair's next block
        ++it;
      };
      scales(even, kb0);
      scales(odd, kb0 + 1);
      int kt = kb0;
      for (; kt + 1 < kb1; kt += 2) {
        step(even, kt);
        step(odd, kt + 1);
      }
      if (kt < kb1) step(even, kt);
    } else {
      // Tensor and rowwise scales: v3's loop, one wgmma group kept in flight across the blocks.
      for (int kt = kb0; kt < kb1; ++kt, ++it) {
        issue(it % T::kStages, kt > kb0);
        ptx::wgmma_wait<1>();
        ptx::wgmma_fence_operands(acc);
        if (kt > kb0 && lane < kPair) ptx::mbarrier_arrive_cluster(&empty_sh[(it - 1) % T::kStages], lane);
      }
      ptx::wgmma_wait<0>();
      ptx::wgmma_fence_operands(acc);
      if (lane < kPair) ptx::mbarrier_arrive_cluster(&empty_sh[(it - 1) % T::kStages], lane);
    }
    if (Store::kTma || sched.splits == 1) {  // the TMA store runs only where tiles are whole
      store(unit, n0, row);
      continue;
    }
    // Reduce (chapter 07's v5): this share's sums to its slice of the tile's partials, published
    // before the arrival; the last share to arrive adds the slices in share order and stores.
    const int tile = unit % sched.tiles() * kPair + int(rank), split = unit / sched.tiles(), tid = threadIdx.x - 128;
    float* slices = partials + int64_t(tile) * sched.splits * (kBlockM * kBlockN);  // (splits, threads, kBlockN / 2)
    // A warpgroup whose 64 rows all lie past M (at M <= 64, the tile's second half) has nothing to
    // keep: it writes no slice and reads none, and only meets the barriers.
    const bool live = m0 + 64 * c < a.m;
    if (live) {
#pragma unroll
      for (int j = 0; j < kBlockN / 2; j += 4)
        __stcg(reinterpret_cast<float4*>(slices + int64_t(split) * (kBlockM * kBlockN) + tid * (kBlockN / 2) + j),
               make_float4(sums[j], sums[j + 1], sums[j + 2], sums[j + 3]));
    }
    __threadfence();
    ptx::named_barrier_sync(1, 128 * kConsumers);  // every consumer's slice written and fenced
    if (tid == 0) last_sh = atomicAdd(&arrivals[tile], 1u) == unsigned(sched.splits - 1);  // v5's
    ptx::named_barrier_sync(1, 128 * kConsumers);
    if (!last_sh) continue;
    __threadfence();  // the other shares' slices, published before their arrivals, are read after
    if (tid == 0) arrivals[tile] = 0;  // re-armed for the next launch
    if (!live) continue;
#pragma unroll
    for (int j = 0; j < kBlockN / 2; ++j) sums[j] = 0.f;
    for (int sp = 0; sp < sched.splits; ++sp)
#pragma unroll
      for (int j = 0; j < kBlockN / 2; j += 4) {
        const float4 p = __ldcg(reinterpret_cast<const float4*>(
            slices + int64_t(sp) * (kBlockM * kBlockN) + tid * (kBlockN / 2) + j));
        sums[j] += p.x, sums[j + 1] += p.y, sums[j + 2] += p.z, sums[j + 3] += p.w;
      }
    store(unit, n0, row);
  }
  if (Store::kTma && threadIdx.x % 128 == 0) ptx::bulk_wait_group_read<0>();  // the staging outlives its reads
}

template <bool kPromote, int kBlockN, class Store>
Status launch_v6(const GemmArgs& a, const TileSchedule& sched, cudaStream_t stream) {
  using T = Tile<kBlockN, Store>;
  const auto kernel = fp8_v6_kernel<kPromote, kBlockN, Store>;
  if (Store::kTma && sched.splits != 1)
    return error(Code::kInvalidArgument, "v6: the TMA-store epilogue takes whole tiles only, not a split plan");
  CUtensorMap a_map, b_map, y_map{};
  Status s = operand_maps(a, kBlockM / kPair, kBlockN, &a_map, &b_map);  // A in halves
  if (s.ok() && Store::kTma) s = tensor_map_bf16_sw128(&y_map, a.y, a.m, a.n, 64);
  if (!s.ok()) return s;
  float* partials = nullptr;
  unsigned* arrivals = nullptr;
  if (sched.splits > 1) {
    const int64_t tiles = int64_t(sched.tiles()) * kPair;  // the CTAs' tiles
    s = w4a16::split_workspace(tiles * sched.splits * kBlockM * kBlockN, tiles, &partials, &arrivals);
    if (!s.ok()) return s;
  }
  // As many pairs as run at once (or fewer: units, max_blocks), each a persistent worker.
  int clusters = std::min(sched.count(), max_active_clusters(kernel, kPair, kThreads, T::kSmemBytes));
  if (a.max_blocks > 0) clusters = std::min(clusters, std::max(1, a.max_blocks / kPair));
  if (clusters < 1) return error(Code::kUnsupportedArch, "v6: this device runs no cluster of 2 of this kernel");
  return launch_cluster_with_smem(kernel, dim3(clusters * kPair), kPair, kThreads, T::kSmemBytes, stream, kOp,
                                  a_map, b_map, y_map, a, sched, partials, arrivals);
}

// v5's epilogue rule: TMA where each tile is whole, direct where tiles are split over K.
template <bool kPromote, int kBlockN>
Status launch_planned(const GemmArgs& a, const TileSchedule& sched, cudaStream_t stream) {
  return sched.splits == 1 ? launch_v6<kPromote, kBlockN, StoreTma>(a, sched, stream)
                           : launch_v6<kPromote, kBlockN, StoreDirect>(a, sched, stream);
}

Status gemm_v6(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise, Granularity::kBlockwise}, 90,
                           "v6_multicast");
  if (!s.ok()) return s;
  const bool blockwise = a.granularity == Granularity::kBlockwise;
  const TileSchedule sched = plan_v6(a.m, a.n, a.k, blockwise, sm_count(), kGroupM, kPair, w4a16::splits_for);
  if (blockwise) return launch_planned<true, 128>(a, sched, stream);
  return sched.block_n == 2 * 256 ? launch_planned<false, 256>(a, sched, stream)
                                  : launch_planned<false, 128>(a, sched, stream);
}

const SassFact kTmaFacts{"StoreTma", {"sm_90a"}, {"QGMMA", "UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG"},
                         {"LDGSTS", "HMMA"}, false, "v5's kernel in pairs: multicast A, remote releases"};
const SassFact kDirectFacts{"StoreDirect", {"sm_90a"}, {"QGMMA", "UTMALDG", "SYNCS", "USETMAXREG"},
                            {"LDGSTS", "HMMA"}, true, "v5's split-K kernel in pairs; no spills"};
constexpr const char* kSummary = "v5 in clusters of two CTAs sharing A by TMA multicast";
const Register kRegistered{gemm_version(kBlockwiseOp, "v6_multicast", kSummary, gemm_v6, 90,
                                        {kTmaFacts, kDirectFacts})};
const Register kRowwise{gemm_version(kOp, "v6_multicast", kSummary, gemm_v6, 90, {kTmaFacts, kDirectFacts})};

}  // namespace
}  // namespace lkw::fp8
