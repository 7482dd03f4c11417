// v6_pipelined — a shallow ring, x held whole, the weights issued before the kernel ahead has ended.
//
// Since v5: v5's warps start streaming only once x has landed and Σx is done, and the kernel starts
// only once the one ahead of it in the stream has ended: at M = 1 the DRAM sits idle for microseconds
// at both ends of every launch. Three changes overlap that start with the stream:
// 1. Two stages per warp (one in flight while one is computed): 16 warps × 2 stages still keep the
//    SM streaming, and the shared memory freed holds the whole row of x (S = 1 for the fold at M = 1;
//    the plan is rounds_time's, gemv_plan.h), so no split-K finish.
// 2. A programmatic dependent launch: the ring's first stages go out before griddepcontrol.wait,
//    x (the previous kernel's output) after it (a launcher argument: pdl).
// 3. Σx on the tensor cores, rows of x only (persistent.cuh's sum_x_rows), not eight columns of B.
// Expect: back to back and in a graph, at M = 1 on the 70B shapes, near the copy ceiling; one launch
// at a time gains less (there is no kernel ahead to overlap). SASS: v5's, plus
// griddepcontrol (ACQBULK, PREEXIT).
// Run: python tools/bench.py --chapter 06_int4_gemv --op int4i_gemv
#include "persistent.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

constexpr int kStages = 2;  // one step in flight while the warp computes another

template <int kNTiles, int kMode>
__global__ void __launch_bounds__(kBlockWarps * 32, 1) gemv_v6_kernel(const Params p) {
  constexpr int kPasses = scale_passes<kMode>();
  extern __shared__ uint4 smem[];
  Stage* ring = reinterpret_cast<Stage*>(smem);  // [warp][stage]
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32;
  uint4* x_sh = smem + warps * kStages * sizeof(Stage) / 16;                      // [M][k_split / 8]
  float* xsum_sh = reinterpret_cast<float*>(x_sh + p.m * (p.k_split / 8 + 1));  // [k_split/128][8]
  const int split = blockIdx.y, block = blockIdx.x;
  const Lane ln = lane_of(p, split);

  // This warp's run: `count` steps from step it0 of tile tile0, the block's tiles consecutive.
  const unsigned block_tiles = unsigned(p.tiles_base + (block < p.tiles_extra ? 1 : 0));
  const bool whole_tiles = p.splits > 1;  // the rounds model's whole tiles; S = 1: cut anywhere
  auto start_of = [&](int v) { return run_start(unsigned(v), block_tiles, unsigned(ln.iters), whole_tiles); };
  // BEGIN SOLUTION: lo = start_of(warp), count = start_of(warp + 1) − lo; tile0 = the block's first tile (block·base + min(block, extra)) + lo / iters, it0 = lo % iters (by subtraction: no division).
  const int lo = int(start_of(warp)), count = int(start_of(warp + 1)) - lo;
  int it0 = lo, j0 = 0;
  for (; it0 >= ln.iters; it0 -= ln.iters) ++j0;  // lo / iters and lo % iters
  const int tile0 = block * p.tiles_base + min(block, p.tiles_extra) + j0;
  // STUB: const int count = 0, it0 = 0, tile0 = 0;
  // END SOLUTION

  // Load: x first, unless launched as a dependent: then the weights first and x, the output of the
  // kernel ahead, once that kernel is done (below).
  if (!p.pdl) {
    copy_x<Fetch::kPair256>(x_sh, p, ln);
    ptx::cp_async_commit();
  }
  Stage* my_ring = ring + warp * kStages;
  int copy_tile = tile0, copy_it = it0, copies_left = count;
  CopyTile ct = copy_tile_rows<kPasses>(p, ln, tile0);
  auto copy_next = [&](int s) {
    if (copies_left > 0) {
      copy_step<kPasses, Fetch::kPair256>(my_ring[s % kStages], p, ln, ct, copy_it);
      --copies_left;
      if (++copy_it == ln.iters) {
        copy_it = 0;
        ct = copy_tile_rows<kPasses>(p, ln, ++copy_tile);
      }
    }
    ptx::cp_async_commit();  // always, so that the group count stays in step
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) copy_next(s);
  ComputeLane<kNTiles> cl = compute_lane_of<kNTiles>(x_sh, p, ln);
  int tile = tile0, it = it0;
  start_tile(cl, p, ln, tile);

  // Wait for x (as a dependent: let the next kernel's blocks be scheduled, wait for the kernel
  // ahead, then copy x), then Σx for the fold.
  // BEGIN SOLUTION: p.pdl: let dependents launch, wait for the grid ahead, copy x, commit, wait for all; else wait<kStages − 1>.
  if (p.pdl) {
    ptx::grid_dependents_launch();
    ptx::grid_dependency_wait();
    copy_x<Fetch::kPair256>(x_sh, p, ln);
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
  } else {
    ptx::cp_async_wait<kStages - 1>();
  }
  // END SOLUTION
  __syncthreads();
  if constexpr (kMode == kFold) {
    sum_x_rows(x_sh, xsum_sh, p, ln, warp, warps);
    __syncthreads();
  }

  // Compute. A part of a tile from its step 0 to its end is stored at once; a part that starts
  // later (only the run's first can) is kept as this warp's head; a part from step 0 that ends
  // early (only the run's last can) is this warp's to finish after the loop.
  float acc[kNTiles][4] = {}, head[kNTiles][4] = {};
  bool has_head = false, owns_part = false;
  int part_from = it0;
  for (int s = 0; s < count; ++s) {
    __syncwarp();  // every lane is done with the stage about to be refilled
    copy_next(s + kStages - 1);
    ptx::cp_async_wait<kStages - 1>();
    __syncwarp();
    compute_step<kNTiles, kMode>(my_ring[s % kStages], xsum_sh, ln, cl, it, acc);
    if (++it < ln.iters && s + 1 < count) continue;
    // BEGIN SOLUTION: a part from step 0 that ends before the tile does: owns_part, break; a part from a later step: copy acc to head, has_head; else store_tile. Then part_from = 0, zero acc, it = 0, next tile (start_tile).
    if (part_from == 0 && it < ln.iters) {
      owns_part = true;
      break;
    }
    if (part_from != 0) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) head[j][e] = acc[j][e];
      has_head = true;
    } else {
      store_tile<kNTiles>(p, acc, tile, split, ln.g, ln.t, ln.lane);
    }
    part_from = 0;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    it = 0;
    start_tile(cl, p, ln, ++tile);
    // END SOLUTION
  }
  ptx::cp_async_wait<0>();  // the ring is idle: it now holds the heads

  // Reduce: every head into its warp's own ring, then the owner of a cut tile adds, in warp order,
  // the heads of the warps after it whose runs start inside that tile, and stores it.
  float* slot = reinterpret_cast<float*>(my_ring);
  __syncwarp();
  if (has_head) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) slot[(4 * j + e) * 32 + ln.lane] = head[j][e];
  }
  __syncthreads();
  if (owns_part) {
    // BEGIN SOLUTION: tile_end = start_of(warp + 1) + iters − it; for v = warp + 1 .. 15 while start_of(v) < tile_end: skip empty runs, add v's head (ring + v·kStages as floats) to acc. Then store_tile.
    const unsigned tile_end = start_of(warp + 1) + unsigned(ln.iters - it);
    for (int v = warp + 1; v < kBlockWarps; ++v) {
      const unsigned v_lo = start_of(v), v_hi = start_of(v + 1);
      if (v_lo >= tile_end) break;
      if (v_hi == v_lo) continue;  // an empty run: no head
      const float* theirs = reinterpret_cast<const float*>(ring + v * kStages);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] += theirs[(4 * j + e) * 32 + ln.lane];
    }
    store_tile<kNTiles>(p, acc, tile, split, ln.g, ln.t, ln.lane);
    // END SOLUTION
  }
}

template <int kNTiles, int kMode>
size_t smem_v6(int64_t m, int64_t k_split) {
  return size_t(kBlockWarps) * kStages * sizeof(Stage) + size_t(m) * (k_split + 8) * 2 +
         size_t(k_split / 128) * 8 * kNTiles * sizeof(float);
}

template <int kNTiles, int kMode>
Status launch_v6(const GemvOp& op, const GemvArgs& a, cudaStream_t stream, bool pdl) {
  auto smem_of = [&](int64_t ks) { return smem_v6<kNTiles, kMode>(a.m, ks); };
  // The fold at M ≤ 2 holds the whole row of x where it fits and pays (whole_row_force).
  const int64_t force = kMode == kFold && a.m <= 2 ? whole_row_force(a.m, a.k) : 0;
  Plan plan = plan_persistent(a.m, a.n, a.k, sm_count(), smem_optin(), SplitModel::kRounds, smem_of, force);
  if (force && plan.splits != 1) plan = plan_persistent(a.m, a.n, a.k, sm_count(), smem_optin(), SplitModel::kRounds, smem_of);
  return launch_persistent(gemv_v6_kernel<kNTiles, kMode>, op, a, plan, pdl, stream);
}

template <const GemvOp& kOp>
Status gemv_v6(const GemvArgs& a, cudaStream_t stream) {
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  constexpr bool kPdl = true;
  if (a.m > 8) return launch_v6<2, kScaleInA>(kOp, a, stream, kPdl);
  return a.group == 128 ? launch_v6<1, kFold>(kOp, a, stream, kPdl) : launch_v6<1, kScaleInA>(kOp, a, stream, kPdl);
}

std::vector<SassFact> facts() {
  return {{"gemv_v6_kernel", {"sm_90a"}, {"ACQBULK", "PREEXIT", "LDGSTS.E.BYPASS.LTC256B.128", "HMMA", "LOP3"},
           {"I2F", "I2FP", "LDG.E.128"}, true,
           "v5's instructions plus griddepcontrol (ACQBULK, PREEXIT): the dependent launch, no spill"}};
}

constexpr const char* kSummary = "two-stage ring, the whole row of x, weights issued before the kernel ahead ends "
                                 "(dependent launch), Σx on the tensor cores";
const Register kRegistered{gemv_version(kInt4iGemv, "v6_pipelined", kSummary, gemv_v6<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
