// v5_balanced_steps — a block's steps shared out evenly over its 16 warps, whatever tiles they fall in.
//
// Since v4: v4 deals whole tiles to warps. At 28672 × 8192 a block holds 13 or 14 tiles for its 16
// warps: two or three warps idle, and a scheduler with four busy warps finishes a whole tile after
// one with three. Here a block holds T consecutive tiles, T·iters steps, and warp v runs the steps
// run_start(v) to run_start(v + 1) (gemv_plan.h): every warp streams to the end. A tile cut between
// warps is summed in shared memory after the loop: the warp that holds its first step adds the
// others' parts ("heads") and stores it, through v3's split-K finish when S > 1. The plan weighs
// the x slice (plan_splits, balanced), so it splits K less than v4 does.
// Expect: faster than v4 where v4's tiles fall unevenly on the warps (most of the 70B shapes at
// M ≤ 8), level elsewhere; the same bytes. SASS as v4's.
// Run: python tools/bench.py --chapter 06_int4_gemv --op int4i_gemv
#include "persistent.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <int kNTiles>
constexpr int stages_for() {
  return kNTiles == 1 ? 4 : 3;  // two n-tiles: more registers, a smaller ring leaves room for x
}

template <int kNTiles, int kMode>
__global__ void __launch_bounds__(kBlockWarps * 32, 1) gemv_v5_kernel(const Params p) {
  constexpr int kStages = stages_for<kNTiles>();
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
  auto start_of = [&](int v) { return run_start(unsigned(v), block_tiles, unsigned(ln.iters), false); };
  // BEGIN SOLUTION: lo = start_of(warp), count = start_of(warp + 1) − lo; tile0 = the block's first tile (block·base + min(block, extra)) + lo / iters, it0 = lo % iters (by subtraction: no division).
  const int lo = int(start_of(warp)), count = int(start_of(warp + 1)) - lo;
  int it0 = lo, j0 = 0;
  for (; it0 >= ln.iters; it0 -= ln.iters) ++j0;  // lo / iters and lo % iters
  const int tile0 = block * p.tiles_base + min(block, p.tiles_extra) + j0;
  // STUB: const int count = 0, it0 = 0, tile0 = 0;
  // END SOLUTION

  // Load: x first, then the ring's first stages.
  copy_x<Fetch::kPair256>(x_sh, p, ln);
  ptx::cp_async_commit();
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

  // Wait for x, then Σx for the fold.
  ptx::cp_async_wait<kStages - 1>();
  __syncthreads();
  if constexpr (kMode == kFold) {
    sum_x_groups<kNTiles>(x_sh, xsum_sh, p);
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
size_t smem_v5(int64_t m, int64_t k_split) {
  return size_t(kBlockWarps) * stages_for<kNTiles>() * sizeof(Stage) + size_t(m) * (k_split + 8) * 2 +
         size_t(k_split / 128) * 8 * kNTiles * sizeof(float);
}

template <int kNTiles, int kMode>
Status launch_v5(const GemvOp& op, const GemvArgs& a, cudaStream_t stream) {
  const Plan plan = plan_persistent(a.m, a.n, a.k, sm_count(), smem_optin(), SplitModel::kBalanced,
                                    [&](int64_t ks) { return smem_v5<kNTiles, kMode>(a.m, ks); });
  return launch_persistent(gemv_v5_kernel<kNTiles, kMode>, op, a, plan, false, stream);
}

template <const GemvOp& kOp>
Status gemv_v5(const GemvArgs& a, cudaStream_t stream) {
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  if (a.m > 8) return launch_v5<2, kScaleInA>(kOp, a, stream);
  return a.group == 128 ? launch_v5<1, kFold>(kOp, a, stream) : launch_v5<1, kScaleInA>(kOp, a, stream);
}

std::vector<SassFact> facts() {
  return {{"gemv_v5_kernel", {}, {"LDGSTS.E.BYPASS.LTC256B.128", "HMMA", "LOP3"}, {"I2F", "I2FP", "LDG.E.128"}, true,
           "v4's instructions: LDGSTS for everything, HMMA, LOP3 unpack, no integer→float convert, no spill"}};
}

constexpr const char* kSummary = "the block's steps shared evenly over its warps, cut tiles summed in shared memory";
const Register kRegistered{gemv_version(kInt4iGemv, "v5_balanced_steps", kSummary, gemv_v5<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
