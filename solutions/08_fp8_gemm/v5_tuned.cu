// v5_tuned — v4 planned per shape: split K where the tiles cannot fill the SMs, tiles in L2 bands.
//
// Since v4: at M = 64 or 128 (decode, the DeepSeek shapes' small M) there is one row of tiles, so
// N = 2112 makes 17 tiles for 132 SMs and each block streams 128 rows of B alone: the GEMM is
// memory-bound and most of the memory system idles. v5 splits each tile's K blocks into shares
// (chapter 07's splits_for: as many as fill the SMs, at least 4 blocks each); a unit of work is
// (tile, share), and the shares of a tile meet as chapter 07's v5 does: each writes its FP32 sums
// to its own slice, counts in, and the last to arrive adds the slices in share order (the same sum
// in every run) and stores the tile. At large M the blocks walk the tiles in bands of kGroupM tile
// rows (schedule.cuh), so the A rows and B columns in flight at once stay in L2. Tile width:
// blockwise 128 (two accumulators), else 256 while the tiles fill the SMs. Rowwise and tensor
// scales accumulate the whole share in the tensor core (v3's), blockwise ones are promoted (v4's)
// with each block's scales loaded two blocks ahead (one block's wgmmas are shorter than a load).
// Expect: small M several times v4; large shapes a few per cent from the bands. The epilogue, a
// trait: unsplit tiles staged in shared memory and stored by TMA, split ones stored directly.
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
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128·40 + 256·232 = 384·168, the launch's pool
static_assert(setmaxnreg_fits(128, kProducerRegs, 128 * kConsumers, kConsumerRegs),
              "the consumers would claim registers the producers never return: setmaxnreg.inc hangs");
constexpr int kGroupM = 16;  // tile rows per band: 2048 rows of A in flight at most

// The epilogue, a trait (named types, so that the SASS facts can name them): each thread's pairs
// to y (v4's), or the tile staged in shared memory and stored by TMA, the stage's room taken from
// the ring (a 256-wide tile keeps 3 stages instead of 4).
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
    fp8_v5_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                  const __grid_constant__ CUtensorMap y_map, const GemmArgs a, const TileSchedule sched,
                  float* __restrict__ partials, unsigned* __restrict__ arrivals) {
  using T = Tile<kBlockN, Store>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full_sh[T::kStages], empty_sh[T::kStages];
  __shared__ bool last_sh;
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  auto a_tile = [&](int s) { return smem + s * T::kStageBytes; };
  auto b_tile = [&](int s) { return a_tile(s) + T::kABytes; };
  if (threadIdx.x == 0)
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(&full_sh[s], 1);
      ptx::mbarrier_init(&empty_sh[s], 4 * kConsumers);
    }
  __syncthreads();

  if (group == 0) {
    // Producer: v4's, over the unit's share of K.
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    int it = 0;
    for (int unit = blockIdx.x; unit < sched.count(); unit += gridDim.x) {
      int m0, n0, kb0, kb1;
      sched.origin(unit, &m0, &n0);
      sched.k_range(unit, &kb0, &kb1);
      for (int kt = kb0; kt < kb1; ++kt, ++it) {
        const int s = it % T::kStages;
        ptx::mbarrier_wait(&empty_sh[s], ((it / T::kStages) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(&full_sh[s], T::kStageBytes);
        ptx::tma_load_2d(a_tile(s), &a_map, kt * kBlockK, m0, &full_sh[s]);
        ptx::tma_load_2d(b_tile(s), &b_map, kt * kBlockK, n0, &full_sh[s]);
      }
    }
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
  for (int unit = blockIdx.x; unit < sched.count(); unit += gridDim.x) {
    int m0, n0, kb0, kb1;
    sched.origin(unit, &m0, &n0);
    sched.k_range(unit, &kb0, &kb1);
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
        if (lane == 0) ptx::mbarrier_arrive(&empty_sh[s]);
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
        if (kt > kb0 && lane == 0) ptx::mbarrier_arrive(&empty_sh[(it - 1) % T::kStages]);
      }
      ptx::wgmma_wait<0>();
      ptx::wgmma_fence_operands(acc);
      if (lane == 0) ptx::mbarrier_arrive(&empty_sh[(it - 1) % T::kStages]);
    }
    if (Store::kTma || sched.splits == 1) {  // the TMA store runs only where tiles are whole
      store(unit, n0, row);
      continue;
    }
    // Reduce (chapter 07's v5): this share's sums to its slice of the tile's partials, published
    // before the arrival; the last share to arrive adds the slices in share order and stores.
    const int tile = unit % sched.tiles(), split = unit / sched.tiles(), tid = threadIdx.x - 128;
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
    // BEGIN SOLUTION: one thread counts this share in on arrivals[tile]; the share that finds
    //   splits − 1 arrivals before it is the last
    if (tid == 0) last_sh = atomicAdd(&arrivals[tile], 1u) == unsigned(sched.splits - 1);
    // END SOLUTION
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
Status launch_v5(const GemmArgs& a, const TileSchedule& sched, cudaStream_t stream) {
  using T = Tile<kBlockN, Store>;
  if (Store::kTma && sched.splits != 1)
    return error(Code::kInvalidArgument, "v5: the TMA-store epilogue takes whole tiles only, not a split plan");
  CUtensorMap a_map, b_map, y_map{};
  Status s = operand_maps(a, kBlockM, kBlockN, &a_map, &b_map);
  if (s.ok() && Store::kTma) s = tensor_map_bf16_sw128(&y_map, a.y, a.m, a.n, 64);  // 64 × 64 boxes
  if (!s.ok()) return s;
  float* partials = nullptr;
  unsigned* arrivals = nullptr;
  if (sched.splits > 1) {
    s = w4a16::split_workspace(int64_t(sched.tiles()) * sched.splits * kBlockM * kBlockN, sched.tiles(),
                               &partials, &arrivals);
    if (!s.ok()) return s;
  }
  return launch_with_smem(fp8_v5_kernel<kPromote, kBlockN, Store>, dim3(persistent_grid(sched, a.max_blocks)),
                          kThreads, T::kSmemBytes, stream, kOp, a_map, b_map, y_map, a, sched, partials,
                          arrivals);
}

// The epilogue by the plan: where each tile is stored by the block that computed it, by TMA (the
// block goes on to its next tile while the copy engine drains the last); where the tiles are split
// over K, the last share's pairs straight to y (there the staging measured slower). The ablation
// stores every tile directly.
template <bool kPromote, int kBlockN>
Status launch_planned(const GemmArgs& a, const TileSchedule& sched, bool tma_where_whole, cudaStream_t stream) {
  return tma_where_whole && sched.splits == 1 ? launch_v5<kPromote, kBlockN, StoreTma>(a, sched, stream)
                                              : launch_v5<kPromote, kBlockN, StoreDirect>(a, sched, stream);
}

template <bool kTmaWhereWhole>
Status gemm_v5(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise, Granularity::kBlockwise},
                           90, kTmaWhereWhole ? "v5_tuned" : "ablation_v5_direct_store");
  if (!s.ok()) return s;
  const bool blockwise = a.granularity == Granularity::kBlockwise;
  const TileSchedule sched = plan_v5(a.m, a.n, a.k, blockwise, sm_count(), kGroupM, w4a16::splits_for);
  if (blockwise) return launch_planned<true, 128>(a, sched, kTmaWhereWhole, stream);
  return sched.block_n == 256 ? launch_planned<false, 256>(a, sched, kTmaWhereWhole, stream)
                              : launch_planned<false, 128>(a, sched, kTmaWhereWhole, stream);
}

const SassFact kTmaFacts{"StoreTma", {"sm_90a"}, {"QGMMA", "UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG"},
                         {"LDGSTS", "HMMA"}, false, "v4's machinery, split K, the tile stored by TMA"};
// Staging a 256-wide tile (128 sums and their column scales a thread, 168 registers under 384
// threads) spills two words of the loop's state around the epilogue: allowed above, and said.
const SassFact kDirectFacts{"StoreDirect", {"sm_90a"}, {"QGMMA", "UTMALDG", "SYNCS", "USETMAXREG"},
                            {"LDGSTS", "HMMA"}, true, "v4's machinery with the split-K reduction; no spills"};
constexpr const char* kSummary = "split K where tiles cannot fill the SMs, L2 bands, TMA-store epilogue";
const Register kRegistered{gemm_version(kBlockwiseOp, "v5_tuned", kSummary, gemm_v5<true>, 90,
                                        {kTmaFacts, kDirectFacts})};
const Register kRowwise{gemm_version(kOp, "v5_tuned", kSummary, gemm_v5<true>, 90, {kTmaFacts, kDirectFacts})};
// The ablation (benched, tested, never graded): every tile's pairs straight to y.
constexpr const char* kDirectSummary = "v5 with every tile stored by its threads' pairs, no TMA store";
const Register kDirectBlockwise{gemm_version(kBlockwiseOp, "ablation_v5_direct_store", kDirectSummary,
                                             gemm_v5<false>, 90, {kDirectFacts}, Kind::kAblation)};
const Register kDirectRowwise{gemm_version(kOp, "ablation_v5_direct_store", kDirectSummary, gemm_v5<false>, 90,
                                           {kDirectFacts}, Kind::kAblation)};

}  // namespace
}  // namespace lkw::fp8
