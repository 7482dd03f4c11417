// v4_persistent_smem_x — one block of 16 warps per SM, x staged once in shared memory, the scales in
// the cp.async ring, the −8 folded into one correction per group.
//
// Since v3: v3's warps wait on x and the scales, loaded through L1 in the step that uses them. Here
// a block copies its K slice of x into shared memory once (swizzled: persistent.cuh's x_chunk) and
// keeps it for all its tiles; each ring stage carries a step's weights and its rows' scales, so a
// step waits for its stage and nothing else. At G = 128 (M ≤ 8) A holds 128 + q, one LOP3 per pair,
// and Σ x·(q − 8) = Σ x·(128 + q) − 136·Σx, Σx per group computed once per block (sum_x_groups).
// A warp takes whole tiles (tile block + B·(warp + 16n)); split-K as v3, S from plan_splits.
// Expect: no global-memory waits inside the loop; faster than v3 from M = 2 up at the large shapes;
// at M = 1 still short of the bound: the unpack and bookkeeping of a step cannot quite be issued as
// fast as HBM delivers it with one tile per warp. SASS: LDGSTS for weights, x and scales, HMMA, no
// I2F, no local memory; at G = 128, M ≤ 8 no packed-BF16 arithmetic at all.
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
__device__ __forceinline__ void gemv_v4_body(const Params& p) {
  constexpr int kStages = stages_for<kNTiles>();
  constexpr int kPasses = scale_passes<kMode>();
  extern __shared__ uint4 smem[];
  Stage* ring = reinterpret_cast<Stage*>(smem);  // [warp][stage]
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32;
  uint4* x_sh = smem + warps * kStages * sizeof(Stage) / 16;                      // [M][k_split / 8]
  float* xsum_sh = reinterpret_cast<float*>(x_sh + p.m * (p.k_split / 8 + 1));  // [k_split/128][8]
  const int split = blockIdx.y, block = blockIdx.x, blocks = gridDim.x;
  const Lane ln = lane_of(p, split);

  // Load: x first (its group is the oldest), then the ring's first stages.
  copy_x<Fetch::kPair256>(x_sh, p, ln);
  ptx::cp_async_commit();
  Stage* my_ring = ring + warp * kStages;
  const int tile0 = block + blocks * warp, stride = blocks * warps;
  int copy_tile = tile0, copy_it = 0;
  CopyTile ct = copy_tile_rows<kPasses>(p, ln, tile0);
  auto copy_next = [&](int s) {
    if (copy_tile < p.tiles) {
      copy_step<kPasses, Fetch::kPair256>(my_ring[s % kStages], p, ln, ct, copy_it);
      if (++copy_it == ln.iters) {
        copy_it = 0;
        copy_tile += stride;
        ct = copy_tile_rows<kPasses>(p, ln, copy_tile);
      }
    }
    ptx::cp_async_commit();  // always, so that the group count stays in step
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) copy_next(s);
  ComputeLane<kNTiles> cl = compute_lane_of<kNTiles>(x_sh, p, ln);
  int tile = tile0, it = 0;
  start_tile(cl, p, ln, tile);

  // Wait for x, then Σx for the fold.
  ptx::cp_async_wait<kStages - 1>();
  __syncthreads();
  if constexpr (kMode == kFold) {
    sum_x_groups<kNTiles>(x_sh, xsum_sh, p);
    __syncthreads();
  }

  // Compute: each step refills the stage the previous step freed, waits for its own, computes it;
  // store: a tile's sums when its last step is done.
  float acc[kNTiles][4] = {};
  // BEGIN SOLUTION: per step s while tile < tiles: __syncwarp, copy_next(s + kStages − 1), wait<kStages − 1>, __syncwarp (other lanes copied the scales), compute_step; at a tile's end store_tile, zero acc, next tile.
  for (int s = 0; tile < p.tiles; ++s) {
    __syncwarp();  // every lane is done with the stage about to be refilled
    copy_next(s + kStages - 1);
    ptx::cp_async_wait<kStages - 1>();
    __syncwarp();
    compute_step<kNTiles, kMode>(my_ring[s % kStages], xsum_sh, ln, cl, it, acc);
    if (++it == ln.iters) {
      store_tile<kNTiles>(p, acc, tile, split, ln.g, ln.t, ln.lane);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
      it = 0;
      tile += stride;
      start_tile(cl, p, ln, tile);
    }
  }
  // END SOLUTION
  ptx::cp_async_wait<0>();  // nothing in flight when the block exits
}

// The kernels, named by mode (the SASS facts below name them).
__global__ void __launch_bounds__(kBlockWarps * 32, 1) gemv_v4_fold_kernel(const Params p) {
  gemv_v4_body<1, kFold>(p);
}
template <int kNTiles>
__global__ void __launch_bounds__(kBlockWarps * 32, 1) gemv_v4_scale_in_a_kernel(const Params p) {
  gemv_v4_body<kNTiles, kScaleInA>(p);
}

template <int kNTiles, int kMode>
size_t smem_v4(int64_t m, int64_t k_split) {
  return size_t(kBlockWarps) * stages_for<kNTiles>() * sizeof(Stage) + size_t(m) * (k_split + 8) * 2 +
         size_t(k_split / 128) * 8 * kNTiles * sizeof(float);
}

template <int kNTiles, int kMode>
Status launch_v4(const GemvOp& op, const GemvArgs& a, cudaStream_t stream) {
  const Plan plan = plan_persistent(a.m, a.n, a.k, sm_count(), smem_optin(), SplitModel::kWholeTiles,
                                    [&](int64_t ks) { return smem_v4<kNTiles, kMode>(a.m, ks); });
  if constexpr (kMode == kFold) return launch_persistent(gemv_v4_fold_kernel, op, a, plan, false, stream);
  else return launch_persistent(gemv_v4_scale_in_a_kernel<kNTiles>, op, a, plan, false, stream);
}

template <const GemvOp& kOp>
Status gemv_v4(const GemvArgs& a, cudaStream_t stream) {
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  // The fold keeps a second set of sums: with two n-tiles (M > 8) that no longer fits in the 128
  // registers of a 512-thread block, so M > 8 scales in A.
  if (a.m > 8) return launch_v4<2, kScaleInA>(kOp, a, stream);
  return a.group == 128 ? launch_v4<1, kFold>(kOp, a, stream) : launch_v4<1, kScaleInA>(kOp, a, stream);
}

std::vector<SassFact> facts() {
  return {{"gemv_v4_", {}, {"LDGSTS.E.BYPASS.LTC256B.128", "HMMA", "LOP3"}, {"I2F", "I2FP", "LDG.E.128"}, true,
           "weights, x and scales all through cp.async (LDGSTS; no 16-byte LDG), mma.sync (HMMA), LOP3 "
           "unpack, no integer→float convert"},
          {"gemv_v4_fold_kernel", {}, {"HMMA"}, {"HADD2", "HFMA2", "HMUL2"}, true,
           "G = 128: the bias folded into the per-group correction, no packed-BF16 arithmetic"}};
}

constexpr const char* kSummary = "one block per SM, x staged in shared memory, scales in the cp.async ring, "
                                 "bias folded out";
const Register kRegistered{gemv_version(kInt4iGemv, "v4_persistent_smem_x", kSummary, gemv_v4<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
