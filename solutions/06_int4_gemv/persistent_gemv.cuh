// The persistent tensor-core GEMV of v4_persistent_smem_x, v5_f16_activations and
// v6_balanced_steps: one block of 16 warps per SM, x staged in shared memory, a cp.async ring per
// warp with the weights, scales and zero points of each step, split-K by a model of the busiest
// block (mma::plan_splits). The versions' files say what each changes and why; this header holds
// the kernel they share, by mode:
//   kFold, kScaleInA, kZeroPoints   v4 (and v5 away from G = 128, M ≤ 2)
//   kFoldF16                        v5 at G = 128, M ≤ 2: x in FP16, the FP16 magic unpack
// and by kBalanced: whole tiles per warp (v4, v5) or the block's steps shared evenly (v6, with
// v5's choice of mode); by kStages: four stages (three with two n-tiles) or two (v7, v8). v8
// launches v7's kernels as programmatic dependents (Params::pdl).
#pragma once
#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_set>
#include <type_traits>

#include "02_int4_dequant/dequant.cuh"
#include "int4_gemv.cuh"
#include "mma_gemv.cuh"

// Timeline marks: tools/gemv_timeline.cu defines LKW_GEMV_MARK before including this header to
// record when each warp passes these points of the kernel; otherwise they compile to nothing.
#ifndef LKW_GEMV_MARK
#define LKW_GEMV_MARK(point) \
  do {                       \
  } while (0)
#endif

namespace lkw::gemv::persistent {

using namespace mma;

enum Mark : int {
  kMarkEntry,          // the warp starts
  kMarkXIssued,        // its copies of x are issued
  kMarkRingIssued,     // and its ring's first stages
  kMarkXLanded,        // x is in shared memory (after the block's barrier)
  kMarkPrologueDone,   // Σx or the FP16 conversion done: the steps can start
  kMarkFirstStage,     // its first stage has landed
  kMarkLoopEnd,        // its last step is done (and its whole tiles stored)
  kMarkDone,           // and, kBalanced, the tiles it shares summed and stored
  kMarks
};

constexpr int kWarps = 16;  // at most, per block; one block per SM (the host may launch fewer)
constexpr int kIterK = 256;  // k per step: 4 lanes × 2 chunks × 32, as v3
constexpr int kMaxSplits = 64;
constexpr int kScaleWords = 6;  // per row and stage: up to 128/G + 1 = 5 words of scales, padded

// kFold: G = 128, M ≤ 8, the −8 folded into a per-group correction (v4); kScaleInA: the scale
// (and with kZeroPoints the zero point) applied to the weights in A (v3); kFoldF16: the fold with
// x in FP16, two pairs of nibbles per word out of one shift (v5).
enum Mode : int { kFold = 0, kScaleInA = 1, kZeroPoints = 2, kFoldF16 = 3 };
template <int kMode>
constexpr bool is_f16() {
  return kMode == kFoldF16;
}
template <int kMode>
constexpr bool folds() {
  return kMode == kFold || is_f16<kMode>();
}

template <int kNTiles>
constexpr int stages_for() {
  return kNTiles == 1 ? 4 : 3;  // two n-tiles: more registers, a smaller ring leaves room for x
}
// v7's ring: one step in flight while the warp computes another (v7_shallow_ring.cu says why).
constexpr int kShallowStages = 2;

// One stage of a warp's ring: the weights of one step, as v3 ([row r·2 + chunk u][lane]), the
// scales of the step's groups for its 16 rows and the zero-point words.
struct Stage {
  uint4 w[4][32];
  uint32_t scales[kTileRows][kScaleWords];
  uint32_t zeros[kTileRows];
};
static_assert(sizeof(Stage) % 16 == 0, "stages stay 16-byte aligned");

// v15's scales: a block of 8 steps' scales for a warp's 16 rows, [16 rows][16 groups] BF16 (512
// bytes, G = 128), copied once per block, two blocks per warp (the one being read, the next).
constexpr int kBlockGroups = 16, kBlockElems = kTileRows * kBlockGroups, kBlockBytes = 2 * kBlockElems;

struct Params {
  const __nv_bfloat16* x;       // [M, K]
  const uint32_t* w;            // [N, K/8]
  const __nv_bfloat16* scales;  // [N, K/G], 4-byte aligned
  const uint32_t* zeros;        // [N, K/G/8] or null
  __nv_bfloat16* y;             // [M, N]
  float* partials;              // [tiles, S, M, 16] when S > 1
  unsigned* arrivals;           // [tiles]
  int m, k, k_split, splits, group_shift, tiles;
  int tiles_base, tiles_extra;  // kBalanced: block b of a split holds base + (b < extra) tiles
  int64_t n;
  int half_cuts;                // kBalanced: runs cut at half tiles (v7), else at any step (v6)
  int pdl;                      // launched as a programmatic dependent (v8): weights before x
  int lean_sums;                // the fold's Σx pass over the rows of x only (v9), not all 8
  int consecutive;              // kBalanced: a block's tiles consecutive (v13), not strided by the grid
};

// Programmatic dependent launch (sm_90): a kernel launched with the stream attribute may start
// before the one ahead of it in the stream has finished. griddepcontrol.wait returns once that
// kernel has completed and its memory operations are visible; launch_dependents lets the next
// kernel's blocks be scheduled (as SMs free up) once every block of this one has issued it. On
// older GPUs, and without the attribute, the wait returns at once.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kBalanced: where warp v's run starts, in the block's steps (T tiles of `iters` steps, the host
// launches kWarps = 16 warps). Steps shared evenly (v6): ⌊v·T·iters/16⌋. Half tiles (v7): the
// block's 2T halves shared out, ⌊2T/16⌋ to each warp and one more to each of the first 2T mod 16
// warps, a half being the first ⌊iters/2⌋ steps of a tile or the rest. The warps with one half
// fewer are consecutive, so they fall on every scheduler (warp mod 4) alike: the schedulers'
// shares differ by one half at most, where whole tiles leave them a whole tile apart.
__host__ __device__ __forceinline__ unsigned run_start(unsigned v, unsigned tiles, unsigned iters,
                                                       bool halves) {
  if (!halves) return v * (tiles * iters) / kWarps;
  const unsigned all = 2 * tiles, extra = all % kWarps;
  const unsigned h = v * (all / kWarps) + (v < extra ? v : extra);
  return (h / 2) * iters + (h % 2) * (iters / 2);
}

// v12's tiled layout: one step of a tile, 16 rows × 128 bytes, is 128 uint4 of contiguous memory.
constexpr int kTiledStep = kTileRows * 8;
static_assert(kTiledStep == kTiledRows * kTiledStepWords / 4, "int4_gemv.cuh's tiled_word, in uint4");

// kRotate (v10): the step at which tile `tile`'s walk along K starts, in [0, iters): the tile times
// 2^16 / φ (Fibonacci hashing), its low 16 bits scaled to [0, iters) by a multiply and a shift (no
// division: the SASS check holds the kernel to no I2F). Consecutive tiles start far apart and the
// starts spread evenly over the row. The walk visits steps start, start + 1, ... iters − 1, 0, 1, ...
// start − 1, so that warps reading at the same moment read at different offsets of their rows
// (v10_rotated_walk.cu says why that matters). Odd starts included, on purpose: a step reads 128
// bytes of a row and the copies' L2::256B hint brings in the aligned 256, two steps, so an odd
// start splits one such pair between the walk's first step and its last (about 1.6% more DRAM
// bytes than v9 at the 70B shapes); with the starts made even the bytes fell back to v9's, and the
// time with them (the bench of commit cca4c62, results/h200/history/). That points at the pairs:
// with any start, about half the tiles fetch theirs on the other steps of the walk.
__host__ __device__ __forceinline__ int walk_start(unsigned tile, unsigned iters) {
  return int(((tile * 40503u) & 0xffffu) * iters >> 16);
}

// 4-byte cp.async through L1 (.ca: the only kind that takes 4 bytes), `bytes` of them read
// (0, 2 or 4), the rest zero-filled.
__device__ __forceinline__ void cp_async_4(void* dst_sh, const void* src_gl, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_sh));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src_gl), "r"(bytes)
               : "memory");
}

// Where 16-byte chunk c (elements 8c .. 8c + 7 of the slice) of row r of x lives, in chunks: rows
// row_chunks + 1 apart, bit 1 of c flipped by its bit 3 (see compute_step for the banks).
__device__ __forceinline__ int x_chunk(int r, int c, int row_chunks) {
  return r * (row_chunks + 1) + (c ^ (((c >> 3) & 1) << 1));
}

// Eight INT4 of an interleaved word → four pairs of BF16 128 + q: chapter 02's magic number
// without its subtraction (one LOP3 per pair, a shift between).
__device__ __forceinline__ void u4_to_bf16_plus128(uint32_t q, uint32_t (&out)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[i] = int4::lop3<int4::kAndOr>(q, 0x000f000fu, 0x43004300u);
    q >>= 4;
  }
}

// Eight INT4 of an interleaved word → four pairs of FP16 for the v5 fold, with the magic 1024
// (0x6400: FP16's ulp is 1 from 1024 to 2048). FP16's 10-bit mantissa holds a nibble in bits
// 0..3 and another in bits 4..7, so one mask takes pair 0 (nibbles 0, 4: 1024 + q), another
// pair 1 (nibbles 1, 5: 1024 + 16q, exact), and one shift by 8 brings pairs 2 and 3: four LOP3
// and one SHF per word, where BF16's 7-bit mantissa needs three shifts. out = {pair 0, pair 2}
// (1024 + q) and {pair 1, pair 3} (1024 + 16q).
__device__ __forceinline__ void u4_to_f16_magic_pairs(uint32_t q, uint32_t (&ones)[2],
                                                      uint32_t (&sixteens)[2]) {
  ones[0] = int4::lop3<int4::kAndOr>(q, 0x000f000fu, 0x64006400u);
  sixteens[0] = int4::lop3<int4::kAndOr>(q, 0x00f000f0u, 0x64006400u);
  q >>= 8;
  ones[1] = int4::lop3<int4::kAndOr>(q, 0x000f000fu, 0x64006400u);
  sixteens[1] = int4::lop3<int4::kAndOr>(q, 0x00f000f0u, 0x64006400u);
}

// What a lane knows about its place, fixed for the whole kernel: the split, and which scale words
// it copies (task j of pass `pass`: word task_j of row task_r, when task_on).
struct Lane {
  int lane, g, t;
  int k_begin, k_len, iters;  // this block's split: k offset, length, steps per tile
  int groups;                 // K / G
  int go[2];                  // the group of chunk u within a step, counted from its first
  int valid_steps[2];         // the steps of a tile in which chunk u of the lane lies inside K
  int task_r[3], task_j[3];
  bool task_on[3];
};

// Scale tasks per lane: 16 rows × (128/G + 1) words over 32 lanes; the fold runs at G = 128 only,
// where one task per lane covers them all.
template <int kMode>
constexpr int passes_for() {
  return folds<kMode>() ? 1 : 3;
}

// What a lane needs to copy the steps of one tile, set once per tile: the start of its weight
// chunks in rows g and g + 8; per scale task the word it copies at g0 = 0 and how many scales
// of the tensor lie from there on (capped: only the end of the tensor needs it); its row's
// zero-point words (lanes 0..15); with the fold (one scale task, no zero points), the steps of
// the tile in which all of the lane's copies are whole: before the tail of K, and away from the
// tensor's last scales.
struct CopyTile {
  const uint4* w[2];
  const uint32_t* scale_word[3];
  int scales_left[3];
  const uint32_t* zero_row;
  int whole_steps;
};

__device__ __forceinline__ int64_t clamp_row(int64_t row, int64_t n) { return row < n ? row : n - 1; }

template <bool kZp, int kPasses, bool kTiled>
__device__ __forceinline__ CopyTile copy_tile_of(const Params& p, const Lane& ln, int tile) {
  CopyTile c;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if constexpr (kTiled) {
      // v12's tiled weights, [tile][step][16 rows][128 B] (tiled_word): the tile's block of
      // ⌈K/256⌉ steps of 2 KB, the split's first step, row g + 8r, the lane's 16 bytes. Rows past
      // N are the layout's padding (never written out), so nothing is clamped.
      const int64_t steps = (p.k + kIterK - 1) / kIterK;
      c.w[r] = reinterpret_cast<const uint4*>(p.w) + (int64_t(tile) * steps + ln.k_begin / kIterK) * kTiledStep +
               (ln.g + 8 * r) * 8 + ln.t;
    } else {  // past N: row N − 1, never written
      const int64_t row = clamp_row(int64_t(tile) * kTileRows + ln.g + 8 * r, p.n);
      c.w[r] = reinterpret_cast<const uint4*>(p.w + row * (p.k / 8)) + (ln.k_begin + 32 * ln.t) / 32;
    }
  }
  const int64_t total = p.n * ln.groups;  // scales in the tensor
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    // The step's scales of a row start at row·groups + g0 with g0 even: the aligned word
    // (row·groups) / 2 + g0 / 2 holds the first (in its upper half when row·groups is odd).
    const int64_t word =
        clamp_row(int64_t(tile) * kTileRows + ln.task_r[pass], p.n) * ln.groups / 2 + ln.task_j[pass];
    c.scale_word[pass] = reinterpret_cast<const uint32_t*>(p.scales) + word;
    c.scales_left[pass] = int(std::min<int64_t>(total - 2 * word, 1 << 30));
  }
  c.zero_row = kZp ? p.zeros + clamp_row(int64_t(tile) * kTileRows + ln.lane % kTileRows, p.n) *
                                   (ln.groups / 8)
                   : nullptr;
  // Whole: it < valid_steps[1] (≤ valid_steps[0]), and c.scales_left − g0 ≥ 2 for every g0 of K,
  // which scales_left ≥ groups + 2 guarantees (g0 < groups).
  c.whole_steps = kPasses == 1 && !kZp && c.scales_left[0] >= ln.groups + 2 ? ln.valid_steps[1] : 0;
  return c;
}

// The copies of step `it` of a tile into a stage: each lane its four weight chunks (as v3), the
// scale words of the 16 rows (128/G + 1 aligned 4-byte words per row around the step's 256/G
// scales, shared out over the lanes), the zero-point word of each row (lanes 0..15). kEvictFirst
// (v14): the weight chunks with an L2 evict_first policy; the scale and zero-point words without
// (a row's next steps read the rest of their lines).
template <bool kZp, int kPasses, int kPrefetch, bool kTiled, bool kEvictFirst, bool kBlockScales = false>
__device__ __forceinline__ void copy_step(Stage& st, const Params& p, const Lane& ln,
                                          const CopyTile& c, int it) {
  const int kk = it * kIterK;
  // BEGIN SOLUTION: weights: for r, u = 0, 1: cp_async_16 into st.w[2r + u][lane] from c.w[r] + (kk + 128u) / 32 (kTiled: c.w[r] + it·kTiledStep + 4u), valid while it < ln.valid_steps[u] (kk + 128u + 32t < k_len). Scales: for each task that is on: word c.scale_word + g0 / 2 (g0 = (k_begin + kk) / G, even), 4, 2 or 0 bytes as c.scales_left − g0 is ≥ 2, 1 or less, into st.scales[task_r][task_j]. Zeros (kZp, lanes 0..15): word g0 / 8 of the row, if g0 < groups. First, while it < c.whole_steps, the same copies with none of the tests.
  const int g0 = (ln.k_begin + kk) >> p.group_shift;
  constexpr int kStepStride = kTiled ? kTiledStep : 8;  // uint4 from a row's step to its next
  if (it < c.whole_steps) {  // every copy whole: one test instead of five per step
    const uint4* w0 = c.w[0] + it * kStepStride;
    const uint4* w1 = c.w[1] + it * kStepStride;
    cp_async_16<kPrefetch, kEvictFirst>(&st.w[0][ln.lane], w0, true);
    cp_async_16<kPrefetch, kEvictFirst>(&st.w[1][ln.lane], w0 + 4, true);
    cp_async_16<kPrefetch, kEvictFirst>(&st.w[2][ln.lane], w1, true);
    cp_async_16<kPrefetch, kEvictFirst>(&st.w[3][ln.lane], w1 + 4, true);
    if constexpr (!kBlockScales) cp_async_4(&st.scales[ln.task_r[0]][ln.task_j[0]], c.scale_word[0] + (g0 >> 1), 4);
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const bool valid = it < ln.valid_steps[u];  // kk + 128u + 32t < k_len
      // (kk + 128u) / 32 as it·8 + 4u: kk is never negative, but a signed division by 32 would
      // still round toward zero in two extra instructions.
      cp_async_16<kPrefetch, kEvictFirst>(&st.w[2 * r + u][ln.lane], c.w[r] + (valid ? it * kStepStride + 4 * u : 0), valid);
    }
  }
#pragma unroll
  for (int pass = 0; pass < (kBlockScales ? 0 : kPasses); ++pass) {
    if (kPasses == 1 || ln.task_on[pass]) {
      const int left = c.scales_left[pass] - g0;  // scales from this word to the tensor's end
      const int bytes = left >= 2 ? 4 : left == 1 ? 2 : 0;
      cp_async_4(&st.scales[ln.task_r[pass]][ln.task_j[pass]],
                 bytes ? c.scale_word[pass] + (g0 >> 1) : c.scale_word[pass] - ln.task_j[pass], bytes);
    }
  }
  if constexpr (kZp) {
    if (ln.lane < kTileRows) {
      const bool valid = g0 < ln.groups;
      cp_async_4(&st.zeros[ln.lane], c.zero_row + (valid ? g0 >> 3 : 0), valid ? 4 : 0);
    }
  }
  // END SOLUTION
}

// What a lane needs to compute the steps of one tile: where its rows' scales sit in a stage's
// words (element (row·groups) & 1 holds g0's: g0 is even), and where its x fragments start.
// Lane (g, t) reads chunk c = kk/8 + 16u + 4t + i of row 8j + g, at x_chunk: c ^ 2·(t ≥ 2)
// = kk/8 + 16u + 4t + (i ^ 2·(t ≥ 2)), i.e. i + m or (i − m) with m = 2·(t ≥ 2) for i < 2 and
// i ≥ 2: two base pointers per n-tile and the word as an immediate offset. The eight lanes of
// one 16-byte LDS phase (g, g + 1 and t = 0..3) land on eight different 16-byte bank groups:
// within a row t = 0..3 give i, i + 4, i ^ 2, (i ^ 2) + 4 (mod 8), and the next row is one
// chunk further. At M = 1 every lane reads row 0: a broadcast.
template <int kNTiles>
struct ComputeLane {
  int scale_at[2][2];     // [row r][chunk u]: the scale's BF16 index in a stage's scale words
  const uint4* x[kNTiles][2];  // x fragments of word i < 2 at x[j][0] + i, of i ≥ 2 at x[j][1] + i
};

// One step of a tile: the lane's weights and the rows' scales from the stage, x from the slice,
// the mma, and per group either the fold's correction and the scale or (scaled in A) nothing.
// kBlockScales (v15): the step's scales from the warp's current block of them, `blk` ([16 rows][16
// groups] BF16), its groups from `gpos` on, instead of from the stage.
template <int kNTiles, int kMode, bool kBlockScales = false>
__device__ __forceinline__ void compute_step(const Stage& st, const uint4* x_sh,
                                             const float* xsum_sh, const Params& p,
                                             const Lane& ln, const ComputeLane<kNTiles>& cl,
                                             int it, float (&acc)[kNTiles][4],
                                             const __nv_bfloat16* blk = nullptr, int gpos = 0) {
  const int kk = it * kIterK;
  const int g0 = (ln.k_begin + kk) >> p.group_shift;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    __nv_bfloat16 s[2];
    __nv_bfloat162 s2[2], neg_zs2[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      s[r] = kBlockScales ? blk[(ln.g + 8 * r) * kBlockGroups + gpos + u]
                          : reinterpret_cast<const __nv_bfloat16*>(st.scales)[cl.scale_at[r][u]];
      s2[r] = __bfloat162bfloat162(s[r]);
      if constexpr (kMode == kZeroPoints) {
        const uint32_t z = (st.zeros[ln.g + 8 * r] >> (4 * ((g0 & 7) + ln.go[u]))) & 0xfu;
        neg_zs2[r] = neg_zero_times_scale(z, s[r]);
      }
    }
    // With the fold, two sets of sums (words 0, 2 and 1, 3): two mma chains of four instead of
    // one of eight, so that one word's mma does not wait for the previous word's. With the FP16
    // fold, the chains are pairs 0, 2 (1024 + q) and pairs 1, 3 (1024 + 16q) of every word, and
    // the first starts from the group's correction (xsum_sh: per group and lane t the corrections
    // of columns 2t, 2t + 1 and their 2^−s, see the kernel).
    float sums[2][kNTiles][4] = {};
    float x_inv[2] = {1.0f, 1.0f};  // kFoldF16: the group's 2^−s for columns 2t, 2t + 1
    if constexpr (kMode == kFoldF16) {
      const float4 c = reinterpret_cast<const float4*>(xsum_sh)[(2 * it + u) * 4 + ln.t];
      sums[0][0][0] = c.x;  // rows g and g + 8 of the same column: the same correction
      sums[0][0][1] = c.y;
      sums[0][0][2] = c.x;
      sums[0][0][3] = c.y;
      x_inv[0] = c.z;
      x_inv[1] = c.w;
    }
    const uint4 w_lo = st.w[u][ln.lane], w_hi = st.w[2 + u][ln.lane];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // BEGIN SOLUTION: unpack word i of both rows (kFold: u4_to_bf16_plus128; else unpack_a with the scale, and the zero point); for each n-tile j the x fragment cl.x[j][i / 2][kk / 8 + 16u + i]; two mma steps as v3, into sums[i % 2][j] (the fold) or acc[j]. kFoldF16 (one n-tile): u4_to_f16_magic_pairs of both rows, then mma_f16_16816 of the ones {lo[0], hi[0], lo[1], hi[1]} with x pairs 0 and 2 (the kernel stores them as words 0, 1 of the chunk: xv.x, xv.y) into sums[0], of the sixteens with xv.z, xv.w into sums[1].
      const uint32_t word_lo = i == 0 ? w_lo.x : i == 1 ? w_lo.y : i == 2 ? w_lo.z : w_lo.w;
      const uint32_t word_hi = i == 0 ? w_hi.x : i == 1 ? w_hi.y : i == 2 ? w_hi.z : w_hi.w;
      if constexpr (is_f16<kMode>()) {
        uint32_t ones_lo[2], ones_hi[2], sixteens_lo[2], sixteens_hi[2];
        u4_to_f16_magic_pairs(word_lo, ones_lo, sixteens_lo);
        u4_to_f16_magic_pairs(word_hi, ones_hi, sixteens_hi);
        const uint4 xv = cl.x[0][i / 2][it * 32 + 16 * u + i];
        const uint32_t a_ones[4] = {ones_lo[0], ones_hi[0], ones_lo[1], ones_hi[1]};
        const uint32_t a_sixteens[4] = {sixteens_lo[0], sixteens_hi[0], sixteens_lo[1], sixteens_hi[1]};
        mma_f16_16816(sums[0][0], a_ones, xv.x, xv.y);  // x's pairs 0, 2 (stored first)
        mma_f16_16816(sums[1][0], a_sixteens, xv.z, xv.w);
        continue;
      }
      uint32_t a_lo[4], a_hi[4];
      if constexpr (kMode == kFold) {
        u4_to_bf16_plus128(word_lo, a_lo);
        u4_to_bf16_plus128(word_hi, a_hi);
      } else {
        unpack_a<true, kMode == kZeroPoints>(word_lo, s2[0], neg_zs2[0], a_lo);
        unpack_a<true, kMode == kZeroPoints>(word_hi, s2[1], neg_zs2[1], a_hi);
      }
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const uint4 xv = cl.x[j][i / 2][it * 32 + 16 * u + i];  // chunk kk/8 + 16u + i
        const uint32_t a0[4] = {a_lo[0], a_hi[0], a_lo[1], a_hi[1]};
        const uint32_t a1[4] = {a_lo[2], a_hi[2], a_lo[3], a_hi[3]};
        float(&c)[4] = folds<kMode>() ? sums[i % 2][j] : acc[j];
        mma_bf16_16816(c, a0, xv.x, xv.y);
        mma_bf16_16816(c, a1, xv.z, xv.w);
      }
      // END SOLUTION
    }
    if constexpr (kMode == kFoldF16) {
      // BEGIN SOLUTION: acc += s_row · 2^−s of the column · (sums[0] + sums[1] / 16) (the correction is already in sums[0]; x_inv[e & 1] is the column's 2^−s).
      const float s_lo = bf16_to_f32(s[0]), s_hi = bf16_to_f32(s[1]);
      acc[0][0] = fmaf(s_lo * x_inv[0], fmaf(sums[1][0][0], 0.0625f, sums[0][0][0]), acc[0][0]);
      acc[0][1] = fmaf(s_lo * x_inv[1], fmaf(sums[1][0][1], 0.0625f, sums[0][0][1]), acc[0][1]);
      acc[0][2] = fmaf(s_hi * x_inv[0], fmaf(sums[1][0][2], 0.0625f, sums[0][0][2]), acc[0][2]);
      acc[0][3] = fmaf(s_hi * x_inv[1], fmaf(sums[1][0][3], 0.0625f, sums[0][0][3]), acc[0][3]);
      // END SOLUTION
    }
    if constexpr (kMode == kFold) {
      // BEGIN SOLUTION: group kk/128 + u of the slice: xs = the float2 of Σx for columns m = 8j + 2t, +1 (xsum_sh[group·8·kNTiles + m]); acc += s_row · (sums[0] + sums[1] − 136·xs) (c0, c1 row g with s[0]; c2, c3 row g + 8 with s[1]).
      const float s_lo = bf16_to_f32(s[0]), s_hi = bf16_to_f32(s[1]);
      const int group = 2 * it + u;  // kk/128 + u
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const float2 xs =
            *reinterpret_cast<const float2*>(xsum_sh + group * 8 * kNTiles + 8 * j + 2 * ln.t);
        float sum[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e] = sums[0][j][e] + sums[1][j][e];
        acc[j][0] = fmaf(s_lo, fmaf(-136.0f, xs.x, sum[0]), acc[j][0]);
        acc[j][1] = fmaf(s_lo, fmaf(-136.0f, xs.y, sum[1]), acc[j][1]);
        acc[j][2] = fmaf(s_hi, fmaf(-136.0f, xs.x, sum[2]), acc[j][2]);
        acc[j][3] = fmaf(s_hi, fmaf(-136.0f, xs.y, sum[3]), acc[j][3]);
      }
      // END SOLUTION
    }
  }
}

// kBalanced (v6): the block's steps shared out evenly over its warps instead of whole tiles per
// warp; the tiles that fall on two or more warps are summed in shared memory after the loop.
// kStages: the depth of each warp's ring (v4 to v6: stages_for; v7: kShallowStages). kRotate (v10):
// every tile's walk along K starts at walk_start(tile) and wraps around; the runs, the tiles' parts
// and their sums are as without it, only the step each logical step reads is rotated. kPrefetch:
// the L2 prefetch size of every 16-byte copy, weights and x (mma::cp_async_16): 256 bytes (v4 to
// v10) or 128 (v11, v12). kTiled (v12): the weights in the tiled layout (tiled_word), a warp's step
// 2 KB of contiguous memory. kEvictFirst (v14): the weights' copies carry an L2 evict_first policy
// (copy_step). kBlockScales (v15, the BF16 fold on the tiled layout): the scales come once per 8
// steps, a 16-byte copy per lane for the warp's 16 rows × 16 groups, into a buffer of the warp's own
// (kBlockBytes each, two per warp after the Σx sums), not 4 bytes per lane and step into the stage.
// The body of the kernels below (persistent_kernel: v4 to v14; persistent_blk_kernel: v15).
template <int kNTiles, int kMode, bool kBalanced, int kStages, bool kRotate, int kPrefetch, bool kTiled,
          bool kEvictFirst, bool kBlockScales>
__device__ __forceinline__ void persistent_body(const Params& p) {
  static_assert(!kBlockScales || (kMode == kFold && kTiled && !kRotate),
                "scales in blocks: the BF16 fold (G = 128) on the tiled layout, no rotation");
  LKW_GEMV_MARK(kMarkEntry);
  extern __shared__ uint4 smem[];
  Stage* ring = reinterpret_cast<Stage*>(smem);  // [warp][stage]
  const int warps = blockDim.x / 32;
  uint4* x_sh = smem + warps * kStages * sizeof(Stage) / 16;  // [M][k_split / 8] swizzled
  const int row_chunks = p.k_split / 8;
  float* xsum_sh = reinterpret_cast<float*>(x_sh + p.m * (row_chunks + 1));  // [k_split/128][8·kNTiles]
  // kFoldF16: xsum_sh holds a float4 per group and lane t (M ≤ 2: t = 0 holds columns 0 and 1):
  // the corrections of columns 2t, 2t + 1, then their 2^−s.

  const int warp = threadIdx.x / 32;
  // kBlockScales: this warp's two blocks of scales, after the Σx sums ([k_split/128][8·kNTiles])
  __nv_bfloat16* const blk_sh =
      kBlockScales ? reinterpret_cast<__nv_bfloat16*>(xsum_sh + (p.k_split / 128) * 8 * kNTiles) +
                         warp * 2 * kBlockElems
                   : nullptr;
  Lane ln;
  ln.lane = threadIdx.x % 32;
  ln.g = ln.lane / 4;
  ln.t = ln.lane % 4;
  // Grid (blocks per split, S). No run-time division anywhere in the kernel: the SASS check
  // holds it to no I2F, which is what an integer division compiles to.
  const int split = blockIdx.y, block = blockIdx.x, blocks = gridDim.x;
  ln.k_begin = split * p.k_split;
  ln.k_len = min(p.k - ln.k_begin, p.k_split);
  ln.iters = (ln.k_len + kIterK - 1) / kIterK;
  ln.groups = p.k >> p.group_shift;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    ln.go[u] = (128 * u + 32 * ln.t) >> p.group_shift;
    ln.valid_steps[u] = max(0, ln.k_len - 128 * u - 32 * ln.t + kIterK - 1) >> 8;  // / kIterK
  }
  const int words = (128 >> p.group_shift) + 1;  // scale words per row and step
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    int task = ln.lane + 32 * pass, r = 0;
    ln.task_on[pass] = task < kTileRows * words;
    while (task >= words && r < kTileRows - 1) {  // task / words and task % words, once
      task -= words;
      ++r;
    }
    ln.task_r[pass] = r;
    ln.task_j[pass] = task;
  }

  // The x slice: 16-byte async copies, zero past the end of K (the tail's weights are zero-filled
  // too, and zero x makes the tail add nothing whatever its scale).
  auto copy_x = [&]() {
    for (int r = 0; r < p.m; ++r) {
      for (int cc = threadIdx.x; cc < row_chunks; cc += blockDim.x) {
        const bool valid = 8 * cc < ln.k_len;
        cp_async_16<kPrefetch>(x_sh + x_chunk(r, cc, row_chunks),
                    p.x + int64_t(r) * p.k + (valid ? ln.k_begin + 8 * cc : 0), valid);
      }
    }
    cp_async_commit();
    LKW_GEMV_MARK(kMarkXIssued);
  };
  // Launched as a programmatic dependent (v8): x and every store wait for the kernel before in the
  // stream (griddepcontrol.wait, below); the weights do not, they are issued first.
  if (!p.pdl) copy_x();

  // This warp's run: `count` steps from step it0 of tile tile0, a tile's steps in order, the next
  // tile `stride` further; the copies kStages − 1 steps ahead of the compute. Whole tiles: tiles
  // block + blocks·(warp + warps·n), n = 0, 1, ..., as long as there are tiles. kBalanced: the
  // block's tiles block + blocks·j (j < T) hold T·iters steps, and warp w takes steps
  // run_start(w) up to run_start(w + 1) of them; with p.consecutive (v13) the block's tiles are
  // first + j instead, first = block·base + min(block, extra): one run of memory, not T places
  // `blocks` tiles apart.
  Stage* my_ring = ring + warp * kStages;
  int tile0 = block + blocks * warp, it0 = 0, count = 1 << 30, stride = blocks * warps;
  unsigned block_tiles = 0;  // kBalanced: T
  auto start_of = [&](int v) {
    return run_start(unsigned(v), block_tiles, unsigned(ln.iters), p.half_cuts != 0);
  };
  if constexpr (kBalanced) {
    block_tiles = unsigned(p.tiles_base + (block < p.tiles_extra ? 1 : 0));
    const int lo = int(start_of(warp));
    count = int(start_of(warp + 1)) - lo;
    int j = 0;
    for (it0 = lo; it0 >= ln.iters; it0 -= ln.iters) ++j;  // lo / iters and lo % iters
    if (p.consecutive) {
      tile0 = block * p.tiles_base + min(block, p.tiles_extra) + j;
      stride = 1;
    } else {
      tile0 = block + blocks * j;
      stride = blocks;
    }
  }
  constexpr bool kZp = kMode == kZeroPoints;
  constexpr int kPasses = passes_for<kMode>();
  // kRotate: logical step i of a tile whose walk starts at `start` reads step i + start, less iters
  // past the end (both below iters); without it, step i.
  auto rotated = [&](int i, int start) {
    if constexpr (!kRotate) return i;
    const int r = i + start;
    return r >= ln.iters ? r - ln.iters : r;
  };
  int copy_tile = tile0, copy_it = it0, copies_left = count;  // the next step to copy
  int copy_start = kRotate ? walk_start(unsigned(tile0), unsigned(ln.iters)) : 0;
  CopyTile ct = copy_tile_of<kZp, kPasses, kTiled>(p, ln, tile0);
  // kBlockScales: the block of scales the copies fill next (0 or 1), flipped at each block; the
  // compute flips its own at the same steps (a step whose first group is a multiple of 16, a
  // tile's first step, the run's first step), so both walk the same two buffers in turn.
  int copy_blk = 1, comp_blk = 1;
  auto copy_next = [&](int s) {
    if (copies_left > 0 && copy_tile < p.tiles) {
      if constexpr (kBlockScales) {
        // BEGIN SOLUTION: at a step whose first group (k_begin / 128 + 2·it) is a multiple of 16, a tile's first step or the run's first: flip copy_blk; lane (r = lane / 2, h = lane % 2) copies 16 bytes, groups b + 8h of row r of the tile (b: the first group rounded down to 16; the row clamped to N − 1), into blk_sh + copy_blk·256 + 16r + 8h, zero-filled past the row's groups.
        const int first = (ln.k_begin >> 7) + 2 * copy_it;
        if ((first & (kBlockGroups - 1)) == 0 || copy_it == 0 || copies_left == count) {
          copy_blk ^= 1;
          const int r = ln.lane >> 1, h = ln.lane & 1;
          const int group = (first & ~(kBlockGroups - 1)) + 8 * h;
          const bool valid = group < ln.groups;
          const int64_t row = clamp_row(int64_t(copy_tile) * kTileRows + r, p.n);
          cp_async_16<128>(blk_sh + copy_blk * kBlockElems + r * kBlockGroups + 8 * h,
                           p.scales + row * ln.groups + (valid ? group : 0), valid);
        }
        // END SOLUTION
      }
      copy_step<kZp, kPasses, kPrefetch, kTiled, kEvictFirst, kBlockScales>(my_ring[s % kStages], p, ln, ct,
                                                                            rotated(copy_it, copy_start));
      --copies_left;
      if (++copy_it == ln.iters) {
        copy_it = 0;
        copy_tile += stride;
        ct = copy_tile_of<kZp, kPasses, kTiled>(p, ln, copy_tile);
        if constexpr (kRotate) copy_start = walk_start(unsigned(copy_tile), unsigned(ln.iters));
      }
    }
    cp_async_commit();  // always, so that the group count stays in step
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) copy_next(s);
  LKW_GEMV_MARK(kMarkRingIssued);

  // What the steps need that x does not: set here, while the weights' first stage is on its way
  // (and, launched as a dependent, before the wait), not after x has landed.
  // The lane's x fragments: row 8j + g (row 0 past M), chunk 4t + i of a step (compute_step).
  ComputeLane<kNTiles> cl;
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const int row = 8 * j + ln.g < p.m ? 8 * j + ln.g : 0;
    const int m2 = ln.t >= 2 ? 2 : 0;
    cl.x[j][0] = x_sh + row * (row_chunks + 1) + 4 * ln.t + m2;
    cl.x[j][1] = x_sh + row * (row_chunks + 1) + 4 * ln.t - m2;
  }
  auto start_tile = [&](int tile) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int first =
          int((clamp_row(int64_t(tile) * kTileRows + ln.g + 8 * r, p.n) * ln.groups) & 1);
#pragma unroll
      for (int u = 0; u < 2; ++u) cl.scale_at[r][u] = (ln.g + 8 * r) * kScaleWords * 2 + first + ln.go[u];
    }
  };
  int tile = tile0, it = it0;
  // kRotate: where the current tile's walk starts (copy_start may already be the next tile's: the
  // stages issued above can cross into it)
  int tile_start = kRotate ? walk_start(unsigned(tile0), unsigned(ln.iters)) : 0;
  start_tile(tile);

  // x has landed (its group is older than the ring's; v8: younger, so all copies are waited for);
  // then Σx per group and row for the fold.
  if (p.pdl) {
    grid_dependents_launch();  // the next kernel may start as soon as SMs free up
    grid_dependency_wait();    // the kernel before this one is done and its writes visible
    copy_x();
    cp_async_wait<0>();
  } else {
    cp_async_wait<kStages - 1>();
  }
  __syncthreads();
  LKW_GEMV_MARK(kMarkXLanded);
  if constexpr (is_f16<kMode>()) {
    // BEGIN SOLUTION: four lanes per (row m < M, group of 128), each over four of the group's 16-byte chunks (the groups rounded up to a multiple of 8, so that whole warps shuffle): the group's largest |x| as BF16 bits (two shuffles); its 2^s: s = 142 − e (e the exponent field, at least 1; s clamped to [−113, 126]); convert each chunk in place to FP16 of x·2^s, stored as pairs 0, 2, 1, 3; Σ the FP16 values of pairs 0, 2 (ones) and 1, 3 (sixteens) in FP32, shuffle-add over the 4 lanes; the first lane writes the correction −1032·Σones − 72·Σsixteens and 2^−s into float4 [group·4] (m = 0: {c, 0, 2^−s, 0}, lanes 1..3 of the four their float4s as zeros; m = 1: its .y and .w).
    const int groups = p.k_split / 128, quarter = threadIdx.x % 4;
    const int groups_8 = (groups + 7) & ~7;
    for (int m = 0; m < p.m; ++m) {
      for (int gl = threadIdx.x / 4; gl < groups_8; gl += blockDim.x / 4) {
        uint4 v[4] = {};
        uint32_t top = 0;  // NaN and Inf included: their bits are the largest
        if (gl < groups) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            v[c] = x_sh[x_chunk(m, 16 * gl + 4 * c + quarter, row_chunks)];
            const uint32_t words[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
#pragma unroll
            for (int q = 0; q < 4; ++q) top = max(top, max(words[q] & 0x7fffu, (words[q] >> 16) & 0x7fffu));
          }
        }
        top = max(top, __shfl_xor_sync(0xffffffffu, top, 1));
        top = max(top, __shfl_xor_sync(0xffffffffu, top, 2));
        // 2^s with the group's |x|·2^s < 2^16, inside FP16's range; 2^−s for its sums.
        const int e = max(int(top >> 7), 1);
        const int shift = min(max(142 - e, -113), 126);
        const float pw = __uint_as_float(uint32_t(127 + shift) << 23);
        const float inv = __uint_as_float(uint32_t(127 - shift) << 23);
        float ones = 0.0f, sixteens = 0.0f;
        if (gl < groups) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const uint32_t in[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
            uint32_t out[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {  // exact: 8 significant bits, inside FP16's exponents
              const __half2 h = __floats2half2_rn(bf16_lo_to_f32(in[q]) * pw, bf16_hi_to_f32(in[q]) * pw);
              out[q] = *reinterpret_cast<const uint32_t*>(&h);
              const float2 f = __half22float2(h);
              (q % 2 == 0 ? ones : sixteens) += f.x + f.y;  // pairs 0, 2 and 1, 3
            }
            x_sh[x_chunk(m, 16 * gl + 4 * c + quarter, row_chunks)] =
                make_uint4(out[0], out[2], out[1], out[3]);  // pairs 0, 2 then 1, 3: compute_step
          }
        }
#pragma unroll
        for (int offset = 1; offset < 4; offset <<= 1) {
          ones += __shfl_xor_sync(0xffffffffu, ones, offset);
          sixteens += __shfl_xor_sync(0xffffffffu, sixteens, offset);
        }
        if (gl < groups) {  // the same thread writes a group's float4s for every m
          float4* c4 = reinterpret_cast<float4*>(xsum_sh) + gl * 4 + quarter;
          const float correction = -1032.0f * ones - 72.0f * sixteens;
          if (m == 0) {
            *c4 = quarter == 0 ? make_float4(correction, 0.0f, inv, 0.0f) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          } else if (quarter == 0) {
            c4->y = correction;
            c4->w = inv;
          }
        }
      }
    }
    // END SOLUTION
    __syncthreads();
  }
  if constexpr (kMode == kFold) {
    // Four lanes per (group, row of x): each lane adds four 16-byte chunks of the group's 128
    // elements (four independent loads, two partial sums), two shuffles add the four lanes. The
    // pass stands between x landing and the first step, with the weights' ring stalled once its
    // first stages are in, so its latency is what counts: half a warp per pair with one chunk
    // per lane is a load and four dependent shuffles per pair, eight rounds of them at M = 8,
    // and it was measured slower (the book's v4 section gives the runs). Rows past M
    // get 0 (their columns are never stored). The pairs (a multiple of 8) and blockDim / 4 (a
    // multiple of 8) keep every warp's 32 lanes in the loop together, as the shuffles need.
    const int groups = p.k_split / 128, quarter = threadIdx.x % 4;
    // Σx of group gl, row m of x (4 lanes), into xsum_sh[idx]; `on` false: shuffles only.
    auto group_sum = [&](int gl, int m, int idx, bool on) {
      float sum_lo = 0.0f, sum_hi = 0.0f;
      if (on && m < p.m) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const uint4 v = x_sh[x_chunk(m, 16 * gl + 4 * c + quarter, row_chunks)];
          sum_lo += (bf16_lo_to_f32(v.x) + bf16_hi_to_f32(v.x)) + (bf16_lo_to_f32(v.y) + bf16_hi_to_f32(v.y));
          sum_hi += (bf16_lo_to_f32(v.z) + bf16_hi_to_f32(v.z)) + (bf16_lo_to_f32(v.w) + bf16_hi_to_f32(v.w));
        }
      }
      float sum = sum_lo + sum_hi;
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (on && quarter == 0) xsum_sh[idx] = sum;
    };
    if (p.lean_sums) {
      // lean_sums (v9): v4's loop (the other branch) walks every column 8j + 2t of the mma's B,
      // rows of x past M included: eight (group, row) pairs per group where M = 1 has one; at
      // M = 1 and a whole row of 28672 (S = 1) that is 14 rounds of four lanes' loads and
      // shuffles, 3.9 µs before the first step (tools/gemv_timeline). Here only the rows of x
      // are summed, and by the tensor cores: with A holding x and B one-hot (B[k][n] = 1 for
      // n = m, else 0), an mma's D[i][n] is the sum of row i of A in column m and 0 in the others,
      // whatever the order of A's elements along the row. A warp takes 16 groups at once, group
      // 16q + g in A's row g and 16q + g + 8 in row g + 8: lane (g, t) holds four of each group's
      // 16 chunks (4c' + t, below), two words of a chunk per mma (A's a0, a2 of row g, a1, a3 of row
      // g + 8), eight mma per row of x in two chains. Lane (g, t) then holds columns 2t, 2t + 1
      // of both groups, Σx of row m in column m and 0 in the columns past M, and stores them as
      // they are: no zeroing pass. (Against the same sums in FP32 adds, four lanes per group:
      // 0.3 µs less back to back at M = 1, 8192 × 28672, where the pass covers 224 groups;
      // results/h200/probes/06_prologue.txt.)
      static_assert(kNTiles == 1, "the fold runs at M <= 8");
      const int sixteens = (groups + 15) / 16;
      for (int q = warp; q < sixteens; q += warps) {
        const int lo = 16 * q + ln.g, hi = lo + 8;
        float d[2][4] = {};
        for (int m = 0; m < p.m; ++m) {
          const uint32_t b = ln.g == m ? 0x3f803f80u : 0u;  // B's column g: BF16 1.0 twice, or 0
          // Chunk 4c' + t of each group, c' = c ^ (g & 1): the lanes of odd g take the other half
          // of each 256-byte group row, so that a load's 32 chunks fall on all eight 16-byte bank
          // groups (with c' = c on four: two wavefronts a load instead of one; the pass reads the
          // whole slice, 56 KB at K = 28672, and is bound by it).
          const int flip = ln.g & 1;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const uint4 zero = make_uint4(0, 0, 0, 0);
            const int ca = 16 * lo + 4 * (c ^ flip) + ln.t, cb = 16 * hi + 4 * (c ^ flip) + ln.t;
            const uint4 va = lo < groups ? x_sh[x_chunk(m, ca, row_chunks)] : zero;
            const uint4 vb = hi < groups ? x_sh[x_chunk(m, cb, row_chunks)] : zero;
            const uint32_t a0[4] = {va.x, vb.x, va.y, vb.y}, a1[4] = {va.z, vb.z, va.w, vb.w};
            mma_bf16_16816(d[c % 2], a0, b, b);
            mma_bf16_16816(d[c % 2], a1, b, b);
          }
        }
        if (lo < groups)
          *reinterpret_cast<float2*>(xsum_sh + lo * 8 + 2 * ln.t) = make_float2(d[0][0] + d[1][0], d[0][1] + d[1][1]);
        if (hi < groups)
          *reinterpret_cast<float2*>(xsum_sh + hi * 8 + 2 * ln.t) = make_float2(d[0][2] + d[1][2], d[0][3] + d[1][3]);
      }
    } else {
      const int pairs = groups * 8 * kNTiles;
      for (int idx = threadIdx.x / 4; idx < pairs; idx += blockDim.x / 4)
        group_sum(idx / (8 * kNTiles), idx % (8 * kNTiles), idx, true);
    }
    __syncthreads();
  }

  LKW_GEMV_MARK(kMarkPrologueDone);
  float acc[kNTiles][4] = {};
  // kBalanced: part_from is the step at which this warp's part of the current tile starts. A part
  // from step 0 to the end is a whole tile, stored; a part that starts after step 0 (only the
  // run's first can) is kept in `head` for the warp that holds the tile's start; a part from
  // step 0 that ends early (only the run's last can) is that warp's, summed after the loop.
  int part_from = it0;
  float head[kNTiles][4] = {};
  bool has_head = false, owns_part = false;
  // kBalanced with S > 1 and one n-tile: a tile's partials are written when it ends, but counted
  // (and, by the last split, summed) later, up to three at a time (at the latest after the loop,
  // with the tile the warp sums from the others' heads), after one __threadfence for all of them.
  // A fence waits for the warp's copies in flight, a bubble in its ring: v4 has one per tile, at
  // the tile's end; here, with tiles ending anywhere in a run, they set the warps of a block apart (tools/gemv_timeline on the H200 at 28672 × 8192, M = 8, S = 2: 5.4 µs from a
  // block's first warp done to its last, 1.4 µs deferred; 52.3 → 50.0 µs). With two n-tiles
  // (M > 8) deferring measured no better (M = 16: 64.1 → 66.2 µs at 28672 × 8192, S = 4;
  // 85.4 → 82.7 µs at 8192 × 28672, S = 16), so they store at once.
  constexpr bool kDefer = kBalanced && kNTiles == 1;
  int pending_n = 0, pending0 = 0, pending1 = 0, pending2 = 0;
  auto flush = [&]() {  // the counts at once (lanes 0, 1, 2), then the sums of the tiles it completes
    __threadfence();
    __syncwarp();
    unsigned before = 0;
    if (ln.lane < pending_n)
      before = atomicAdd(p.arrivals + (ln.lane == 0 ? pending0 : ln.lane == 1 ? pending1 : pending2), 1u);
    const unsigned last = unsigned(p.splits - 1);
    const bool last0 = __shfl_sync(0xffffffffu, before, 0) == last;
    const bool last1 = __shfl_sync(0xffffffffu, before, 1) == last && pending_n > 1;
    const bool last2 = __shfl_sync(0xffffffffu, before, 2) == last && pending_n > 2;
    if (last0) sum_partials<kNTiles>(p, pending0, ln.g, ln.t, ln.lane);
    if (last1) sum_partials<kNTiles>(p, pending1, ln.g, ln.t, ln.lane);
    if (last2) sum_partials<kNTiles>(p, pending2, ln.g, ln.t, ln.lane);
    pending_n = 0;
  };
  auto store = [&](int t) {
    if (!kDefer || p.splits == 1) {
      store_tile<kNTiles>(p, acc, t, split, ln.g, ln.t, ln.lane);
      return;
    }
    if (pending_n == 3) flush();
    write_partials<kNTiles>(p, acc, t, split, ln.g, ln.t);
    if (pending_n == 0) pending0 = t;
    else if (pending_n == 1) pending1 = t;
    else pending2 = t;
    ++pending_n;
  };
  // BEGIN SOLUTION: for s = 0, 1, ... while s < count and tile < tiles: __syncwarp (every lane is done with the stage about to be refilled), copy_next(s + kStages − 1), cp_async_wait<kStages − 1>, __syncwarp (the stage's scales came from other lanes), compute_step on stage s % kStages at step rotated(it, tile_start); after the last step of a tile store (the whole tile; kBalanced: see part_from above), zero acc, next tile (start_tile; kRotate: its tile_start), it = 0.
  for (int s = 0; s < count && tile < p.tiles; ++s) {
    __syncwarp();
    copy_next(s + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();
    if (s == 0) LKW_GEMV_MARK(kMarkFirstStage);
    if constexpr (kBlockScales) {
      const int first = (ln.k_begin >> 7) + 2 * it;
      if ((first & (kBlockGroups - 1)) == 0 || it == 0 || s == 0) comp_blk ^= 1;
      compute_step<kNTiles, kMode, true>(my_ring[s % kStages], x_sh, xsum_sh, p, ln, cl, it, acc,
                                         blk_sh + comp_blk * kBlockElems, first & (kBlockGroups - 1));
    } else {
      compute_step<kNTiles, kMode>(my_ring[s % kStages], x_sh, xsum_sh, p, ln, cl, rotated(it, tile_start),
                                   acc);
    }
    ++it;
    if (it == ln.iters || (kBalanced && s + 1 == count)) {
      if constexpr (kBalanced) {
        if (part_from == 0 && it < ln.iters) {  // the run ends inside a tile it started
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
          store(tile);
        }
        part_from = 0;
      } else {
        store(tile);
      }
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
      it = 0;
      tile += stride;
      start_tile(tile);
      if constexpr (kRotate) tile_start = walk_start(unsigned(tile), unsigned(ln.iters));
    }
  }
  // END SOLUTION
  LKW_GEMV_MARK(kMarkLoopEnd);
  cp_async_wait<0>();  // nothing left in flight when the block exits (or reuses the ring)
  if constexpr (kBalanced) {
    // BEGIN SOLUTION: the head into this warp's own ring ([j·4 + e][lane] floats; its copies are done), __syncthreads; a warp that owns a part adds, in warp order, the heads of the warps v > warp whose runs start before the tile's end (hi + iters − it, in the block's steps) and are not empty, then stores the tile.
    float* slot = reinterpret_cast<float*>(my_ring);
    __syncwarp();
    if (has_head) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) slot[(4 * j + e) * 32 + ln.lane] = head[j][e];
    }
    __syncthreads();  // every warp's head is in shared memory
    if (owns_part) {
      const unsigned tile_end = start_of(warp + 1) + unsigned(ln.iters - it);
      for (int v = warp + 1; v < kWarps; ++v) {
        const unsigned lo = start_of(v), hi = start_of(v + 1);
        if (lo >= tile_end) break;
        if (hi == lo) continue;  // an empty run: no head
        const float* theirs = reinterpret_cast<const float*>(ring + v * kStages);
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[j][e] += theirs[(4 * j + e) * 32 + ln.lane];
      }
      store(tile);
    }
    if (pending_n > 0) flush();
    // END SOLUTION
  }
  LKW_GEMV_MARK(kMarkDone);
}

// The kernels: v4 to v14's, and v15's under a name of its own (so that the SASS facts of the
// others keep naming only theirs).
template <int kNTiles, int kMode, bool kBalanced = false, int kStages = stages_for<kNTiles>(),
          bool kRotate = false, int kPrefetch = 256, bool kTiled = false, bool kEvictFirst = false>
__global__ void __launch_bounds__(kWarps * 32, 1) persistent_kernel(const Params p) {
  persistent_body<kNTiles, kMode, kBalanced, kStages, kRotate, kPrefetch, kTiled, kEvictFirst, false>(p);
}
template <int kNTiles, int kMode, bool kBalanced, int kStages, bool kRotate, int kPrefetch, bool kTiled,
          bool kEvictFirst>
__global__ void __launch_bounds__(kWarps * 32, 1) persistent_blk_kernel(const Params p) {
  persistent_body<kNTiles, kMode, kBalanced, kStages, kRotate, kPrefetch, kTiled, kEvictFirst, true>(p);
}

// ---------------------------------------------------------------------------------------------
// Host side: the plan (S and the slice), the launch.

struct Plan {
  int64_t k_split;  // a multiple of kIterK
  int splits;
  size_t smem;
};

template <int kNTiles, int kMode, int kStages = stages_for<kNTiles>(), bool kBlockScales = false>
size_t smem_bytes(int64_t m, int64_t k_split) {
  const size_t sums = is_f16<kMode>() ? size_t(k_split / 128) * 16 * sizeof(float)
                                        : size_t(k_split / 128) * 8 * kNTiles * sizeof(float);
  const size_t blocks = kBlockScales ? size_t(kWarps) * 2 * kBlockBytes : 0;  // v15: two blocks per warp
  return size_t(kWarps) * kStages * sizeof(Stage) + size_t(m) * (k_split + 8) * 2 + sums + blocks;
}

// S forced by a tool (tools/gemv_timeline.cu's LKW_TIMELINE_SPLITS), where it fits; 0: the plan's.
inline int g_force_splits = 0;

// The smallest S whose x slice fits beside the ring, then the model's choice from there:
// plan_splits for v4 to v6, plan_rounds for v7's shallow ring.
// force > 0: that S (v9's S = 1), where it fits, instead of the model's.
template <int kNTiles, int kMode, bool kBalanced = false, int kStages = stages_for<kNTiles>(),
          bool kBlockScales = false>
Plan plan_for(int64_t m, int64_t n, int64_t k, int sms, size_t smem_limit, int64_t force = 0) {
  const int64_t iters = ceil_div(k, kIterK), tiles = ceil_div(n, kTileRows);
  auto per_split = [&](int64_t s) { return ceil_div(iters, s) * kIterK; };
  int64_t s = 1;
  while (s < iters && smem_bytes<kNTiles, kMode, kStages, kBlockScales>(m, per_split(s)) > smem_limit) ++s;
  const int64_t s_max = std::min<int64_t>({iters, kMaxSplits, sms});
  if (force == 0) force = g_force_splits;
  if (force > 0)
    s = std::max<int64_t>(s, std::min<int64_t>(force, iters));
  else if (kStages == kShallowStages)
    s = plan_rounds(tiles, iters, sms, kWarps, s, s_max, m);
  else
    s = plan_splits(tiles, iters, sms, kWarps, s, s_max, kBalanced, m);
  const int64_t k_split = per_split(s);
  const int splits = int(ceil_div(iters, k_split / kIterK));
  return {k_split, splits, smem_bytes<kNTiles, kMode, kStages, kBlockScales>(m, k_split)};
}

// The arguments every persistent version (v4 to v10) refuses before launching: the scales are
// copied in 4-byte words, the weights in 16-byte chunks (validate_gemv's alignment of 16).
inline Status validate_persistent(const GemvOp& op, const GemvArgs& a) {
  Status s = Check().aligned(a.scales, 4, "scales").status();
  if (s.ok()) s = validate_gemv(op, a, 16);
  return s;
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

// Raises a kernel's dynamic shared memory limit to `bytes`, once per kernel address. The key is
// the address, not the template instantiation: a template kernel used from several translation
// units (v4 to v9 share these) may have one host-side address per unit, each registered with its
// own copy of the device code, and the attribute holds only for the copy it was set on. (With a
// static per instantiation, v9's launches of v8's kernels went out with the default 48 KB limit
// and failed with "invalid argument" once v8 had set it on its own copy.)
inline cudaError_t allow_shared_memory(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::unordered_set<const void*> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count(kernel)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e == cudaSuccess) done.insert(kernel);
  return e;
}

// pdl: launched as a programmatic dependent of the kernel before it in the stream (v8; sm_90 and
// later, elsewhere an ordinary launch). v9's options: the lean Σx pass, S forced (0: the plan's),
// and the balanced kernel's runs cut at any step (v6's even shares) instead of v7's half tiles.
struct Options {
  bool pdl = false;
  bool lean_sums = false;
  int force_splits = 0;
  bool even_cuts = false;
  bool consecutive = false;
};
template <int kNTiles, int kMode, bool kBalanced = false, int kStages = stages_for<kNTiles>(),
          bool kRotate = false, int kPrefetch = 256, bool kTiled = false, bool kEvictFirst = false,
          bool kBlockScales = false>
Status launch(const GemvOp& op, const GemvArgs& a, cudaStream_t stream, Options o) {
  static_assert(!kTiled || (kMode != kZeroPoints && !kRotate), "the tiled layout's kernels: no zero points, no rotation");
  if (op.tiled != kTiled)  // the kernel must read the layout the op's weights are in
    return error(Code::kInvalidArgument, std::string(op.name) + ": a kernel for the " +
                                             (kTiled ? "tiled" : "row") + " layout launched on the other");
  const bool pdl = o.pdl;
  // kBlockScales (v15): its own kernel (the BF16 fold only, persistent_body's static_assert)
  auto* kernel = [] {
    if constexpr (kBlockScales) return persistent_blk_kernel<kNTiles, kMode, kBalanced, kStages, kRotate, kPrefetch, kTiled, kEvictFirst>;
    else return persistent_kernel<kNTiles, kMode, kBalanced, kStages, kRotate, kPrefetch, kTiled, kEvictFirst>;
  }();
  const size_t limit = smem_optin();
  const cudaError_t attr = allow_shared_memory(reinterpret_cast<const void*>(kernel), limit);
  if (attr != cudaSuccess)
    return error(Code::kCudaError, std::string(op.name) + ": " + cudaGetErrorString(attr));
  const Plan plan =
      plan_for<kNTiles, kMode, kBalanced, kStages, kBlockScales>(a.m, a.n, a.k, sm_count(), limit, o.force_splits);
  if (plan.smem > limit)
    return error(Code::kInvalidArgument,
                 std::string(op.name) + ": M × 256 of x does not fit in shared memory");
  const int64_t tiles = ceil_div(a.n, kTileRows);
  // One block per SM, the same number for every split (rounded down when S does not divide
  // #SM: a split with fewer blocks would set the pace).
  const int per_split = std::max(1, sm_count() / plan.splits);
  Params p{a.x, a.w, a.scales, a.zeros, a.y, nullptr, nullptr, int(a.m), int(a.k),
           int(plan.k_split), plan.splits, log2_of(a.group), int(tiles),
           int(tiles / per_split), int(tiles % per_split), a.n,
           kBalanced && kStages == kShallowStages && !o.even_cuts ? 1 : 0, 0, o.lean_sums ? 1 : 0,
           kBalanced && o.consecutive ? 1 : 0};
  if (plan.splits > 1) {
    Status s = workspace(tiles * tile_partials(plan.splits, int(a.m)), tiles, &p.partials, &p.arrivals);
    if (!s.ok()) return s;
  }
  // Always 16 warps (kBalanced's shares count on it). (Measured: launching 14, so that 1792 tiles
  // of M = 8 in two splits go out in two whole rounds instead of a whole one and a 70% one, was
  // slower: the SMs need the warps more than the last round needs to be full.)
  const dim3 grid(unsigned(per_split), unsigned(plan.splits));
  static const bool can_depend = device_arch() >= 90;  // dependent launches need sm_90
  if (!pdl || !can_depend) {
    kernel<<<grid, kWarps * 32, plan.smem, stream>>>(p);
    return last_launch_status(op.name);
  }
  p.pdl = 1;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kWarps * 32);
  config.dynamicSmemBytes = plan.smem;
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, p);
  if (e != cudaSuccess) return error(Code::kCudaError, std::string(op.name) + ": " + cudaGetErrorString(e));
  return last_launch_status(op.name);
}

template <int kNTiles, int kMode, bool kBalanced = false, int kStages = stages_for<kNTiles>()>
Status launch(const GemvOp& op, const GemvArgs& a, cudaStream_t stream, bool pdl = false) {
  Options o;
  o.pdl = pdl;
  return launch<kNTiles, kMode, kBalanced, kStages>(op, a, stream, o);
}

// v5_f16_activations' choice of kernel (also what tools/gemv_timeline.cu runs). The FP16 fold up
// to this M; past it v4's BF16 fold. Each block converts M rows of its slice of x before its first
// step (one pass: per group of 128, its largest |x|, then its conversion), time in which the
// weights' ring stands still after its first stages; with M the conversion grows and the steps do
// not, and from M = 4 the measured time is no better than v4's (the book's results section).
constexpr int64_t kF16MaxM = 2;

enum class V5Path { kFoldF16, kFold, kScaleInA1, kScaleInA2 };
inline V5Path v5_path(int64_t m, int group) {
  if (m > 8) return V5Path::kScaleInA2;  // v4's paths
  if (group != 128) return V5Path::kScaleInA1;
  return m <= kF16MaxM ? V5Path::kFoldF16 : V5Path::kFold;
}
// f(n-tiles, mode) for v5's choice, both as std::integral_constant (decltype(x)::value), so that
// every caller that picks a kernel by v5's path (v5, v6, tools/gemv_timeline) shares one switch.
template <class F>
auto with_v5_mode(int64_t m, int group, F&& f) {
  using One = std::integral_constant<int, 1>;
  switch (v5_path(m, group)) {
    case V5Path::kScaleInA2: return f(std::integral_constant<int, 2>{}, std::integral_constant<int, kScaleInA>{});
    case V5Path::kScaleInA1: return f(One{}, std::integral_constant<int, kScaleInA>{});
    case V5Path::kFoldF16: return f(One{}, std::integral_constant<int, kFoldF16>{});
    case V5Path::kFold: break;
  }
  return f(One{}, std::integral_constant<int, kFold>{});
}
// v6's choice between whole tiles (v5's kernel and plan) and balanced steps: the two models' times
// compared, mma::whole_tiles_time at the whole-tile plan's S (it sees how the tiles fall on the
// schedulers) against mma::split_time at the balanced plan's (with the x slice). Balanced where it
// is strictly faster. (Against the bench run of commit 433965d, which timed v5 and v6's balanced
// kernel at every shape: the choice picks the faster of the two at 27 of the 30 shapes of
// int4i_gemv, G = 128; at the other three the one it picks was 0.3–0.9 µs slower.)
template <int kNTiles, int kMode>
bool v6_balances(const GemvArgs& a) {
  const size_t limit = smem_optin();
  const int sms = sm_count();
  const int64_t iters = ceil_div(a.k, kIterK), tiles = ceil_div(a.n, kTileRows);
  const Plan whole = plan_for<kNTiles, kMode, false>(a.m, a.n, a.k, sms, limit);
  const Plan balanced = plan_for<kNTiles, kMode, true>(a.m, a.n, a.k, sms, limit);
  return split_time(tiles, iters, sms, kWarps, balanced.splits, true, a.m) <
         whole_tiles_time(tiles, iters, sms, kWarps, whole.splits);
}

template <int kNTiles, int kMode, bool kV6>
Status launch_mode(const GemvOp& op, const GemvArgs& a, cudaStream_t stream) {
  if constexpr (kV6) {
    if (v6_balances<kNTiles, kMode>(a)) return launch<kNTiles, kMode, true>(op, a, stream);
  }
  return launch<kNTiles, kMode, false>(op, a, stream);
}

// A template, so that only the files that call it instantiate the FP16 fold's kernel (v4's does
// not). kV6: each mode as v6 runs it (v6_balances).
template <const GemvOp& kOp, bool kV6 = false>
Status launch_v5_modes(const GemvArgs& a, cudaStream_t stream) {
  return with_v5_mode(a.m, a.group, [&](auto tiles, auto mode) {
    return launch_mode<decltype(tiles)::value, decltype(mode)::value, kV6>(kOp, a, stream);
  });
}

// v7's choice: its plan's S; with S = 1 and a last round of tiles that leaves warps idle (T not
// a multiple of 16), the runs cut at half tiles (the balanced kernel with half_cuts), else whole
// tiles. With S > 1 whole tiles: the balanced kernel's deferred split-K finish after the loop
// costs more than the half tiles save (the book's v7 section).
template <int kNTiles, int kMode>
bool v7_halves(const GemvArgs& a) {
  const int sms = sm_count();
  const Plan plan = plan_for<kNTiles, kMode, false, kShallowStages>(a.m, a.n, a.k, sms, smem_optin());
  const int64_t tiles = ceil_div(a.n, kTileRows), per_block = ceil_div(tiles, std::max(1, sms / plan.splits));
  return plan.splits == 1 && per_block % kWarps != 0;
}

template <int kNTiles, int kMode, int kPrefetch = 256, bool kTiled = false, bool kEvictFirst = false>
Status launch_v7_mode(const GemvOp& op, const GemvArgs& a, cudaStream_t stream, bool pdl = false) {
  Options o;
  o.pdl = pdl;
  if (v7_halves<kNTiles, kMode>(a))
    return launch<kNTiles, kMode, true, kShallowStages, false, kPrefetch, kTiled, kEvictFirst>(op, a, stream, o);
  return launch<kNTiles, kMode, false, kShallowStages, false, kPrefetch, kTiled, kEvictFirst>(op, a, stream, o);
}

// v7: v5's choice of mode, the shallow ring and its plan (plan_rounds), launch_v7_mode's kernel;
// v8: the same, launched as a programmatic dependent (pdl). kPrefetch: v11's 128-byte copies;
// kOp.tiled: v12's tiled weights; kEvictFirst: v14's weight copies.
template <const GemvOp& kOp, int kPrefetch = 256, bool kEvictFirst = false>
Status launch_shallow(const GemvArgs& a, cudaStream_t stream, bool pdl = false) {
  return with_v5_mode(a.m, a.group, [&](auto tiles, auto mode) {
    return launch_v7_mode<decltype(tiles)::value, decltype(mode)::value, kPrefetch, kOp.tiled, kEvictFirst>(
        kOp, a, stream, pdl);
  });
}

// v9's plan (BF16 fold, shallow ring): S = 1 where the whole row of x fits beside the ring, at
// M = 1 at any K and at M = 2 up to K = kWholeRowMaxK2 (*force = 1); else the shallow ring's own
// (*force = 0). M = 2's bound is the bench's (results/h200/probes/06_m2_whole_row.txt): S = 1 was
// faster at K = 4096 and 8192, slower at K = 14336 and 28672, where two rows of x and their Σx
// pass cost more than the split-K finish they save.
// (sms and limit: the device's unless given, as by the host tests.)
constexpr int64_t kWholeRowMaxK2 = 8192;
// block_scales: v15's plan, its blocks of scales beside the ring (16 KB more shared memory).
inline Plan block_split_plan(int64_t m, int64_t n, int64_t k, int* force, int sms = 0,
                             size_t limit = 0, bool block_scales = false) {
  if (sms == 0) sms = sm_count();
  if (limit == 0) limit = smem_optin();
  auto plan = [&](int64_t f) {
    return block_scales ? plan_for<1, kFold, true, kShallowStages, true>(m, n, k, sms, limit, f)
                        : plan_for<1, kFold, true, kShallowStages>(m, n, k, sms, limit, f);
  };
  *force = (m == 1 || k <= kWholeRowMaxK2) && plan(1).splits == 1 ? 1 : 0;
  return plan(*force);
}
// v9: at M ≤ 2 and G = 128 the BF16 fold with the lean Σx pass as a dependent launch; S as
// block_split_plan says; at S = 1 the balanced kernel with the block's steps cut evenly, whole
// tiles at S > 1 (the split-K finish through the workspace, as v8). Elsewhere v8
// (v9_block_split_k.cu says why). kRotate (v10): the same kernels with every tile's walk along K
// rotated (walk_start). kPrefetch (v11): the same kernels, v8's included, with every copy asking
// L2 for its own 128-byte line. kOp.tiled (v12): v11's kernels reading the tiled layout.
// consecutive (v13): the balanced kernel's blocks each hold consecutive tiles. kEvictFirst (v14):
// every kernel's weight copies with an L2 evict_first policy. kBlockScales (v15): the scales in
// blocks of 8 steps where they apply, below.
template <const GemvOp& kOp, bool kRotate = false, int kPrefetch = 256, bool kEvictFirst = false,
          bool kBlockScales = false>
Status launch_block_split(const GemvArgs& a, cudaStream_t stream, bool consecutive = false) {
  if (a.m > 2 || a.group != 128) return launch_shallow<kOp, kPrefetch, kEvictFirst>(a, stream, /*pdl=*/true);
  Options o;
  o.pdl = true;
  o.lean_sums = true;
  o.even_cuts = true;
  o.consecutive = consecutive;
  if constexpr (kBlockScales) {
    // v15: the blocks where the block split leaves K whole (S = 1; split in K, at M = 2 on
    // 8192 × 28672, S = 4, they were 0.3-0.5 µs slower) and every row's scales start 16-byte
    // aligned (K/128 a multiple of 8, the tensor's base aligned): a block's 32 bytes of a row are
    // then one 16-byte copy per lane. Elsewhere the same launch without them (v14's kernels).
    const bool aligned = (a.k / 128) % 8 == 0 && reinterpret_cast<uintptr_t>(a.scales) % 16 == 0;
    if (aligned && block_split_plan(a.m, a.n, a.k, &o.force_splits, 0, 0, true).splits == 1)
      return launch<1, kFold, true, kShallowStages, kRotate, kPrefetch, kOp.tiled, kEvictFirst, true>(kOp, a, stream,
                                                                                                   o);
    return launch_block_split<kOp, kRotate, kPrefetch, kEvictFirst>(a, stream, consecutive);
  } else {
    if (block_split_plan(a.m, a.n, a.k, &o.force_splits).splits == 1)
      return launch<1, kFold, true, kShallowStages, kRotate, kPrefetch, kOp.tiled, kEvictFirst>(kOp, a, stream, o);
    return launch<1, kFold, false, kShallowStages, kRotate, kPrefetch, kOp.tiled, kEvictFirst>(kOp, a, stream, o);
  }
}

}  // namespace lkw::gemv::persistent
