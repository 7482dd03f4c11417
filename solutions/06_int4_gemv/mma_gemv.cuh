// The tensor-core GEMV's building blocks, shared by v3_mma_split_k, v4 and v5 (persistent_gemv.cuh):
// async copies, the mma, the A-operand unpack, a tile's store with split-K, and the host's
// split-K workspace.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "02_int4_dequant/dequant.cuh"
#include "int4_gemv.cuh"

namespace lkw::gemv::mma {

constexpr int kTileRows = 16;  // rows of an mma A operand: the rows a warp's tile holds

// A tile's split-K partial sums in the workspace: S·M·16 floats, rounded up to whole 128-byte
// lines so that store_tile can drop them from L2 once summed (a line never holds two tiles').
__host__ __device__ __forceinline__ int64_t tile_partials(int splits, int m) {
  return (int64_t(splits) * m * kTileRows + 31) / 32 * 32;
}

// cp.async.cg.shared.global, 16 bytes: a global→shared copy that holds no register while it is
// in flight and bypasses L1 (.cg: the weights are read once). With plain loads the next
// iterations' weights would sit in registers, and ptxas, to shorten their lives, sinks such
// prefetches to the end of the loop body, where they no longer overlap anything. kPrefetch is the
// L2 prefetch size the copy asks for on a miss: 256 (v3 to v10), the whole 256-byte pair of lines
// at once, since the warp reads both anyway; 128 (v11), the copy's own line only
// (v11_line_prefetch.cu says why the smaller one is faster).
// `valid` false copies 0 bytes and zero-fills the 16 (the K tail), reading nothing.
// kEvictFirst (v14): the copy carries an L2 cache policy of evict_first (createpolicy, fraction
// 1.0): its line is the first L2 gives up when it needs room, so a stream of lines read once does
// not push out the lines that are read again (scales shared by a row's steps, x, the y of earlier
// kernels). With the 128-byte prefetch only: on v4's and v5's 256-byte pairs, whose second line a
// later copy reads, the bench measured it slower (the book's v14 section).
template <int kPrefetch = 256, bool kEvictFirst = false>
__device__ __forceinline__ void cp_async_16(void* dst_sh, const void* src_gl, bool valid) {
  static_assert(kPrefetch == 256 || kPrefetch == 128, "an L2 prefetch of 256 or 128 bytes");
  static_assert(!kEvictFirst || kPrefetch == 128, "evict_first with the 128-byte prefetch only");
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_sh));
  if constexpr (kEvictFirst) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src_gl), "r"(valid ? 16 : 0), "l"(policy)
                 : "memory");
  } else if constexpr (kPrefetch == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src_gl),
                 "r"(valid ? 16 : 0)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src_gl),
                 "r"(valid ? 16 : 0)
                 : "memory");
  }
}
// Closes the group of copies issued since the last commit; wait<n> returns once at most n groups
// are still in flight (the lane's own copies: each lane reads back only what it copied itself).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// mma.sync m16n8k16, BF16 × BF16 + FP32: c += A·B. Fragments (g = lane / 4, t = lane % 4):
// a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9];
// b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].
// Written as PTX because CUDA C++ exposes it only through the WMMA API, whose fragment layout
// is opaque — and this kernel picks which weights sit in which k-slot.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mma.sync.m16n8k16 with BF16 needs sm_80 or newer"
#endif
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with FP16 A and B (v5's fold: x converted to FP16, the weights 1024 + q or 1024 + 16q).
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A's four pairs from one word of one row: exact q − 8 (scale applied later, on the sums), or
// BF16(s·(q − 8)), or with zero points BF16(q·s − zs).
template <bool kScaleInA, bool kZp>
__device__ __forceinline__ void unpack_a(uint32_t word, __nv_bfloat162 s2, __nv_bfloat162 neg_zs2,
                                         uint32_t (&a)[4]) {
  __nv_bfloat162 q[4];
  int4::u4_to_bf16_magic<!kZp>(word, q);
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    if constexpr (kZp) q[p] = __hfma2(q[p], s2, neg_zs2);
    else if constexpr (kScaleInA) q[p] = __hmul2(q[p], s2);
    a[p] = bits_of(q[p]);
  }
}

// −BF16(z·s) for a zero point z (4 bits): z·s is exact in FP32 (4 × 8 significant bits), so one
// rounding, as chapter 02's reference. z becomes a float through the FP32 magic 2^23 + z (no I2F).
__device__ __forceinline__ __nv_bfloat162 neg_zero_times_scale(uint32_t z, __nv_bfloat16 s) {
  const float zf = __uint_as_float(0x4b000000u | z) - 8388608.0f;
  return __bfloat162bfloat162(__float2bfloat16_rn(-zf * bf16_to_f32(s)));
}

// Split-K through the workspace, in two parts that a kernel may call apart (v6 writes a tile's
// partials when the tile ends and counts it later, with one __threadfence for several tiles):
// write_partials puts this split's sums of the tile in the workspace, plain stores; arrive_and_sum,
// once a __threadfence has made them visible device-wide, counts the tile's arrival, and the last
// of its S warps to arrive adds the S partials in split order and stores y (sum_partials). The partials are dead
// once summed, but L2 holds them as dirty lines and would write them back to DRAM when it evicts
// them, for nothing: `discard.global.L2` drops the tile's lines without a write-back (the next
// launch writes before it reads). acc as the mma C fragments of n-tiles j: columns
// m = 8j + 2t + (e & 1), rows g + 8·(e ≥ 2). P has y, partials, arrivals, m, n, splits (the
// kernel's parameters).
template <int kNTiles, class P>
__device__ __forceinline__ void write_partials(const P& p, const float (&acc)[kNTiles][4], int64_t tile,
                                               int split, int g, int t) {
  // BEGIN SOLUTION: write acc to p.partials + tile·tile_partials(S, M) + split·M·16, as [m][16] (m < M).
  float* mine = p.partials + tile * tile_partials(p.splits, p.m) + split * int64_t(p.m) * kTileRows;
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 8 * j + 2 * t + (e & 1);
      if (m < p.m) mine[m * kTileRows + g + (e >= 2 ? 8 : 0)] = acc[j][e];
    }
  }
  // END SOLUTION
}

// The last of a tile's S arrivals: the S partials added in split order, y stored, the counter
// reset for the next launch, the partials' lines dropped.
template <int kNTiles, class P>
__device__ __forceinline__ void sum_partials(const P& p, int64_t tile, int g, int t, int lane) {
  // BEGIN SOLUTION: __threadfence; sum the S partials in split order with __ldcg, the splits in the outer loop so that a lane's loads of one split are in flight together; write y (m < M, rows < N); lane 0 resets the counter; __syncwarp, then discard.global.L2 each 128-byte line of the tile's partials.
  __threadfence();
  const int64_t stride = int64_t(p.m) * kTileRows, per_tile = tile_partials(p.splits, p.m);
  float* all = p.partials + tile * per_tile;
  // Splits outside, a lane's 4 (or 8) values inside: each split's loads go out together, one L2
  // round trip per split. (Values outside and splits inside, the loop that a first version had,
  // waits for each load before the next: 4·S round trips, about 5 µs at M = 8, S = 2, at the end
  // of v6's kernel, where nothing hides them.)
  float sum[kNTiles][4] = {};
#pragma unroll 4
  for (int s = 0; s < p.splits; ++s) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = 8 * j + 2 * t + (e & 1);
        if (m < p.m) sum[j][e] += __ldcg(all + s * stride + m * kTileRows + g + (e >= 2 ? 8 : 0));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 8 * j + 2 * t + (e & 1);
      const int64_t row = tile * kTileRows + g + (e >= 2 ? 8 : 0);
      if (m < p.m && row < p.n) p.y[m * p.n + row] = __float2bfloat16_rn(sum[j][e]);  // (M, N)
    }
  }
  if (lane == 0) p.arrivals[tile] = 0;  // ready for the next launch
  __syncwarp();  // every lane has read its sums before any line goes
  for (int64_t line = lane; line < per_tile / 32; line += 32)
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(all + 32 * line) : "memory");
  // END SOLUTION
}

// Counts the tile's arrival (its partials already visible); the last of the S sums the tile.
template <int kNTiles, class P>
__device__ __forceinline__ void arrive_and_sum(const P& p, int64_t tile, int g, int t, int lane) {
  // BEGIN SOLUTION: __syncwarp; lane 0 atomicAdd on p.arrivals[tile], shuffled to the warp; the last (S − 1 before it) calls sum_partials.
  __syncwarp();
  unsigned before = 0;
  if (lane == 0) before = atomicAdd(p.arrivals + tile, 1u);
  before = __shfl_sync(0xffffffffu, before, 0);
  if (before == unsigned(p.splits - 1)) sum_partials<kNTiles>(p, tile, g, t, lane);
  // END SOLUTION
}

// A tile's result, by the one warp that holds it: straight to y with one split, else through the
// workspace (the two parts above, the fence between them).
template <int kNTiles, class P>
__device__ __forceinline__ void store_tile(const P& p, const float (&acc)[kNTiles][4], int64_t tile,
                                           int split, int g, int t, int lane) {
  if (p.splits == 1) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = 8 * j + 2 * t + (e & 1);
        const int64_t row = tile * kTileRows + g + (e >= 2 ? 8 : 0);
        if (m < p.m && row < p.n) p.y[m * p.n + row] = __float2bfloat16_rn(acc[j][e]);  // (M, N)
      }
    }
    return;
  }
  write_partials<kNTiles>(p, acc, tile, split, g, t);
  __threadfence();  // the partials are visible device-wide before the count says so
  arrive_and_sum<kNTiles>(p, tile, g, t, lane);
}

// ---------------------------------------------------------------------------------------------
// Host side.

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The split-K workspace: partial sums and per-tile arrival counters, allocated on first need
// and grown (never shrunk) for the process; the counters are zeroed once here and left at zero
// by every launch.
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
      return error(Code::kCudaError,
                   std::string("split-K workspace: ") + cudaGetErrorString(cudaGetLastError()));
    have_floats = want;
  }
  if (tiles > have_tiles) {
    cudaFree(arrivals_gl);
    arrivals_gl = nullptr;
    have_tiles = 0;
    const int64_t want = std::max<int64_t>(tiles, 1 << 14);
    if (cudaMalloc(&arrivals_gl, want * sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(arrivals_gl, 0, want * sizeof(unsigned)) != cudaSuccess)
      return error(Code::kCudaError,
                   std::string("split-K counters: ") + cudaGetErrorString(cudaGetLastError()));
    have_tiles = want;
  }
  *partials = partials_gl;
  *arrivals = arrivals_gl;
  return {};
}

// How far a persistent kernel splits K: one block of `warps` warps per SM, the blocks divided
// evenly among S splits (B = ⌊sms / S⌋ each), a warp taking whole tiles of its split in turn. Of
// the S from `s_min` (the smallest whose footprint fits) up to `s_max`, the one that minimizes a
// model of the busiest block's time: it holds T = ⌈tiles / B⌉ tiles of ⌈iters / S⌉ steps, plus one
// step's worth per tile for its store and partial sums. With enough of its warps busy the block
// streams, and its time is its steps, T·(steps + 1); with too few, each warp's chain of
// ⌈T / warps⌉ tiles is the time, a warp alone taking about kWarpsToStream times as long per step
// as a streaming SM (the model's one assumption: about that many warps keep an SM streaming).
// Ties go to the smaller S: fewer partial sums. kWarpsToStream was 12 until tools/gemv_timeline
// (H200, 2026-11-30) measured v5 at 8192 × 28672, M = 1 with S forced: S = 2, 8 busy warps per
// block each streaming one tile of 56 steps, took 37.8 µs; S = 4, 16 busy warps, 40.7 µs (the
// model's choice with 12). Eight warps keep an SM streaming.
//
// balanced (v6): a block's steps are shared out evenly over its warps, whatever tiles they fall
// in, so every warp streams as long as the block has a step per warp, and the time is T·steps.
// It also weighs the block's x slice, M rows of ⌈iters / S⌉ steps of 256 elements, staged before
// the first step, against the splits' partial sums and the tiles they cut: one step per 2 KB of
// x, M·steps/4. That weight is fitted, not derived: of 0, 1/8, 1/4 and 1/2 step per KB it is the
// one whose choices come closest to the fastest S measured for v6 with tools/gemv_timeline (H200,
// 2026-11-30): S = 1 at 28672 × 8192 for M ≤ 2 and at 4096 × 4096, M = 1; S = 2 at M = 4 and 8;
// S = 4 at 8192 × 28672, M = 2; at 8192 × 28672, M = 1 it picks S = 2 (41.4 µs) where S = 4 was
// fastest (40.1 µs) and S = 1, with 57 KB of x to stage per block, slowest (42.8 µs).
constexpr int64_t kWarpsToStream = 8;

// The model's time of one S (in steps of a streaming warp).
inline int64_t split_time(int64_t tiles, int64_t iters, int sms, int warps, int64_t s, bool balanced,
                          int64_t m) {
  const int64_t blocks = std::max<int64_t>(1, sms / s), per_block = ceil_div(tiles, blocks);
  const int64_t steps = ceil_div(iters, s) + 1;
  const int64_t chain = balanced ? 0 : ceil_div(per_block, warps) * steps * kWarpsToStream;
  const int64_t x_slice = balanced ? m * (steps - 1) / 4 : 0;
  return std::max(per_block * steps, chain) + x_slice;
}

// The S from s_min to s_max (s_min at least) of least time_of(S), the smallest on a tie (fewer
// partial sums).
template <class TimeOf>
int64_t least_time_split(int64_t s_min, int64_t s_max, TimeOf&& time_of) {
  int64_t best = s_min, best_time = -1;
  for (int64_t s = s_min; s <= std::max(s_min, s_max); ++s) {
    const int64_t time = time_of(s);
    if (best_time < 0 || time < best_time) best = s, best_time = time;
  }
  return best;
}

inline int64_t plan_splits(int64_t tiles, int64_t iters, int sms, int warps, int64_t s_min,
                           int64_t s_max, bool balanced = false, int64_t m = 0) {
  return least_time_split(s_min, s_max, [&](int64_t s) { return split_time(tiles, iters, sms, warps, s, balanced, m); });
}

// Whole tiles seen scheduler by scheduler, for v6's choice between whole tiles and balanced steps
// (in the units of split_time): warp w of a block issues from scheduler w mod 4 and holds
// ⌈(T − w) / warps⌉ of its T tiles, and the scheduler with the most tiles' steps sets the block's
// time, four schedulers' worth of it (a warp's steps go slower when it shares its scheduler with
// more warps: with 14 tiles on 16 warps, 4, 4, 3 and 3 per scheduler, tools/gemv_timeline saw
// the warps of the schedulers with four end about 4 µs after the others); never less than
// split_time's chain of tiles.
inline int64_t whole_tiles_time(int64_t tiles, int64_t iters, int sms, int warps, int64_t s) {
  const int64_t blocks = std::max<int64_t>(1, sms / s), per_block = ceil_div(tiles, blocks);
  const int64_t steps = ceil_div(iters, s) + 1;
  int64_t busiest = 0;
  for (int q = 0; q < 4; ++q) {
    int64_t on_q = 0;
    for (int w = q; w < warps; w += 4) on_q += per_block > w ? ceil_div(per_block - w, warps) : 0;
    busiest = std::max(busiest, on_q);
  }
  return std::max(4 * busiest * steps, ceil_div(per_block, warps) * steps * kWarpsToStream);
}

// v7's shallow ring (two stages per warp) in the same units: a warp holds one step in flight
// while it computes another, too few bytes to stream on its own, so a block streams at full rate
// only while all its warps are busy, and its tiles go in whole rounds of `warps` (a last round
// that is partly empty costs as much as a full one). Plus the x slice, one unit per row and step
// (512 bytes of x per block), and with S > 1 48 units per round for the tiles' finish through the
// workspace (a fence, a count and the last arrival's loads, about 3 µs, that the round's next
// tiles wait for). The two weights are fitted: tools/gemv_timeline's sweep of S on the H200 (the
// book's v7 section) at M = 1, 4, 8, 16 and 28672 × 8192, 8192 × 28672; with them the model
// picks the measured best S at six of the eight and one within 1 µs of it at the other two.
inline int64_t rounds_time(int64_t tiles, int64_t iters, int sms, int warps, int64_t s, int64_t m) {
  const int64_t blocks = std::max<int64_t>(1, sms / s), per_block = ceil_div(tiles, blocks);
  const int64_t steps = ceil_div(iters, s), rounds = ceil_div(per_block, warps);
  return rounds * warps * (steps + 1) + m * steps + (s > 1 ? 48 * rounds : 0);
}

inline int64_t plan_rounds(int64_t tiles, int64_t iters, int sms, int warps, int64_t s_min, int64_t s_max,
                           int64_t m) {
  return least_time_split(s_min, s_max, [&](int64_t s) { return rounds_time(tiles, iters, sms, warps, s, m); });
}

inline int sm_count() {
  static const int sms = [] {
    int dev = 0, count = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev);
    return count > 0 ? count : 1;
  }();
  return sms;
}

}  // namespace lkw::gemv::mma
