// v5_tuned — v4 planned per shape: split K where the tiles cannot fill the SMs, wider tiles where
// they fill them twice, L2 bands, each K block's scales carried in its stage, B shared by pairs.
//
// Since v4: at M = 64 N = 2112 makes 17 tiles for 132 SMs, each streaming 128 rows of B alone. v5
// splits a tile's K blocks into shares (schedule.cuh's v5_splits: M <= 64, 12 blocks a share at
// least) that meet as chapter 07's v5 does: each writes its FP32 sums to its own slice, counts in,
// and the last adds the slices in share order and stores the tile. At large M the tiles go in
// bands of kGroupM tile rows (A and B in flight stay in L2); blockwise tiles are 192 wide where
// those fill the SMs twice (else 128), the others 256 while those fill them. Blockwise, a scale
// warp copies each K block's scales into its stage (4-byte cp.async), and above M = 128 clusters
// of two CTAs, one tile above the other, share B's tile: each loads a slice of it into both (TMA
// multicast) and releases a stage in both rings, so L2 sends 128 + N/2 rows a block, not 128 + N.
// Expect: small M several times v4, large blockwise shapes nearly twice v4. The epilogue, a trait:
// unsplit tiles staged in shared memory and stored by TMA, split ones stored directly.
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
static_assert(ptx::setmaxnreg_fits(128, kProducerRegs, 128 * kConsumers, kConsumerRegs),
              "the consumers would claim registers the producers never return: setmaxnreg.inc hangs");
constexpr int kGroupM = 16;  // tile rows per band: 2048 rows of A in flight at most
constexpr int kPair = 2;     // CTAs a cluster at large M (blockwise), sharing B's tile

// The epilogue, a trait (named types, so that the SASS facts can name them): each thread's pairs
// to y (v4's), or the tile staged in shared memory and stored by TMA, the stage's room taken from
// the ring (a 256-wide tile keeps 3 stages instead of 4).
struct StoreDirect { static constexpr bool kTma = false; };
struct StoreTma { static constexpr bool kTma = true; };

// A promoted (blockwise) stage also carries its K block's scales: s_a of the tile's rows, then s_b
// (kScaleSlot floats, after the staging); with the staging that leaves room for 5 stages.
template <bool kPromote, int kBlockN, class Store>
struct Tile {
  static constexpr int kABytes = kBlockM * kBlockK, kBBytes = kBlockN * kBlockK, kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = kBlockN == 256   ? (Store::kTma ? 3 : 4)
                                 : kBlockN == 192 ? (Store::kTma ? 4 : 5)
                                                  : (kPromote && Store::kTma ? 5 : 6);
  static constexpr int kStagingBytes = Store::kTma ? kBlockM * kBlockN * 2 : 0;  // BF16 y tile
  static constexpr int kScaleOffset = kStages * kStageBytes + kStagingBytes, kScaleSlot = kBlockM + 4;
  static constexpr int kSmemBytes = kScaleOffset + (kPromote ? kStages * kScaleSlot * 4 : 0) + 1024;  // + alignment
};

// Promotion: total += acc · the block's scales, a pair (rows g and g + 8) a scale block. With two,
// the 8-column groups below kFirst take the first pair, the rest the second (a 192-wide tile starts
// at 0 or 64 of a scale block, so the split is at group 16 or 8, known per tile).
template <int kFirst, int kSums, int kScales>
__device__ __forceinline__ void promote(float (&total)[kSums], const float (&acc)[kSums], const float (&sc)[kScales]) {
#pragma unroll
  for (int j = 0; j < kSums; ++j)
    total[j] = fmaf(acc[j], sc[(kScales == 2 || j / 4 < kFirst ? 0 : 2) + (j / 2) % 2], total[j]);
}

template <bool kPromote, int kBlockN, class Store, int kPair = 1>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_v5_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                  const __grid_constant__ CUtensorMap y_map, const GemmArgs a, const TileSchedule sched,
                  float* __restrict__ partials, unsigned* __restrict__ arrivals) {
  using T = Tile<kPromote, kBlockN, Store>;
  static_assert(kPair == 1 || (kPromote && Store::kTma), "pairs: blockwise tiles, whole, stored by TMA");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full_sh[T::kStages], empty_sh[T::kStages];
  __shared__ bool last_sh;
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  // Pairs: a cluster of kPair CTAs is the persistent worker. Its unit is a tile kPair tiles tall;
  // rank r takes rows [m0 + 128·r, +128) and loads the r-th slice of the shared B tile into both.
  const unsigned rank = kPair > 1 ? ptx::cluster_ctarank() : 0;
  const int worker = blockIdx.x / kPair, workers = gridDim.x / kPair;
  auto locate = [&](int unit) {
    TileSchedule::Unit u = sched.locate(unit);
    u.m0 += int(rank) * kBlockM;
    return u;
  };
  // A stage is free once every consumer warp that reads it has released it: a pair's B slices
  // land in both CTAs, so each warp releases the stage in both rings.
  auto release = [&](int s) {
    if constexpr (kPair > 1) {
      if (lane < kPair) ptx::mbarrier_arrive_cluster(&empty_sh[s], lane);
    } else if (lane == 0) {
      ptx::mbarrier_arrive(&empty_sh[s]);
    }
  };
  auto a_tile = [&](int s) { return smem + s * T::kStageBytes; };
  auto b_tile = [&](int s) { return a_tile(s) + T::kABytes; };
  auto scale_slot = [&](int s) { return reinterpret_cast<float*>(smem + T::kScaleOffset) + s * T::kScaleSlot; };
  if (threadIdx.x == 0)
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(&full_sh[s], kPromote ? 1 + 32 : 1);  // the TMA issuer (+ the scale warp)
      ptx::mbarrier_init(&empty_sh[s], 4 * kConsumers * kPair);
    }
  if constexpr (kPair > 1)
    ptx::cluster_sync();  // the partner's barriers are initialized before any copy or release reaches them
  else
    __syncthreads();

  if (group == 0) {
    // Producer: v4's, over the unit's share of K. Blockwise, warp 1 is a scale warp: it walks the
    // same ring and copies each K block's scales into the stage's slot with 4-byte cp.async (rows
    // past M zero-filled); each lane's arrival on the full barrier lands with its copies, so a
    // stage is full once its tiles and its scales are in.
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (kPromote && warp == 1) {
      int it = 0;
      for (int unit = worker; unit < sched.count(); unit += workers) {
        const auto [m0, n0, kb0, kb1] = locate(unit);
        for (int kt = kb0; kt < kb1; ++kt, ++it) {
          const int s = it % T::kStages;
          float* const slot = scale_slot(s);
          ptx::mbarrier_wait(&empty_sh[s], ((it / T::kStages) & 1) ^ 1);
          for (int r = lane; r < kBlockM; r += 32)
            ptx::cp_async_4(slot + r, block_scale_a(a, m0 + r, kt), m0 + r < a.m ? 4 : 0);
          if (lane == 0) ptx::cp_async_4(slot + kBlockM, block_scale_b(a, n0, kt), 4);
          if (kBlockN > kScaleBlock && lane == 1) {  // a 192-wide tile's second scale block (N's last at most)
            const int64_t next = (n0 / kScaleBlock + 1) * kScaleBlock, last = (a.n - 1) / kScaleBlock * kScaleBlock;
            ptx::cp_async_4(slot + kBlockM + 1, block_scale_b(a, next < last ? next : last, kt), 4);
          }
          ptx::cp_async_mbarrier_arrive_noinc(&full_sh[s]);
        }
      }
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();  // no lane leaves with its copies in flight
      return;
    }
    if (threadIdx.x != 0) return;
    int it = 0;
    for (int unit = worker; unit < sched.count(); unit += workers) {
      const auto [m0, n0, kb0, kb1] = locate(unit);
      for (int kt = kb0; kt < kb1; ++kt, ++it) {
        const int s = it % T::kStages;
        ptx::mbarrier_wait(&empty_sh[s], ((it / T::kStages) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(&full_sh[s], T::kStageBytes);  // the partner's B slice counts here too
        ptx::tma_load_2d(a_tile(s), &a_map, kt * kBlockK, m0, &full_sh[s]);
        if constexpr (kPair > 1)
          ptx::tma_load_2d_multicast(b_tile(s) + rank * (T::kBBytes / kPair), &b_map, kt * kBlockK,
                                     n0 + int(rank) * (kBlockN / kPair), &full_sh[s], (1u << kPair) - 1);
        else
          ptx::tma_load_2d(b_tile(s), &b_map, kt * kBlockK, n0, &full_sh[s]);
      }
    }
    // A pair's CTA leaves only after the partner's last releases, which arrive on these barriers:
    // the waits the next kStages loads would make.
    if constexpr (kPair > 1)
      for (int i = 0; i < T::kStages; ++i, ++it) ptx::mbarrier_wait(&empty_sh[it % T::kStages], ((it / T::kStages) & 1) ^ 1);
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
        m0 += int(rank) * kBlockM;
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
  for (int unit = worker; unit < sched.count(); unit += workers) {
    const auto [m0, n0, kb0, kb1] = locate(unit);
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
      for (int kt = kb0; kt < kb1; ++kt, ++it) {
        const int s = it % T::kStages;
        issue(s, false);  // a fresh sum each block: promotion
        // The block's scales from its stage (landed with it), read while the wgmmas run and
        // before the stage is released.
        const float* const slot = scale_slot(s);
        const int r = c * 64 + 16 * warp + g;
        constexpr int kScales = kBlockN > kScaleBlock ? 4 : 2;  // sc[2], sc[3]: the second scale block's
        float sc[kScales];
        sc[0] = slot[r] * slot[kBlockM], sc[1] = slot[r + 8] * slot[kBlockM];
        if constexpr (kScales == 4) sc[2] = slot[r] * slot[kBlockM + 1], sc[3] = slot[r + 8] * slot[kBlockM + 1];
        ptx::wgmma_wait<0>();
        ptx::wgmma_fence_operands(acc);
        __syncwarp();  // every lane's reads of the slot before the warp's release of the stage
        release(s);
        if (kScales == 2 || n0 % kScaleBlock == 0)
          promote<kScaleBlock / 8>(total, acc, sc);
        else
          promote<kScaleBlock / 16>(total, acc, sc);
      }
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
    if (live)
#pragma unroll
      for (int j = 0; j < kBlockN / 2; j += 4)
        __stcg(reinterpret_cast<float4*>(slices + int64_t(split) * (kBlockM * kBlockN) + tid * (kBlockN / 2) + j),
               make_float4(sums[j], sums[j + 1], sums[j + 2], sums[j + 3]));
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

// The epilogue by the plan: a tile stored by the block that computed it goes by TMA (the block
// goes on to its next tile while the copy engine drains the last); a tile split over K, the last
// share's pairs straight to y (there the staging measured slower). The ablation stores directly.
template <bool kPromote, int kBlockN>
Status launch_v5(const GemmArgs& a, const TileSchedule& sched, bool tma_where_whole, cudaStream_t stream) {
  const bool tma = tma_where_whole && sched.splits == 1;
  CUtensorMap a_map, b_map, y_map{};
  float* partials;
  unsigned* arrivals;
  Status s = operand_maps(a, kBlockM, kBlockN, &a_map, &b_map);
  if (s.ok() && tma) s = tensor_map_bf16_sw128(&y_map, a.y, a.m, a.n, 64);  // 64 × 64 boxes
  if (s.ok()) s = v5_workspace(sched, &partials, &arrivals);
  if (!s.ok()) return s;
  const auto kernel = tma ? fp8_v5_kernel<kPromote, kBlockN, StoreTma> : fp8_v5_kernel<kPromote, kBlockN, StoreDirect>;
  const int smem = tma ? Tile<kPromote, kBlockN, StoreTma>::kSmemBytes
                       : Tile<kPromote, kBlockN, StoreDirect>::kSmemBytes;
  return launch_with_smem(kernel, dim3(persistent_grid(sched, a.max_blocks)), kThreads, smem, stream, kOp, a_map,
                          b_map, y_map, a, sched, partials, arrivals);
}

// Pairs (blockwise, whole tiles, TMA store): clusters of kPair CTAs, as many as run at once, each
// a persistent worker over the plan's kPair-tall tiles; B's tensor map in kPair slices of the tile.
template <int kBlockN, int kPair>
Status launch_v5_pairs(const GemmArgs& a, const TileSchedule& sched, cudaStream_t stream) {
  constexpr auto kernel = fp8_v5_kernel<true, kBlockN, StoreTma, kPair>;
  constexpr int smem = Tile<true, kBlockN, StoreTma>::kSmemBytes;
  CUtensorMap a_map, b_map, y_map;
  Status s = operand_maps(a, kBlockM, kBlockN / kPair, &a_map, &b_map);
  if (s.ok()) s = tensor_map_bf16_sw128(&y_map, a.y, a.m, a.n, 64);
  if (!s.ok()) return s;
  int clusters = std::min(sched.count(), max_active_clusters<kernel>(kPair, kThreads, smem));
  if (a.max_blocks > 0) clusters = std::min(clusters, std::max(1, a.max_blocks / kPair));
  if (clusters < 1) return error(Code::kUnsupportedArch, "v5: this device runs no cluster of this kernel");
  return launch_cluster(kernel, dim3(clusters * kPair), kPair, kThreads, smem, stream, kOp, a_map, b_map, y_map, a,
                        sched, static_cast<float*>(nullptr), static_cast<unsigned*>(nullptr));
}

// kSplitK off, kWide on: the ablations' plans (schedule.cuh's plan_v5_variant).
template <bool kTmaWhereWhole, bool kSplitK = true, bool kWide = false, bool kPairs = false>
Status gemm_v5(const GemmArgs& a, cudaStream_t stream) {
  const char* id = kWide ? "ablation_v5_wide_blockwise" : !kSplitK ? "ablation_v5_no_split"
                   : !kTmaWhereWhole ? "ablation_v5_direct_store" : kPairs ? "v5_tuned" : "ablation_v5_no_multicast";
  Status s = validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise, Granularity::kBlockwise}, 90, id);
  if (!s.ok()) return s;
  const bool blockwise = a.granularity == Granularity::kBlockwise;
  if (kPairs && blockwise && pairs_pay(a.m)) {
    const TileSchedule pairs = plan_v5_pairs(a.m, a.n, a.k, sm_count(), kGroupM, kPair);
    return pairs.block_n == 192 ? launch_v5_pairs<192, kPair>(a, pairs, stream) : launch_v5_pairs<128, kPair>(a, pairs, stream);
  }
  const TileSchedule sched = plan_v5_variant(a.m, a.n, a.k, blockwise, sm_count(), kGroupM, kSplitK, kWide);
  const auto launch = blockwise ? (sched.block_n == 192 ? launch_v5<true, 192> : launch_v5<true, 128>)
                                : (sched.block_n == 256 ? launch_v5<false, 256> : launch_v5<false, 128>);
  return launch(a, sched, kTmaWhereWhole, stream);
}

const SassFact kTmaFacts{"StoreTma", {"sm_90a"}, {"QGMMA", "UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG"},
                         {"HMMA"}, false, "v4's machinery, split K, the tile stored by TMA"};
// Spills, allowed and said: staging a 256-wide tile (128 sums and their column scales a thread,
// 168 registers under 384 threads) spills two words of the loop's state around the epilogue, and
// the scale warp, at 40 registers, a few words of its walk (the producer side, not the MMA loop).
// LDGSTS: the scale warp's 4-byte copies (blockwise kernels only).
const SassFact kDirectFacts{"StoreDirect", {"sm_90a"}, {"QGMMA", "UTMALDG", "SYNCS", "USETMAXREG"},
                            {"HMMA"}, false, "v4's machinery with the split-K reduction"};
// For both ops (blockwise scales; tensor or rowwise ones) but the width's ablation, which only
// blockwise tiles have; the ablations are benched and tested, never graded.
const RegisterGemm kRegistered{{kBlockwiseOp, kOp}, "v5_tuned",
                               "split K where tiles cannot fill the SMs, L2 bands, TMA-store epilogue, B shared by pairs",
                               gemm_v5<true, true, false, true>, 90, {kTmaFacts, kDirectFacts}};
const RegisterGemm kNoMulticast{{kBlockwiseOp}, "ablation_v5_no_multicast",
                                "v5 without pairs: every CTA loads its own B tile from L2", gemm_v5<true>, 90,
                                {kTmaFacts, kDirectFacts}, Kind::kAblation};
const RegisterGemm kDirect{{kBlockwiseOp, kOp}, "ablation_v5_direct_store",
                           "v5 with every tile stored by its threads' pairs, no TMA store", gemm_v5<false>, 90,
                           {kDirectFacts}, Kind::kAblation};
const RegisterGemm kNoSplit{{kBlockwiseOp, kOp}, "ablation_v5_no_split",
                            "v5 with every tile's whole K in one block, no split K", gemm_v5<true, false>, 90,
                            {kTmaFacts}, Kind::kAblation};
const RegisterGemm kWide{{kBlockwiseOp}, "ablation_v5_wide_blockwise",
                         "v5 with 128 x 192 blockwise tiles (two scale blocks of B a tile)", gemm_v5<true, true, true>,
                         90, {kTmaFacts, kDirectFacts}, Kind::kAblation};

}  // namespace

Status gemm_v5_tuned(const GemmArgs& a, cudaStream_t stream) { return gemm_v5<true, true, false, true>(a, stream); }

}  // namespace lkw::fp8
