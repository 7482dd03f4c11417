// The stages that the persistent GEMVs (v4 to v7) share: what a lane knows of its place, x staged
// in shared memory, Σx per group for the fold, a step's copies into a warp's ring (row layout),
// and a step's unpack and mma. v4_persistent_smem_x.cu says why each exists; the version files
// hold what changes from one version to the next (how the warps share the work, how deep the
// ring is, when x is waited for, how the weights and scales are laid out and copied).
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "gemv_plan.h"
#include "int4_gemv.cuh"
#include "lkw/ptx.cuh"
#include "mma_tile.cuh"

namespace lkw::gemv::persistent {

using ptx::Fetch;

constexpr int kScaleWords = 6;  // per row and stage: up to 128/G + 1 = 5 words of scales, padded

// kFold: G = 128 and M ≤ 8, A holds 128 + q and the bias is one correction per group (v4);
// kScaleInA: the scale applied to the weights in A, as v3 (G < 128, or two n-tiles at M > 8).
enum Mode : int { kFold = 0, kScaleInA = 1 };
template <int kMode>
constexpr int scale_passes() {
  return kMode == kFold ? 1 : 3;  // scale words per lane and step: 16 rows × (128/G + 1) / 32
}

// One stage of a warp's ring: one step's weights ([row r·2 + chunk u][lane], as v3) and the
// scales of the step's groups for the tile's 16 rows, as aligned 4-byte words.
struct Stage {
  uint4 w[4][32];
  uint32_t scales[kTileRows][kScaleWords];
};
static_assert(sizeof(Stage) % 16 == 0, "stages stay 16-byte aligned");

struct Params {
  const __nv_bfloat16* x;       // [M, K]
  const uint32_t* w;            // [N, K/8] (v7: tiled, int4_gemv.cuh's tiled_word)
  const __nv_bfloat16* scales;  // [N, K/G], 4-byte aligned
  __nv_bfloat16* y;             // [M, N]
  float* partials;              // [tiles, S, M, 16] when S > 1
  unsigned* arrivals;           // [tiles]
  int m, k, k_split, splits, group_shift, tiles;
  int tiles_base, tiles_extra;  // v5 on: block b of a split holds base + (b < extra) tiles
  int64_t n;
  int pdl;  // v6 on: launched as a programmatic dependent (weights issued before x)
};

__device__ __forceinline__ int64_t clamp_row(int64_t row, int64_t n) { return row < n ? row : n - 1; }

// What a lane knows of its place for the whole kernel: its split, and which scale words it copies
// at each step (task j of pass `pass`: word task_j of row task_r, when task_on).
struct Lane {
  int lane, g, t;
  int k_begin, k_len, iters;  // this block's split: k offset, length, steps per tile
  int groups;                 // K / G
  int go[2];                  // the group of chunk u within a step, counted from its first
  int valid_steps[2];         // the steps of a tile in which chunk u of the lane lies inside K
  int task_r[3], task_j[3];
  bool task_on[3];
};

__device__ __forceinline__ Lane lane_of(const Params& p, int split) {
  Lane ln;
  ln.lane = threadIdx.x % 32;
  ln.g = ln.lane / 4;
  ln.t = ln.lane % 4;
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
    while (task >= words && r < kTileRows - 1) {  // task / words and task % words, with no division
      task -= words;                              // (an integer division compiles to I2F)
      ++r;
    }
    ln.task_r[pass] = r;
    ln.task_j[pass] = task;
  }
  return ln;
}

// x in shared memory: row r of the slice, 16-byte chunk c, rows row_chunks + 1 apart and bit 1 of
// c flipped by its bit 3, so that the eight lanes of a 16-byte LDS phase (rows g, g + 1, lanes
// t = 0..3) hit eight different bank groups. At M = 1 every lane reads row 0: a broadcast.
__device__ __forceinline__ int x_chunk(int r, int c, int row_chunks) {
  return r * (row_chunks + 1) + (c ^ (((c >> 3) & 1) << 1));
}

// The block's slice of x, 16-byte copies, zero past the end of K (zero x makes the K tail add
// nothing, whatever its weights and scales). Issues the copies; the caller commits.
template <Fetch kFetch>
__device__ __forceinline__ void copy_x(uint4* x_sh, const Params& p, const Lane& ln) {
  const int row_chunks = p.k_split / 8;
  for (int r = 0; r < p.m; ++r) {
    for (int cc = threadIdx.x; cc < row_chunks; cc += blockDim.x) {
      const bool valid = 8 * cc < ln.k_len;
      ptx::cp_async_16<kFetch>(x_sh + x_chunk(r, cc, row_chunks),
                               p.x + int64_t(r) * p.k + (valid ? ln.k_begin + 8 * cc : 0), valid);  // (M, K)
    }
  }
}

// The fold's Σx: per group of 128 and column 8j + 2t + e of the mma's B (rows of x past M give
// 0), into xsum_sh[group][8·kNTiles]. Four lanes per (group, row), four independent 16-byte loads
// each and two shuffles: the pass stands between x landing and the first step, so its latency is
// what counts.
template <int kNTiles>
__device__ __forceinline__ void sum_x_groups(const uint4* x_sh, float* xsum_sh, const Params& p) {
  const int row_chunks = p.k_split / 8, groups = p.k_split / 128, quarter = threadIdx.x % 4;
  const int pairs = groups * 8 * kNTiles;  // a multiple of 8: whole warps stay in the loop
  for (int idx = threadIdx.x / 4; idx < pairs; idx += blockDim.x / 4) {
    const int gl = idx / (8 * kNTiles), m = idx % (8 * kNTiles);  // constant divisors: shifts
    float sum_lo = 0.0f, sum_hi = 0.0f;
    if (m < p.m) {
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
    if (quarter == 0) xsum_sh[idx] = sum;
  }
}

// v6 on: Σx of the slice's rows of x per group of 128, by the tensor cores: A holds x, B is one-hot
// (B[k][n] = 1 for n = m), so D[i][m] is the sum of row i of A whatever the order of its
// elements. A warp takes 16 groups at once (group 16q + g in A's row g, 16q + g + 8 in row g + 8),
// eight mma per row of x; lane (g, t) ends holding columns 2t, 2t + 1 of both groups (row m's Σx in
// column m, 0 past M) and stores them as they are into xsum_sh[group][8].
__device__ __forceinline__ void sum_x_rows(const uint4* x_sh, float* xsum_sh, const Params& p, const Lane& ln,
                                           int warp, int warps) {
  const int row_chunks = p.k_split / 8, groups = p.k_split / 128, sixteens = (groups + 15) / 16;
  for (int q = warp; q < sixteens; q += warps) {
    const int lo = 16 * q + ln.g, hi = lo + 8;
    float d[2][4] = {};
    for (int m = 0; m < p.m; ++m) {
      const uint32_t b = ln.g == m ? 0x3f803f80u : 0u;  // B's column g: BF16 1.0 twice, or 0
      // Chunk 4c' + t of each group, c' = c ^ (g & 1): odd rows take the other half of each
      // 256-byte group row, so that a load's 32 chunks fall on all eight bank groups.
      const int flip = ln.g & 1;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const int ca = 16 * lo + 4 * (c ^ flip) + ln.t, cb = 16 * hi + 4 * (c ^ flip) + ln.t;
        const uint4 va = lo < groups ? x_sh[x_chunk(m, ca, row_chunks)] : zero;
        const uint4 vb = hi < groups ? x_sh[x_chunk(m, cb, row_chunks)] : zero;
        const uint32_t a0[4] = {va.x, vb.x, va.y, vb.y}, a1[4] = {va.z, vb.z, va.w, vb.w};
        ptx::mma_bf16_16816(d[c % 2], a0, b, b);
        ptx::mma_bf16_16816(d[c % 2], a1, b, b);
      }
    }
    if (lo < groups)
      *reinterpret_cast<float2*>(xsum_sh + lo * 8 + 2 * ln.t) = make_float2(d[0][0] + d[1][0], d[0][1] + d[1][1]);
    if (hi < groups)
      *reinterpret_cast<float2*>(xsum_sh + hi * 8 + 2 * ln.t) = make_float2(d[0][2] + d[1][2], d[0][3] + d[1][3]);
  }
}

// What a lane copies for the steps of one tile, set once per tile: where its weight chunks of rows
// g and g + 8 start (the version sets w), per scale task the word it copies at g0 = 0 and how many
// scales lie from there to the tensor's end; and the steps in which every copy is whole (before
// the K tail and away from the tensor's last scales), which then skip every test.
struct CopyTile {
  const uint4* w[2];
  const uint32_t* scale_word[3];
  int scales_left[3];
  int whole_steps;
};

template <int kPasses>
__device__ __forceinline__ void scale_copies_of(CopyTile& c, const Params& p, const Lane& ln, int tile) {
  const int64_t total = p.n * ln.groups;  // scales in the tensor
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    // A step's scales of a row start at row·groups + g0 with g0 even: the aligned word
    // (row·groups) / 2 + g0 / 2 holds the first (in its upper half when row·groups is odd).
    const int64_t word = clamp_row(int64_t(tile) * kTileRows + ln.task_r[pass], p.n) * ln.groups / 2 + ln.task_j[pass];
    c.scale_word[pass] = reinterpret_cast<const uint32_t*>(p.scales) + word;
    c.scales_left[pass] = int(std::min<int64_t>(total - 2 * word, int64_t(1) << 30));
  }
  c.whole_steps = kPasses == 1 && c.scales_left[0] >= ln.groups + 2 ? ln.valid_steps[1] : 0;
}

// The row layout (int4i_gemv): row g + 8r of the tile from the split's first step (rows past N
// read row N − 1, never written out).
template <int kPasses>
__device__ __forceinline__ CopyTile copy_tile_rows(const Params& p, const Lane& ln, int tile) {
  CopyTile c;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = clamp_row(int64_t(tile) * kTileRows + ln.g + 8 * r, p.n);
    c.w[r] = reinterpret_cast<const uint4*>(p.w + row * (p.k / 8)) + (ln.k_begin + 32 * ln.t) / 32;  // (N, K/8)
  }
  scale_copies_of<kPasses>(c, p, ln, tile);
  return c;
}

// Step `it` of a tile into a stage: each lane its four weight chunks (chunk u of row r at
// c.w[r] + it·kStepStride + 4u), then the 16 rows' scale words of the step's groups, shared out
// over the lanes (4, 2 or 0 bytes read as the tensor's end nears). kWeights: the weights' fetch.
template <int kPasses, Fetch kWeights, int kStepStride = 8>
__device__ __forceinline__ void copy_step(Stage& st, const Params& p, const Lane& ln, const CopyTile& c, int it) {
  // BEGIN SOLUTION: first, while it < c.whole_steps: the 4 weight copies and pass 0's scale word, no tests; else weights valid while it < ln.valid_steps[u], and per scale task 4, 2 or 0 bytes.
  const int g0 = (ln.k_begin + it * kIterK) >> p.group_shift;
  if (it < c.whole_steps) {  // every copy whole: one test instead of five per step
    const uint4* w0 = c.w[0] + it * kStepStride;
    const uint4* w1 = c.w[1] + it * kStepStride;
    ptx::cp_async_16<kWeights>(&st.w[0][ln.lane], w0, true);
    ptx::cp_async_16<kWeights>(&st.w[1][ln.lane], w0 + 4, true);
    ptx::cp_async_16<kWeights>(&st.w[2][ln.lane], w1, true);
    ptx::cp_async_16<kWeights>(&st.w[3][ln.lane], w1 + 4, true);
    ptx::cp_async_4(&st.scales[ln.task_r[0]][ln.task_j[0]], c.scale_word[0] + (g0 >> 1), 4);
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const bool valid = it < ln.valid_steps[u];  // kk + 128u + 32t < k_len
      ptx::cp_async_16<kWeights>(&st.w[2 * r + u][ln.lane], c.w[r] + (valid ? it * kStepStride + 4 * u : 0), valid);
    }
  }
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    if (kPasses == 1 || ln.task_on[pass]) {
      const int left = c.scales_left[pass] - g0;  // scales from this word to the tensor's end
      const int bytes = left >= 2 ? 4 : left == 1 ? 2 : 0;
      ptx::cp_async_4(&st.scales[ln.task_r[pass]][ln.task_j[pass]],
                      bytes ? c.scale_word[pass] + (g0 >> 1) : c.scale_word[pass] - ln.task_j[pass], bytes);
    }
  }
  // END SOLUTION
}

// What a lane needs to compute a tile's steps: where its x fragments start (two base pointers per
// n-tile, so that the swizzle's flip is an immediate offset) and, set per tile, where its rows'
// scales sit in a stage's words.
template <int kNTiles>
struct ComputeLane {
  int scale_at[2][2];          // [row r][chunk u]: the scale's BF16 index in a stage's words
  const uint4* x[kNTiles][2];  // x fragment of word i < 2 at x[j][0] + i, of i ≥ 2 at x[j][1] + i
};

template <int kNTiles>
__device__ __forceinline__ ComputeLane<kNTiles> compute_lane_of(const uint4* x_sh, const Params& p, const Lane& ln) {
  ComputeLane<kNTiles> cl;
  const int row_chunks = p.k_split / 8;
  // Lane (g, t) reads chunk kk/8 + 16u + 4t + i of row 8j + g (row 0 past M): at x_chunk, that is
  // + (i ^ 2) where t ≥ 2, i.e. i + 2 or i − 2 from one of two bases.
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const int row = 8 * j + ln.g < p.m ? 8 * j + ln.g : 0;
    const int m2 = ln.t >= 2 ? 2 : 0;
    cl.x[j][0] = x_sh + row * (row_chunks + 1) + 4 * ln.t + m2;
    cl.x[j][1] = x_sh + row * (row_chunks + 1) + 4 * ln.t - m2;
  }
  return cl;
}

template <int kNTiles>
__device__ __forceinline__ void start_tile(ComputeLane<kNTiles>& cl, const Params& p, const Lane& ln, int tile) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int first = int((clamp_row(int64_t(tile) * kTileRows + ln.g + 8 * r, p.n) * ln.groups) & 1);
#pragma unroll
    for (int u = 0; u < 2; ++u) cl.scale_at[r][u] = (ln.g + 8 * r) * kScaleWords * 2 + first + ln.go[u];
  }
}

// One step of a tile: the lane's weights and its rows' scales from the stage, x from the slice, the
// mma; per group the fold's correction and scale (kFold), or nothing more (kScaleInA).
template <int kNTiles, int kMode>
__device__ __forceinline__ void compute_step(const Stage& st, const float* xsum_sh, const Lane& ln,
                                             const ComputeLane<kNTiles>& cl, int it, float (&acc)[kNTiles][4]) {
  static_assert(kMode != kFold || kNTiles == 1, "the fold runs at M <= 8: one n-tile");
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const __nv_bfloat16* scales = reinterpret_cast<const __nv_bfloat16*>(st.scales);
    const __nv_bfloat16 s[2] = {scales[cl.scale_at[0][u]], scales[cl.scale_at[1][u]]};
    const __nv_bfloat162 s2[2] = {__bfloat162bfloat162(s[0]), __bfloat162bfloat162(s[1])};
    // The fold keeps two sets of sums (words 0, 2 and 1, 3): two mma chains of four, not one of
    // eight, so that a word's mma does not wait for the previous word's.
    float sums[2][kNTiles][4] = {};
    const uint4 w_lo = st.w[u][ln.lane], w_hi = st.w[2 + u][ln.lane];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // BEGIN SOLUTION: unpack word i of both rows (kFold: int4::u4_to_bf16_plus128; else unpack_a with the scale); per n-tile j two mma with x chunk cl.x[j][i / 2][it·32 + 16u + i], into sums[i % 2][j] (kFold) or acc[j].
      const uint32_t word_lo = i == 0 ? w_lo.x : i == 1 ? w_lo.y : i == 2 ? w_lo.z : w_lo.w;
      const uint32_t word_hi = i == 0 ? w_hi.x : i == 1 ? w_hi.y : i == 2 ? w_hi.z : w_hi.w;
      uint32_t a_lo[4], a_hi[4];
      if constexpr (kMode == kFold) {
        int4::u4_to_bf16_plus128(word_lo, a_lo);
        int4::u4_to_bf16_plus128(word_hi, a_hi);
      } else {
        unpack_a<true, false>(word_lo, s2[0], s2[0], a_lo);
        unpack_a<true, false>(word_hi, s2[1], s2[1], a_hi);
      }
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const uint4 xv = cl.x[j][i / 2][it * 32 + 16 * u + i];  // chunk kk/8 + 16u + i
        const uint32_t a0[4] = {a_lo[0], a_hi[0], a_lo[1], a_hi[1]};
        const uint32_t a1[4] = {a_lo[2], a_hi[2], a_lo[3], a_hi[3]};
        float(&c)[4] = kMode == kFold ? sums[i % 2][j] : acc[j];
        ptx::mma_bf16_16816(c, a0, xv.x, xv.y);
        ptx::mma_bf16_16816(c, a1, xv.z, xv.w);
      }
      // END SOLUTION
    }
    if constexpr (kMode == kFold) {
      // BEGIN SOLUTION: group 2·it + u of the slice: xs = float2 of Σx at xsum_sh[group·8 + 2t]; acc += s_row · (sums[0] + sums[1] − 136·xs) (c0, c1 row g, scale s[0]; c2, c3 row g + 8, s[1]).
      const float s_lo = bf16_to_f32(s[0]), s_hi = bf16_to_f32(s[1]);
      const int group = 2 * it + u;
      const float2 xs = *reinterpret_cast<const float2*>(xsum_sh + group * 8 + 2 * ln.t);
      float sum[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[e] = sums[0][0][e] + sums[1][0][e];
      acc[0][0] = fmaf(s_lo, fmaf(-136.0f, xs.x, sum[0]), acc[0][0]);
      acc[0][1] = fmaf(s_lo, fmaf(-136.0f, xs.y, sum[1]), acc[0][1]);
      acc[0][2] = fmaf(s_hi, fmaf(-136.0f, xs.x, sum[2]), acc[0][2]);
      acc[0][3] = fmaf(s_hi, fmaf(-136.0f, xs.y, sum[3]), acc[0][3]);
      // END SOLUTION
    }
  }
}

// The launch every persistent version shares: the plan's S and shared memory, the split-K
// workspace where S > 1, one block of 16 warps per SM and split (the same number for every split,
// rounded down: a split with fewer blocks would set the pace), a block's share of the tiles (v5
// on: base + 1 for the first `extra` blocks); pdl (sm_90 on): as a programmatic dependent of the
// kernel before it in the stream.
template <class Kernel>
Status launch_persistent(Kernel kernel, const GemvOp& op, const GemvArgs& a, const Plan& plan, bool pdl,
                         cudaStream_t stream) {
  if (plan.smem > smem_optin())
    return error(Code::kInvalidArgument, std::string(op.name) + ": M × 256 of x does not fit in shared memory");
  const cudaError_t attr = allow_shared_memory(reinterpret_cast<const void*>(kernel), smem_optin());
  if (attr != cudaSuccess) return error(Code::kCudaError, std::string(op.name) + ": " + cudaGetErrorString(attr));
  const int64_t tiles = ceil_div(a.n, kTileRows);
  const int per_split = std::max(1, sm_count() / plan.splits);
  static const bool can_depend = device_arch() >= 90;
  Params p{a.x, a.w, a.scales, a.y, nullptr, nullptr, int(a.m), int(a.k), int(plan.k_split), plan.splits,
           log2_of(a.group), int(tiles), int(tiles / per_split), int(tiles % per_split), a.n,
           pdl && can_depend ? 1 : 0};
  if (plan.splits > 1) {
    Status s = workspace(tiles * tile_partials(plan.splits, int(a.m)), tiles, &p.partials, &p.arrivals);
    if (!s.ok()) return s;
  }
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(per_split), unsigned(plan.splits));
  config.blockDim = dim3(kBlockWarps * 32);
  config.dynamicSmemBytes = plan.smem;
  config.stream = stream;
  config.attrs = p.pdl ? &dependent : nullptr;
  config.numAttrs = p.pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, p);
  if (e != cudaSuccess) return error(Code::kCudaError, std::string(op.name) + ": " + cudaGetErrorString(e));
  return last_launch_status(op.name);
}

// The arguments every persistent version refuses before launching: the scales are copied in
// 4-byte words, the weights in 16-byte chunks.
inline Status validate_persistent(const GemvOp& op, const GemvArgs& a) {
  Status s = Check().aligned(a.scales, 4, "scales").status();
  if (s.ok()) s = validate_gemv(op, a, 16);
  return s;
}

}  // namespace lkw::gemv::persistent
