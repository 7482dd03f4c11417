// v7_swap_ab — small M on the asynchronous tensor cores: v5's ring with A and B swapped.
//
// Since v6: the mma.sync GEMV holds its K blocks in registers, and at 32 tokens (four token
// tiles) room is left for one block in flight: it falls behind v5, whose 128-row tiles are three
// quarters padding there. v7 keeps v5's warp-specialized TMA ring and swaps the operands as v6
// did, on wgmma: a tile is 128 rows of B (the weights, wgmma's 64-row side, one a consumer
// warpgroup) by all M tokens, wgmma's N (16, 32 or 64: the first that holds M; TMA fills the rows
// past M with zeros). A 128-row tile lies inside one of B's scale blocks, so s_b is one float
// a stage and s_a one a token: the promotion scales each accumulator column by its token's s_a.
// Few tiles (N / 128) fill few SMs; where K is long, each tile's K blocks are split into shares
// (schedule.cuh's swap_splits), met as in v5, the last share loading every slice at once.
// The ring is as deep as shared memory allows; B, which no kernel ahead writes, fills its first
// lap before griddepcontrol.wait (PDL). The accumulators hold y^T: stores go out transposed.
// Expect most of the copy ceiling at M <= 32 where N·K is large. M > 64: v5.
#include <algorithm>
#include <string>

#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"
#include "schedule.cuh"

namespace lkw::fp8 {
namespace {

constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kBlockN = 64 * kConsumers, kBlockK = kScaleBlock;  // 128 rows of B, one scale block
constexpr int kProducerRegs = 40, kConsumerRegs = 232;           // v5's split of the launch's pool
static_assert(
    ptx::setmaxnreg_fits(128, kProducerRegs, 128 * kConsumers, kConsumerRegs),
    "the consumers would claim registers the producers never return: setmaxnreg.inc hangs");
constexpr int kMaxTokens = 64;  // larger M: v5 (faster at M = 128: lab notes 08)

// A stage: 128 rows of B, then the tokens' rows, each 128 K bytes in the 128-byte swizzle, and
// (after the ring) the stage's scales: s_a of the tokens, then s_b. As many stages as fit.
template <int kTokens>
struct Ring {
  static constexpr int kBBytes = kBlockN * kBlockK, kABytes = kTokens * kBlockK;
  static constexpr int kStageBytes = kBBytes + kABytes, kScaleSlot = kTokens + 4;
  static constexpr int kRoom =
      227 * 1024 - 1024 - 512;  // the SM's opt-in, less alignment and statics
  static constexpr int kStages = std::min(12, kRoom / (kStageBytes + 4 * kScaleSlot));
  static constexpr int kScaleOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kScaleOffset + kStages * kScaleSlot * 4 + 1024;
};

template <int kTokens>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_v7_kernel(const __grid_constant__ CUtensorMap a_map,
                  const __grid_constant__ CUtensorMap b_map, const GemmArgs a,
                  const TileSchedule sched, float* __restrict__ partials,
                  unsigned* __restrict__ arrivals) {
  using R = Ring<kTokens>;
  constexpr int kSums = kTokens / 2;  // a thread's accumulators: 2 rows of B × kTokens / 4 tokens
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem =
      smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full_sh[R::kStages], empty_sh[R::kStages];
  __shared__ bool last_sh;
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  auto b_tile = [&](int s) { return smem + s * R::kStageBytes; };
  auto a_tile = [&](int s) { return b_tile(s) + R::kBBytes; };
  auto scale_slot = [&](int s) {
    return reinterpret_cast<float*>(smem + R::kScaleOffset) + s * R::kScaleSlot;
  };
  if (threadIdx.x == 0)
    for (int s = 0; s < R::kStages; ++s) {
      ptx::mbarrier_init(&full_sh[s], 1 + 32);  // the TMA issuer and the scale warp's lanes
      ptx::mbarrier_init(&empty_sh[s], 4 * kConsumers);
    }
  __syncthreads();
  ptx::grid_dependents_launch();  // the kernel behind may be scheduled as this one's blocks end

  // The units' K blocks in order: fn(it, n0, kt) for each, until it returns false.
  auto walk = [&](auto&& fn) {
    int it = 0;
    for (int unit = blockIdx.x; unit < sched.count(); unit += gridDim.x) {
      const auto [m0, n0, kb0, kb1] = sched.locate(unit);
      for (int kt = kb0; kt < kb1; ++kt, ++it)
        if (!fn(it, n0, kt)) return;
    }
  };

  if (group == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (warp == 1) {
      // Scale warp (v5's): each stage's s_a of the tokens (past M zero-filled) and s_b, copied
      // with cp.async; each lane's arrival on the full barrier lands with its copies.
      ptx::grid_dependency_wait();  // s_a: the kernel ahead wrote it
      walk([&](int it, int n0, int kt) {
        const int s = it % R::kStages;
        float* const slot = scale_slot(s);
        ptx::mbarrier_wait(&empty_sh[s], ((it / R::kStages) & 1) ^ 1);
        for (int r = lane; r < kTokens; r += 32)
          ptx::cp_async_4(slot + r, block_scale_a(a, r, kt), r < a.m ? 4 : 0);
        if (lane == 0) ptx::cp_async_4(slot + kTokens, block_scale_b(a, n0, kt), 4);
        ptx::cp_async_mbarrier_arrive_noinc(&full_sh[s]);
        return true;
      });
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();  // no lane leaves with its copies in flight
      return;
    }
    if (threadIdx.x != 0) return;
    // Load: B of the ring's first lap before waiting on the kernel ahead, then the tokens' rows.
    walk([&](int it, int n0, int kt) {
      if (it >= R::kStages) return false;
      ptx::mbarrier_arrive_expect_tx(&full_sh[it], R::kStageBytes);
      ptx::tma_load_2d(b_tile(it), &b_map, kt * kBlockK, n0, &full_sh[it]);
      return true;
    });
    ptx::grid_dependency_wait();
    walk([&](int it, int n0, int kt) {
      const int s = it % R::kStages;
      if (it >= R::kStages) {
        ptx::mbarrier_wait(&empty_sh[s], ((it / R::kStages) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(&full_sh[s], R::kStageBytes);
        ptx::tma_load_2d(b_tile(s), &b_map, kt * kBlockK, n0, &full_sh[s]);
      }
      ptx::tma_load_2d(a_tile(s), &a_map, kt * kBlockK, 0, &full_sh[s]);
      return true;
    });
    return;
  }

  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int c = group - 1, g = lane / 4, t = lane % 4;
  float acc[kSums] = {}, total[kSums];
  int it = 0;
  for (int unit = blockIdx.x; unit < sched.count(); unit += gridDim.x) {
    const auto [m0, n0, kb0, kb1] = sched.locate(unit);
#pragma unroll
    for (int j = 0; j < kSums; ++j) total[j] = 0.f;
    for (int kt = kb0; kt < kb1; ++kt, ++it) {
      // Wait and compute: this warpgroup's 64 rows of B against the tokens, a fresh sum a block.
      const int s = it % R::kStages;
      ptx::mbarrier_wait(&full_sh[s], (it / R::kStages) & 1);
      const uint64_t desc_b = ptx::wgmma_desc_k_major_sw128(b_tile(s) + c * 64 * kBlockK);
      const uint64_t desc_a = ptx::wgmma_desc_k_major_sw128(a_tile(s));
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBlockK / 32; ++ks)
        ptx::wgmma_e4m3_ss<kTokens>(acc, desc_b + 2 * ks, desc_a + 2 * ks, ks > 0);
      ptx::wgmma_commit();
      ptx::wgmma_fence_operands(acc);
      // The block's scales, read while the wgmmas run: accumulator j is token 8·(j / 4) + 2t +
      // j % 2, so a thread's tokens come in pairs (2t, 2t + 1) every 8.
      const float* const slot = scale_slot(s);
      float sc[kTokens / 4];
#pragma unroll
      for (int p = 0; p < kTokens / 8; ++p) {
        // BEGIN SOLUTION: the pair's s_a (one 8-byte load) times the stage's s_b
        const float2 s_a = *reinterpret_cast<const float2*>(slot + 8 * p + 2 * t);
        sc[2 * p] = s_a.x * slot[kTokens], sc[2 * p + 1] = s_a.y * slot[kTokens];
        // END SOLUTION
      }
      ptx::wgmma_wait<0>();
      ptx::wgmma_fence_operands(acc);
      __syncwarp();  // every lane's reads of the slot before the warp's release of the stage
      if (lane == 0) ptx::mbarrier_arrive(&empty_sh[s]);
        // Promote: the block's sum, scaled per token column, into the FP32 total.
#pragma unroll
      for (int j = 0; j < kSums; ++j) total[j] = fmaf(acc[j], sc[2 * (j / 4) + j % 2], total[j]);
    }
    // Reduce (v5's): a share's sums to its slice; the last share of the tile adds them in order.
    const int tile = unit % sched.tiles(), split = unit / sched.tiles(), tid = threadIdx.x - 128;
    const bool live = n0 + 64 * c < a.n;  // a warpgroup whose 64 rows lie past N keeps nothing
    if (sched.splits > 1) {
      float* slices = partials + int64_t(tile) * sched.splits *
                                     (kBlockN * kTokens);  // (splits, threads, kSums)
      if (live)
#pragma unroll
        for (int j = 0; j < kSums; j += 4)
          __stcg(reinterpret_cast<float4*>(slices + int64_t(split) * (kBlockN * kTokens) +
                                           tid * kSums + j),
                 make_float4(total[j], total[j + 1], total[j + 2], total[j + 3]));
      __threadfence();
      ptx::named_barrier_sync(1, 128 * kConsumers);  // every consumer's slice written and fenced
      if (tid == 0) last_sh = atomicAdd(&arrivals[tile], 1u) == unsigned(sched.splits - 1);
      ptx::named_barrier_sync(1, 128 * kConsumers);
      if (!last_sh) continue;
      __threadfence();  // the other shares' slices, published before their arrivals, are read after
      if (tid == 0) arrivals[tile] = 0;  // re-armed for the next launch
      if (!live) continue;
        // Every share's four floats asked for at once (a load per slice in flight, not one L2 trip
        // a slice after another), then added in share order: the same sum every run.
#pragma unroll
      for (int j = 0; j < kSums; j += 4) {
        float4 p[kMaxSwapSplits];
#pragma unroll
        for (int sp = 0; sp < kMaxSwapSplits; ++sp)
          p[sp] = sp < sched.splits
                      ? __ldcg(reinterpret_cast<const float4*>(
                            slices + int64_t(sp) * (kBlockN * kTokens) + tid * kSums + j))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
        total[j] = p[0].x, total[j + 1] = p[0].y, total[j + 2] = p[0].z, total[j + 3] = p[0].w;
#pragma unroll
        for (int sp = 1; sp < kMaxSwapSplits; ++sp)
          if (sp < sched.splits)
            total[j] += p[sp].x, total[j + 1] += p[sp].y, total[j + 2] += p[sp].z,
                total[j + 3] += p[sp].w;
      }
    }
    // Store: accumulator j is row n of B (column n of y) and token m (row m of y), transposed.
    const int64_t n = n0 + 64 * c + 16 * warp + g;
#pragma unroll
    for (int j = 0; j < kSums; ++j) {
      const int64_t row_n = n + 8 * ((j / 2) % 2), m = m0 + 8 * (j / 4) + 2 * t + j % 2;
      if (m < a.m && row_n < a.n) a.y[m * a.n + row_n] = __float2bfloat16_rn(total[j]);  // (M, N)
    }
  }
}

// The launch: the tensor maps (B in 128-row boxes, the tokens in kTokens-row ones), the shares'
// workspace, and the kernel as a programmatic dependent of the one ahead where pdl is on.
template <int kTokens>
Status launch_v7(const GemmArgs& a, const TileSchedule& sched, bool pdl, cudaStream_t stream) {
  CUtensorMap a_map, b_map;
  float* partials;
  unsigned* arrivals;
  Status s = operand_maps(a, kTokens, kBlockN, &a_map, &b_map);
  if (s.ok()) s = v5_workspace(sched, &partials, &arrivals);
  if (!s.ok()) return s;
  return launch_dependent(fp8_v7_kernel<kTokens>, dim3(persistent_grid(sched, a.max_blocks)),
                          kThreads, Ring<kTokens>::kSmemBytes, pdl, stream, "v7_swap_ab", a_map,
                          b_map, a, sched, partials, arrivals);
}

// The version: the swapped ring up to kMaxTokens tokens, v5 above. The ablations, one knob each:
// PDL off; every tile's whole K in one block (no shares).
template <bool kPdl = true, bool kSplit = true>
Status gemm_v7(const GemmArgs& a, cudaStream_t stream) {
  const char* id = !kPdl ? "ablation_v7_no_pdl" : !kSplit ? "ablation_v7_whole_k" : "v7_swap_ab";
  if (a.m > kMaxTokens) return gemm_v5_tuned(a, stream);
  Status s = validate_gemm(a, {Granularity::kBlockwise}, 90, id);
  if (!s.ok()) return s;
  const int tokens = a.m <= 16 ? 16 : a.m <= 32 ? 32 : 64;
  TileSchedule sched = plan_tiles(tokens, a.n, tokens, kBlockN, a.k);
  sched.splits = kSplit ? swap_splits(sched.tiles(), sched.k_blocks, sm_count()) : 1;
  const auto launch = tokens == 16 ? launch_v7<16> : tokens == 32 ? launch_v7<32> : launch_v7<64>;
  return launch(a, sched, kPdl, stream);
}

// The scale warp, at 40 registers, keeps a few words of its walk in local memory (as v5's).
const SassFact kSwapFacts{
    "fp8_v7_kernel", {"sm_90a"}, {"QGMMA", "UTMALDG", "SYNCS", "USETMAXREG"},
    {"HMMA"},        false,      "v5's ring with B's rows on wgmma's 64-row side"};
const RegisterGemm kRegistered{
    {kBlockwiseOp},
    "v7_swap_ab",
    "M <= 64: v5's ring with B's rows as wgmma's M and the tokens as its N; v5 above",
    gemm_v7<>,
    90,
    {kSwapFacts}};
const RegisterGemm kNoPdl{{kBlockwiseOp},
                          "ablation_v7_no_pdl",
                          "v7 launched without PDL: B waits for the kernel ahead to end",
                          gemm_v7<false>,
                          90,
                          {kSwapFacts},
                          Kind::kAblation};
const RegisterGemm kWholeK{{kBlockwiseOp},
                           "ablation_v7_whole_k",
                           "v7 with every tile's whole K in one block: as many blocks as tiles",
                           gemm_v7<true, false>,
                           90,
                           {kSwapFacts},
                           Kind::kAblation};

}  // namespace
}  // namespace lkw::fp8
