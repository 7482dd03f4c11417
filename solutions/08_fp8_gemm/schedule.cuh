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

// Units of work: an output tile of block_m × block_n and (v5) a share of its K blocks. Block b
// takes units b, b + grid, b + 2·grid, ... The first `whole` tiles are a unit each, the whole K;
// each later tile is `splits` units, one share of K each: unit u >= whole is share
// (u − whole) / rest of tile whole + (u − whole) % rest, rest = tiles − whole (with whole = 0,
// tile u % tiles, share u / tiles). Tiles go in bands of group_m rows of tiles, M-fastest inside
// a band: the blocks that run at once then take a few bands' A rows and a few columns' B rows, a
// working set that stays in L2 (v3 and v4: one band, plain M-fastest order, one split).
struct TileSchedule {
  int tiles_m, tiles_n, block_m, block_n;
  int group_m;   // tile rows per band
  int splits;    // K shares of each split tile
  int k_blocks;  // 128-k blocks of K
  int whole;     // tiles done whole, ahead of the split ones (0: every tile split `splits` ways)

  __host__ __device__ int tiles() const { return tiles_m * tiles_n; }
  __host__ __device__ int count() const { return whole + (tiles() - whole) * splits; }
  // A unit that holds its tile's whole K: it stores the tile itself, no reduction.
  __host__ __device__ bool whole_unit(int unit) const { return unit < whole || splits == 1; }
  // A split unit's tile among the split ones (tile − whole: its slices and counter), and share.
  __host__ __device__ int split_tile_index(int unit) const {
    return (unit - whole) % (tiles() - whole);
  }
  __host__ __device__ int share_index(int unit) const {
    return unit < whole ? 0 : (unit - whole) / (tiles() - whole);
  }
  __host__ __device__ void origin(int unit, int* m0, int* n0) const {
    const int tile = unit < whole ? unit : whole + split_tile_index(unit);
    const int band_tiles = group_m * tiles_n, band = tile / band_tiles, first = band * group_m;
    const int rows = tiles_m - first < group_m ? tiles_m - first : group_m;
    const int local = tile - band * band_tiles;
    *m0 = (first + local % rows) * block_m;
    *n0 = (local / rows) * block_n;
  }
  // The K blocks [kb0, kb1) of the unit: all of them, or its share (shares differ by one block
  // at most).
  __host__ __device__ void k_range(int unit, int* kb0, int* kb1) const {
    const unsigned share = share_index(unit), parts = unit < whole ? 1 : splits;
    // k_blocks < 2^24 (K < 2^31) and splits <= the SMs < 2^8: the products fit 32 unsigned bits.
    *kb0 = int(share * unsigned(k_blocks) / parts);
    *kb1 = int((share + 1) * unsigned(k_blocks) / parts);
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
          group_m > 0 ? std::min(group_m, tiles_m) : tiles_m, splits, int((k + 127) / 128), 0};
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

// v5's K shares where the tiles cannot fill the SMs: chapter 07's rule (as many as fill them),
// where M <= 64 only, and with at least kMinBlocksPerShare blocks a share. Measured
// (ablation_v5_no_split, lab notes 08): at M = 128 no split shape gained, and shares of 8 blocks
// lost to the whole K.
constexpr int kMinBlocksPerShare = 12;
inline int v5_splits(int64_t m, int tiles, int k_blocks, int sms) {
  if (m > 64 || tiles >= sms) return 1;
  return std::max(1, std::min(sms / tiles, k_blocks / kMinBlocksPerShare));
}

// v5's last wave where M > 64 and the tiles fill the blocks (CUTLASS's data-parallel + split-K
// hybrid). `tiles` on `blocks` (the grid) take ceil(tiles / blocks) tile-times, and a last wave of
// rest = tiles % blocks tiles leaves the other blocks idle through it: Llama-3-8B's down_proj at
// M = 2048 is 352 tiles on 132 SMs, 2.67 waves that take 3. The whole waves stay whole; the last
// wave's tiles are split in S shares (S = 2..4, kMinBlocksPerShare blocks a share at least), whose
// rest·S units take ceil(rest·S / blocks) / S tile-times, against 1 for the tiles whole: the S
// with the least (the fewest shares on a tie), where below 1 and where that saves a twentieth of
// the GEMM's tile-times at least (the shares' sums go through memory: a sliver of many waves does
// not pay for that). down_proj: 88 tiles in 3 shares, 2 a block, so 3 tile-times become 2.67; at
// K = 4096 (S <= 2) its 176 halves take 1: no split.
struct LastWave {
  int whole, splits;
};
inline LastWave v5_last_wave(int tiles, int k_blocks, int blocks) {
  const int rest = tiles % blocks;
  LastWave plan{tiles, 1};
  int waves = 1;  // the plan's units a block in the last wave: waves / plan.splits tile-times
  for (int s = 2; s <= 4 && rest > 0 && k_blocks / s >= kMinBlocksPerShare; ++s) {
    const int w = (rest * s + blocks - 1) / blocks;
    if (w * plan.splits < waves * s) plan = {tiles - rest, s}, waves = w;
  }
  const int unsplit = tiles / blocks + 1;  // tile-times with the last wave whole
  if (20 * (plan.splits - waves) < plan.splits * unsplit) return {tiles, 1};
  return plan;
}

// v5's whole plan for a shape on `sms` SMs: the width above, wide blockwise tiles allowed (or
// block_n where given), bands of group_m tile rows, and the K shares above: all tiles split at
// small M, the last wave's split at large M. max_blocks > 0 (a test's cap on the grid) counts in
// the last wave only, which is the grid's: the width and the small-M shares stay the SMs'.
inline TileSchedule plan_v5(int64_t m, int64_t n, int64_t k, bool blockwise, int sms, int group_m,
                            int block_n = 0, int max_blocks = 0) {
  if (block_n <= 0) block_n = block_n_for(m, n, blockwise, sms, true);
  TileSchedule s = plan_tiles(m, n, 128, block_n, k, group_m);
  const int blocks = max_blocks > 0 ? std::min(sms, max_blocks) : sms;
  if (m > 64 && s.tiles() >= blocks) {
    const LastWave last = v5_last_wave(s.tiles(), s.k_blocks, blocks);
    s.whole = last.whole, s.splits = last.splits;
  } else {
    s.splits = v5_splits(m, s.tiles(), s.k_blocks, sms);
    s.whole = s.splits == 1 ? s.tiles() : 0;
  }
  return s;
}

// v5's plan as each of its registrations takes it: the version's (split_k on, wide off) or an
// ablation's. split_k off keeps every tile's whole K in one block, the plan's other side; wide
// gives blockwise tiles 192 columns at every shape (two 96-float sums a thread, 4 or 5 stages)
// for 1.5 times the FLOPs per byte loaded of the 128-wide tile, with the plan's shares for that
// width.
inline TileSchedule plan_v5_variant(int64_t m, int64_t n, int64_t k, bool blockwise, int sms,
                                    int group_m, bool split_k, bool wide, int max_blocks = 0) {
  const int block_n = wide && blockwise ? 192 : 0;
  TileSchedule s = plan_v5(m, n, k, blockwise, sms, group_m, block_n, max_blocks);
  if (!split_k) s.splits = 1, s.whole = s.tiles();
  return s;
}

// v5's split-K workspace for a plan (chapter 07's): each split tile's FP32 slices, one a share,
// and its arrival counter. Whole tiles need none.
inline Status v5_workspace(const TileSchedule& s, float** partials, unsigned** arrivals) {
  *partials = nullptr;
  *arrivals = nullptr;
  if (s.splits <= 1) return {};
  const int split_tiles = s.tiles() - s.whole;
  return w4a16::split_workspace(int64_t(split_tiles) * s.splits * s.block_m * s.block_n,
                                split_tiles, partials, arrivals);
}

}  // namespace lkw::fp8
