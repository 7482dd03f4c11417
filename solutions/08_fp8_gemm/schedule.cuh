// Chapter 08's host planning and tile schedule, apart from the kernel bodies: which output tiles
// (and, from v5, which share of K) a persistent block takes, in which order, and how many blocks
// run.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "07_w4a16_gemm/gemm_plan.h"  // split_workspace

namespace lkw::fp8 {

// A persistent grid has one block per SM: lkw::sm_count (lkw/launch.h, through gemm_plan.h),
// 132 on an H200.

// Units of work: an output tile of block_m × block_n, and (v5) one of `splits` shares of its K
// blocks. Block b takes units b, b + grid, b + 2·grid, ... Unit u is tile u % tiles, split
// u / tiles. Tiles go in bands of group_m rows of tiles, M-fastest inside a band: the blocks that
// run at once then take a few bands' A rows and a few columns' B rows, a working set that stays in
// L2 (v3 and v4: one band, plain M-fastest order, one split).
struct TileSchedule {
  int tiles_m, tiles_n, block_m, block_n;
  int group_m;       // tile rows per band
  int splits;        // K shares per tile
  int k_blocks;      // 128-k blocks of K

  __host__ __device__ int tiles() const { return tiles_m * tiles_n; }
  __host__ __device__ int count() const { return tiles() * splits; }
  __host__ __device__ void origin(int unit, int* m0, int* n0) const {
    const int tile = unit % tiles(), band_tiles = group_m * tiles_n, band = tile / band_tiles;
    const int first = band * group_m, rows = tiles_m - first < group_m ? tiles_m - first : group_m, local = tile - band * band_tiles;
    *m0 = (first + local % rows) * block_m;
    *n0 = (local / rows) * block_n;
  }
  // The K blocks [kb0, kb1) of the unit's split: shares differ by one block at most.
  __host__ __device__ void k_range(int unit, int* kb0, int* kb1) const {
    const int split = unit / tiles();
    // k_blocks < 2^24 (K < 2^31) and splits <= the SMs < 2^8: the products fit 32 unsigned bits.
    *kb0 = int(unsigned(split) * unsigned(k_blocks) / unsigned(splits));
    *kb1 = int(unsigned(split + 1) * unsigned(k_blocks) / unsigned(splits));
  }
  // Both: the unit's tile origin and its K blocks.
  struct Unit {
    int m0, n0, kb0, kb1;
  };
  __host__ __device__ Unit locate(int unit) const {
    Unit u;
    origin(unit, &u.m0, &u.n0);
    k_range(unit, &u.kb0, &u.kb1);
    return u;
  }
};

inline TileSchedule plan_tiles(int64_t m, int64_t n, int block_m, int block_n, int64_t k = 0,
                               int group_m = 0, int splits = 1) {
  const int tiles_m = int((m + block_m - 1) / block_m);
  return {tiles_m, int((n + block_n - 1) / block_n), block_m, block_n,
          group_m > 0 ? std::min(group_m, tiles_m) : tiles_m, splits, int((k + 127) / 128)};
}

// One block per SM, or per unit when there are fewer units; max_blocks > 0 caps it (a test makes
// each block walk several units that way, the ring running on across tiles).
inline int persistent_grid(const TileSchedule& s, int max_blocks = 0) {
  const int grid = std::min(s.count(), sm_count());
  return max_blocks > 0 ? std::min(grid, max_blocks) : grid;
}

// The tile width of the warp-specialized versions (128-row tiles): 256 halves A's traffic per
// FLOP, but only pays while the wider tiles still give every SM one. Blockwise scales keep two
// accumulators a thread, room for 192 (two scale blocks of B a tile) at most: v5 takes it where
// those tiles fill the SMs twice over; with fewer, the narrower tiles' extra blocks win
// (ablation_v5_wide_blockwise, lab notes 08).
inline int block_n_for(int64_t m, int64_t n, bool blockwise, int sms, bool wide_blockwise = false) {
  if (blockwise) return wide_blockwise && plan_tiles(m, n, 128, 192).tiles() >= 2 * sms ? 192 : 128;
  return plan_tiles(m, n, 128, 256).tiles() >= sms ? 256 : 128;
}

// v5's K shares: chapter 07's rule (as many as fill the SMs when the tiles cannot), where M <= 64
// only, and with at least kMinBlocksPerShare blocks a share. Measured (ablation_v5_no_split, lab
// notes 08): at M = 128 no split shape gained, and shares of 8 blocks lost to the whole K.
constexpr int kMinBlocksPerShare = 12;
inline int v5_splits(int64_t m, int tiles, int k_blocks, int sms) {
  if (m > 64 || tiles >= sms) return 1;
  return std::max(1, std::min(sms / tiles, k_blocks / kMinBlocksPerShare));
}

// v7's K shares: at small M a tile (128 rows of B) is a stream of its K blocks, and one block's
// deep ring alone pulls much of the bandwidth, while every share pays the ring's fill and the
// slices' reduction (ablation_v7_whole_k, lab notes 08). So K is split only where it is long: the
// shares fill the SMs once at most, are at most kMaxSwapSplits (the slices the last one adds)
// and each at least kMinSwapBlocks K blocks (3072 of K).
constexpr int kMaxSwapSplits = 8, kMinSwapBlocks = 24;
inline int swap_splits(int tiles, int k_blocks, int sms) {
  return std::max(1, std::min({sms / tiles, kMaxSwapSplits, k_blocks / kMinSwapBlocks}));
}

// v5's whole plan for a shape on `sms` SMs: the width above, wide blockwise tiles allowed (or
// block_n where given), bands of group_m tile rows, and the K shares above.
inline TileSchedule plan_v5(int64_t m, int64_t n, int64_t k, bool blockwise, int sms, int group_m,
                            int block_n = 0) {
  if (block_n <= 0) block_n = block_n_for(m, n, blockwise, sms, true);
  TileSchedule s = plan_tiles(m, n, 128, block_n, k, group_m);
  s.splits = v5_splits(m, s.tiles(), s.k_blocks, sms);
  return s;
}

// v5's pairs (blockwise, large M): clusters of `pair` CTAs on tiles one above the other share B's
// tile, each loading a slice of it into all (TMA multicast): per CTA and K block, 128 + N/pair rows
// from L2 instead of 128 + N (what that gains, small: lab notes 08). Units are tiles
// `pair` times as tall (one a cluster), at v5's width, in bands of as many rows; never split (M
// > 128 needs no shares), so the pairs pay only with two tile rows at least.
inline bool pairs_pay(int64_t m) { return m > 128; }
inline TileSchedule plan_v5_pairs(int64_t m, int64_t n, int64_t k, int sms, int group_m, int pair) {
  return plan_tiles(m, n, 128 * pair, block_n_for(m, n, true, sms, true), k, std::max(1, group_m / pair));
}

// v5's plan as each of its registrations takes it: the version's (split_k on, wide off) or an
// ablation's. split_k off keeps every tile's whole K in one block, the plan's other side where the
// tiles cannot fill the SMs; wide gives blockwise tiles 192 columns at every shape (two 96-float
// sums a thread, 4 or 5 stages) for 1.5 times the FLOPs per byte loaded of the 128-wide tile, with
// the plan's shares for that width.
inline TileSchedule plan_v5_variant(int64_t m, int64_t n, int64_t k, bool blockwise, int sms, int group_m,
                                    bool split_k, bool wide) {
  TileSchedule s = plan_v5(m, n, k, blockwise, sms, group_m, wide && blockwise ? 192 : 0);
  if (!split_k) s.splits = 1;
  return s;
}

// v5's split-K workspace for a plan (chapter 07's): each tile's FP32 slices, one a share, and its
// arrival counter. A plan of whole tiles needs none.
inline Status v5_workspace(const TileSchedule& s, float** partials, unsigned** arrivals) {
  *partials = nullptr;
  *arrivals = nullptr;
  if (s.splits <= 1) return {};
  return w4a16::split_workspace(int64_t(s.tiles()) * s.splits * s.block_m * s.block_n, s.tiles(), partials,
                                arrivals);
}

}  // namespace lkw::fp8
