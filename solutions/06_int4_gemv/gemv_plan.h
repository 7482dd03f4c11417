// Chapter 06's host-side scheduling: how far the tensor-core GEMVs split K, how a persistent
// block's steps are shared out over its warps, and the split-K workspace. Kept apart from the
// kernels, and tested on the host (tests/cpp/06_int4_gemv/host_checks.cu): each function here is
// a small model with the shape of the problem as its only input.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>

#include "lkw/launch.h"  // sm_count
#include "lkw/status.h"
#include "lkw/tensor.h"

namespace lkw::gemv {

constexpr int kTileRows = 16;  // rows of an mma A operand: the rows a warp's tile holds
constexpr int kIterK = 256;    // k per step: 4 lanes × 2 chunks × 32 weights
constexpr int kMaxSplits = 64;
constexpr int kBlockWarps = 16;  // warps of a persistent block (one block per SM)

// A tile's split-K partial sums in the workspace: S·M·16 floats, rounded up to whole 128-byte
// lines so that the lines can be dropped from L2 once summed (a line never holds two tiles').
__host__ __device__ __forceinline__ int64_t tile_partials(int splits, int m) {
  return (int64_t(splits) * m * kTileRows + 31) / 32 * 32;
}

inline size_t smem_optin() {
  static const size_t bytes = [] {
    int dev = 0, b = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return size_t(b);
  }();
  return bytes;
}

// Raises a kernel's dynamic shared memory limit, once per kernel address. The key is the address,
// not the template instantiation: a kernel template used from several translation units may have
// one host-side address per unit, and the attribute holds only for the copy it was set on.
inline cudaError_t allow_shared_memory(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::unordered_set<const void*> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count(kernel)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e == cudaSuccess) done.insert(kernel);
  return e;
}

// The split-K workspace: partial sums and per-tile arrival counters, allocated on first need and
// grown (never shrunk) for the process; the counters are zeroed once here and every launch leaves
// them at zero. Launches that share it must be ordered (one stream).
inline Status workspace(int64_t floats, int64_t tiles, float** partials, unsigned** arrivals) {
  static std::mutex mutex;
  static float* partials_gl = nullptr;
  static unsigned* arrivals_gl = nullptr;
  static int64_t have_floats = 0, have_tiles = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (floats > have_floats) {
    cudaFree(partials_gl);
    partials_gl = nullptr;
    have_floats = 0;
    const int64_t want = std::max<int64_t>(floats, 1 << 20);
    if (cudaMalloc(&partials_gl, want * sizeof(float)) != cudaSuccess)
      return error(Code::kCudaError, std::string("split-K workspace: ") + cudaGetErrorString(cudaGetLastError()));
    have_floats = want;
  }
  if (tiles > have_tiles) {
    cudaFree(arrivals_gl);
    arrivals_gl = nullptr;
    have_tiles = 0;
    const int64_t want = std::max<int64_t>(tiles, 1 << 14);
    if (cudaMalloc(&arrivals_gl, want * sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(arrivals_gl, 0, want * sizeof(unsigned)) != cudaSuccess)
      return error(Code::kCudaError, std::string("split-K counters: ") + cudaGetErrorString(cudaGetLastError()));
    have_tiles = want;
  }
  *partials = partials_gl;
  *arrivals = arrivals_gl;
  return {};
}

// ---------------------------------------------------------------------------------------------
// v3's split-K: grid (T = ⌈N / 16⌉ tiles, S), `wave` = the blocks resident on the whole GPU, each
// block `warps` warps taking turns along K (so a split keeps at least `warps` steps). With one wave
// or less, the fewest splits that make the wave half full (never a second wave); between one and
// two waves, the S ≤ 4 whose last wave is fullest; past two waves S = 1 (the last wave is a small
// part). k per split is a whole number of steps, and S counts the splits that k per split makes.
struct SplitK {
  int64_t k_split;  // k per split, a multiple of kIterK
  int splits;
};

inline SplitK plan_split_k(int64_t n, int64_t k, int64_t wave, int warps) {
  const int64_t tiles = ceil_div(n, kTileRows), iters = ceil_div(k, kIterK);
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(iters / warps, kMaxSplits));
  int64_t splits = 1;
  if (tiles <= wave) {  // one wave: at least half full, never a second
    splits = std::min({cap, ceil_div(wave / 2, tiles), std::max<int64_t>(1, wave / tiles)});
  } else if (tiles < 2 * wave) {  // a second wave: the S ≤ 4 whose last wave is fullest
    double best_fill = 0;
    for (int64_t s = 1; s <= std::min<int64_t>(cap, 4); ++s) {
      const int64_t blocks = tiles * s;
      const double fill = double(blocks) / double(ceil_div(blocks, wave) * wave);
      if (fill > best_fill + 0.02) {  // more splits only for a clearly fuller last wave
        best_fill = fill;
        splits = s;
      }
    }
  }
  const int64_t per_split = ceil_div(iters, splits);
  return {per_split * kIterK, int(ceil_div(iters, per_split))};
}

// ---------------------------------------------------------------------------------------------
// How far a persistent kernel splits K. One block of `warps` warps per SM, the blocks divided
// evenly among S splits (⌊sms / S⌋ each); a block holds T = ⌈tiles / blocks⌉ tiles of ⌈iters / S⌉
// steps. Each model below is a time in units of one streaming warp's step; of the S from s_min
// (the smallest whose x slice fits in shared memory) to s_max, the least time wins, the smaller S
// on a tie (fewer partial sums).

// About this many busy warps keep an SM streaming: with fewer, a warp's chain of tiles sets the
// time (measured with S forced: book/docs/lab_notes_06.md).
constexpr int64_t kWarpsToStream = 8;

// Deep ring (v4, v5): a block streams while enough warps are busy, so its time is its steps plus
// one per tile for the store; with whole tiles per warp (v4) a warp's chain of ⌈T / warps⌉ tiles
// may take longer. With the steps shared evenly (balanced, v5) every warp streams, and the x slice
// staged before the first step weighs in: one step per 2 KB of it (fitted to the measured best S).
inline int64_t split_time(int64_t tiles, int64_t iters, int sms, int warps, int64_t s, bool balanced, int64_t m) {
  const int64_t blocks = std::max<int64_t>(1, sms / s), per_block = ceil_div(tiles, blocks);
  const int64_t steps = ceil_div(iters, s) + 1;
  const int64_t chain = balanced ? 0 : ceil_div(per_block, warps) * steps * kWarpsToStream;
  const int64_t x_slice = balanced ? m * (steps - 1) / 4 : 0;
  return std::max(per_block * steps, chain) + x_slice;
}

// Shallow ring (v6, v7): a warp holds one step in flight while it computes another, too little to
// stream alone, so a block streams at full rate only while all its warps are busy: its tiles go in
// whole rounds of `warps`. Plus the x slice (one unit per row and step) and, with S > 1, 48 units
// per round for the split-K finish (a fence, a count, the last arrival's loads). Both weights are
// fitted to an S sweep on the H200 (book/docs/lab_notes_06.md).
inline int64_t rounds_time(int64_t tiles, int64_t iters, int sms, int warps, int64_t s, int64_t m) {
  const int64_t blocks = std::max<int64_t>(1, sms / s), per_block = ceil_div(tiles, blocks);
  const int64_t steps = ceil_div(iters, s), rounds = ceil_div(per_block, warps);
  return rounds * warps * (steps + 1) + m * steps + (s > 1 ? 48 * rounds : 0);
}

template <class TimeOf>
int64_t least_time_split(int64_t s_min, int64_t s_max, TimeOf&& time_of) {
  int64_t best = s_min, best_time = -1;
  for (int64_t s = s_min; s <= std::max(s_min, s_max); ++s) {
    const int64_t time = time_of(s);
    if (best_time < 0 || time < best_time) best = s, best_time = time;
  }
  return best;
}

inline int64_t plan_splits(int64_t tiles, int64_t iters, int sms, int warps, int64_t s_min, int64_t s_max,
                           bool balanced = false, int64_t m = 0) {
  return least_time_split(s_min, s_max,
                          [&](int64_t s) { return split_time(tiles, iters, sms, warps, s, balanced, m); });
}

inline int64_t plan_rounds(int64_t tiles, int64_t iters, int sms, int warps, int64_t s_min, int64_t s_max,
                           int64_t m) {
  return least_time_split(s_min, s_max, [&](int64_t s) { return rounds_time(tiles, iters, sms, warps, s, m); });
}

// A persistent launch's plan: k per split (whole steps), S, the dynamic shared memory.
struct Plan {
  int64_t k_split;
  int splits;
  size_t smem;
};

enum class SplitModel { kWholeTiles, kBalanced, kRounds };

// The smallest S whose footprint smem_of(k_split) fits in `limit`, then the model's S from there
// (or `force`, where it fits: the whole row of x in one split, v6).
template <class SmemOf>
Plan plan_persistent(int64_t m, int64_t n, int64_t k, int sms, size_t limit, SplitModel model, SmemOf&& smem_of,
                     int64_t force = 0) {
  const int64_t iters = ceil_div(k, kIterK), tiles = ceil_div(n, kTileRows);
  auto per_split = [&](int64_t s) { return ceil_div(iters, s) * kIterK; };
  int64_t s = 1;
  while (s < iters && smem_of(per_split(s)) > limit) ++s;
  const int64_t s_max = std::min<int64_t>({iters, kMaxSplits, sms});
  if (force > 0)
    s = std::max<int64_t>(s, std::min<int64_t>(force, iters));
  else if (model == SplitModel::kRounds)
    s = plan_rounds(tiles, iters, sms, kBlockWarps, s, s_max, m);
  else
    s = plan_splits(tiles, iters, sms, kBlockWarps, s, s_max, model == SplitModel::kBalanced, m);
  const int64_t k_split = per_split(s);
  return {k_split, int(ceil_div(iters, k_split / kIterK)), smem_of(k_split)};
}

// Where warp v's run starts among its block's T tiles of `iters` steps (v5 on): the steps cut
// evenly, anywhere (a tile may fall on two or more warps, summed after the loop), or at whole
// tiles (v6 and v7 with S > 1: the shallow ring's model counts whole rounds of tiles).
// No run-time division: 16 warps make both a shift.
__host__ __device__ __forceinline__ unsigned run_start(unsigned v, unsigned tiles, unsigned iters, bool whole_tiles) {
  static_assert(kBlockWarps == 16, "the divisions below are shifts");
  return whole_tiles ? (v * tiles / kBlockWarps) * iters : v * (tiles * iters) / kBlockWarps;
}

// v6's S for the BF16 fold (M ≤ 2, G = 128): S = 1, the whole row of x in shared memory, where it
// fits and pays: at M = 1 at any K, at M = 2 up to K = kWholeRowMaxK2 (past it two rows of x and
// their Σx cost more than the split-K finish they save); else the shallow ring's model.
constexpr int64_t kWholeRowMaxK2 = 8192;
inline int64_t whole_row_force(int64_t m, int64_t k) { return (m == 1 || k <= kWholeRowMaxK2) ? 1 : 0; }

}  // namespace lkw::gemv
