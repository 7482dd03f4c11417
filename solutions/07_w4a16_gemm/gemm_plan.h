// Host planning of v5's split-K and v10's stream-K, kept apart from the kernels: how many splits
// of K a launch takes, how v10's persistent blocks share the tiles' stages, and the workspace the
// parts of a tile meet in. Host-tested (tests/cpp/07_w4a16_gemm/host_checks.cu).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "lkw/status.h"

namespace lkw::w4a16 {

constexpr int64_t kMinKTilesPerSplit = 4;  // a split streams at least 256 k: its ring must fill

// Splits of K for `tiles` output tiles of `k_tiles` stages on `sms` SMs holding `blocks_per_sm`
// blocks each: none once the tiles alone fill every resident slot (large M); else as many as fill
// the slots, each split keeping at least kMinKTilesPerSplit stages. At M = 1 on 8192 × 28672 the
// 32 tiles would leave 100 of 132 SMs idle; twelve splits put a block on every slot.
inline int splits_for(int64_t tiles, int64_t k_tiles, int sms, int blocks_per_sm) {
  const int64_t slots = int64_t(sms) * std::max(blocks_per_sm, 1);
  if (tiles >= slots) return 1;
  const int64_t by_slots = slots / tiles, by_k = k_tiles / kMinKTilesPerSplit;
  return int(std::max<int64_t>(1, std::min(by_slots, by_k)));
}

// An even cut of k_tiles stages into S splits: each gets `base`, the first `extra` one more. The
// division happens here, on the host: in a kernel it would cost a convert-and-iterate sequence.
struct SplitCut {
  int64_t base;
  int extra;
};
inline SplitCut split_cut(int64_t k_tiles, int splits) { return {k_tiles / splits, int(k_tiles % splits)}; }

// The stages [begin, end) of split s.
__host__ __device__ inline void split_range(SplitCut cut, int s, int64_t* begin, int64_t* end) {
  *begin = s * cut.base + (s < cut.extra ? s : cut.extra);
  *end = *begin + cut.base + (s < cut.extra ? 1 : 0);
}

// Stream-K (v10): the tiles' stages, token tile fastest ("units": tile·k_tiles + stage), dealt
// out in equal runs to `blocks` persistent blocks, one an SM; block b runs units [at[b], at[b+1]).
// A run is a sequence of segments, the stages [kb, ke) of one tile: whole tiles in the middle,
// parts of a tile at its two ends. The plan is made on the host, where dividing is free: the
// kernel walks it with increments and compares, no divide (a divide is an int-to-float convert
// and a reciprocal in SASS). blocks = 0: the data-parallel grid, one block a whole tile.
constexpr int kMaxStreamBlocks = 160;  // the plan travels in the kernel's parameters
struct StreamKAt {
  uint32_t tn;
  uint16_t tm, stage;
};
struct StreamKPlan {
  int blocks = 0, tiles_m = 1, k_tiles = 0;
  StreamKAt at[kMaxStreamBlocks + 1] = {};  // at[blocks]: the end, (tiles_n, 0, 0)
};

// Stream-K where the tiles leave a wave ragged and the token tiles are few: fewer tiles than
// SMs, or up to two token tiles (x stays in L2 whatever tile a block is on) and a tile count that
// is not a whole number of waves (224 tiles on 132 SMs: the second wave leaves 40 idle). Each
// block keeps at least kMinKTilesPerSplit stages.
inline StreamKPlan stream_k_plan(int64_t tiles_m, int64_t tiles_n, int64_t k_tiles, int sms) {
  StreamKPlan p;
  const int64_t tiles = tiles_m * tiles_n, units = tiles * k_tiles;
  const bool ragged = tiles < sms || (tiles_m <= 2 && tiles % sms != 0);
  if (!ragged || sms < 1 || tiles_m > 0xffff || k_tiles > 0xffff || tiles_n > 0xffffffffll)
    return p;
  p.blocks = int(std::min<int64_t>({sms, kMaxStreamBlocks,
                                    std::max<int64_t>(1, units / kMinKTilesPerSplit)}));
  p.tiles_m = int(tiles_m), p.k_tiles = int(k_tiles);
  for (int b = 0; b <= p.blocks; ++b) {
    const int64_t u = b * units / p.blocks, tile = u / k_tiles;
    p.at[b] = {uint32_t(tile / tiles_m), uint16_t(tile % tiles_m), uint16_t(u % k_tiles)};
  }
  return p;
}

// One segment of a run: stages [kb, ke) of tile (tm, tn), linear index tn·tiles_m + tm.
struct Segment {
  int tm;
  int64_t tn;
  int kb, ke;
};
__host__ __device__ inline int64_t unit_of(const StreamKPlan& p, int64_t tm, int64_t tn, int kt) {
  return (tn * p.tiles_m + tm) * p.k_tiles + kt;
}
__host__ __device__ inline int64_t unit_at(const StreamKPlan& p, int b) {
  return unit_of(p, p.at[b].tm, p.at[b].tn, p.at[b].stage);
}
// The segment of block b's run that starts at (tm, tn, kb); empty (kb == ke) past the run's end.
__host__ __device__ inline Segment segment_at(const StreamKPlan& p, int b, int tm, int64_t tn,
                                              int kb) {
  const StreamKAt& end = p.at[b + 1];
  const bool last = tm == end.tm && tn == end.tn;  // the run ends inside (or at) this tile
  Segment s{tm, tn, kb, last ? int(end.stage) : p.k_tiles};
  if (!last && unit_of(p, tm, tn, kb) >= unit_at(p, b + 1)) s.ke = s.kb;  // past the end
  return s;
}
__host__ __device__ inline Segment first_segment(const StreamKPlan& p, int b) {
  return segment_at(p, b, p.at[b].tm, p.at[b].tn, p.at[b].stage);
}
__host__ __device__ inline Segment next_segment(const StreamKPlan& p, int b, const Segment& s) {
  const bool wrap = s.tm + 1 == p.tiles_m;
  return segment_at(p, b, wrap ? 0 : s.tm + 1, wrap ? s.tn + 1 : s.tn, 0);
}

// A cut tile's parts meet in the workspace: each block has two partial slots, 2b for the part at
// the start of its run, 2b + 1 for the part at its end. The part summed i-th (i < parts) of the
// tile whose stage 0 is unit u0: blocks first, first + 1, …; only `first` can have started before
// the tile (then the tile is the end of its run). first: walk back from any block of the tile.
struct TileParts {
  int first, parts;
  bool first_is_end;  // the first block's part is the end of its run: slot 2·first + 1
};
__host__ __device__ inline TileParts tile_parts(const StreamKPlan& p, int b, int64_t u0) {
  TileParts t{b, 0, false};
  while (unit_at(p, t.first) > u0) --t.first;
  t.first_is_end = unit_at(p, t.first) < u0;
  while (t.first + t.parts < p.blocks && unit_at(p, t.first + t.parts) < u0 + p.k_tiles) ++t.parts;
  return t;
}
__host__ __device__ inline int part_slot(const TileParts& t, int i) {
  return 2 * (t.first + i) + (i == 0 && t.first_is_end ? 1 : 0);
}

// The split-K workspace: FP32 partial tiles and per-tile arrival counters, allocated on first need
// and grown (never shrunk) for the process. The counters are zeroed here once and every launch
// leaves them at zero. Launches that share it must be ordered (one stream).
inline Status split_workspace(int64_t floats, int64_t tiles, float** partials, unsigned** arrivals) {
  static std::mutex mutex;
  static float* partials_gl = nullptr;
  static unsigned* arrivals_gl = nullptr;
  static int64_t have_floats = 0, have_tiles = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (floats > have_floats) {
    cudaFree(partials_gl);
    have_floats = 0;
    if (cudaMalloc(&partials_gl, floats * sizeof(float)) != cudaSuccess)
      return error(Code::kCudaError, std::string("split-K workspace: ") + cudaGetErrorString(cudaGetLastError()));
    have_floats = floats;
  }
  if (tiles > have_tiles) {
    cudaFree(arrivals_gl);
    have_tiles = 0;
    if (cudaMalloc(&arrivals_gl, tiles * sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(arrivals_gl, 0, tiles * sizeof(unsigned)) != cudaSuccess)
      return error(Code::kCudaError, std::string("split-K counters: ") + cudaGetErrorString(cudaGetLastError()));
    have_tiles = tiles;
  }
  *partials = partials_gl;
  *arrivals = arrivals_gl;
  return {};
}

}  // namespace lkw::w4a16
