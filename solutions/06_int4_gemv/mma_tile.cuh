// What every tensor-core version (v3 on) does with a tile of 16 weight rows besides streaming it:
// turn a word of INT4 into the mma's A operand, and store the tile's sums, straight to y or through
// the split-K workspace (the last of a tile's S arrivals adds the partials in split order).
// The mma's C fragments of n-tile j: columns m = 8j + 2t + (e & 1), rows g + 8·(e ≥ 2).
#pragma once
#include <cuda_bf16.h>

#include "02_int4_dequant/dequant.cuh"
#include "gemv_plan.h"
#include "int4_gemv.cuh"
#include "lkw/ptx.cuh"

namespace lkw::gemv {

// A's four pairs from one interleaved word of one row: q − 8 exact (the scale goes on the FP32
// sums later), or BF16(s·(q − 8)) with the scale in A, or with zero points BF16(q·s − zs).
template <bool kScaleInA, bool kZp>
__device__ __forceinline__ void unpack_a(uint32_t word, __nv_bfloat162 s2, __nv_bfloat162 neg_zs2, uint32_t (&a)[4]) {
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
// rounding, as chapter 02's reference; z becomes a float through the magic 2^23 + z (no I2F).
__device__ __forceinline__ __nv_bfloat162 neg_zero_times_scale(uint32_t z, __nv_bfloat16 s) {
  const float zf = __uint_as_float(0x4b000000u | z) - 8388608.0f;
  return __bfloat162bfloat162(__float2bfloat16_rn(-zf * bf16_to_f32(s)));
}

// A tile's sums to y (BF16, rows past N and columns past M dropped).
template <int kNTiles, class P>
__device__ __forceinline__ void store_y(const P& p, const float (&v)[kNTiles][4], int64_t tile, int g, int t) {
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 8 * j + 2 * t + (e & 1);
      const int64_t row = tile * kTileRows + g + (e >= 2 ? 8 : 0);
      if (m < p.m && row < p.n) p.y[m * p.n + row] = __float2bfloat16_rn(v[j][e]);  // (M, N)
    }
  }
}

// Split-K in two parts: write_partials puts this split's sums of the tile in the workspace (plain
// stores); once a __threadfence has made them visible device-wide, arrive_and_sum counts the
// tile's arrival and the last of its S arrivals sums them. P has y, partials, arrivals, m, n,
// splits (a kernel's parameters).
template <int kNTiles, class P>
__device__ __forceinline__ void write_partials(const P& p, const float (&acc)[kNTiles][4], int64_t tile, int split,
                                               int g, int t) {
  // BEGIN SOLUTION: acc to p.partials + tile·tile_partials(S, M) + split·M·16, as [m][16] (m < M).
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

// The last arrival: the S partials added in split order (deterministic), y stored, the counter
// reset for the next launch, the dead partials' lines dropped from L2 without a write-back.
template <int kNTiles, class P>
__device__ __forceinline__ void sum_partials(const P& p, int64_t tile, int g, int t, int lane) {
  __threadfence();
  const int64_t stride = int64_t(p.m) * kTileRows, per_tile = tile_partials(p.splits, p.m);
  float* all = p.partials + tile * per_tile;
  // Splits outside, a lane's values inside: each split's loads go out together, one L2 round
  // trip per split rather than one per value and split.
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
  store_y<kNTiles>(p, sum, tile, g, t);
  if (lane == 0) p.arrivals[tile] = 0;  // ready for the next launch
  __syncwarp();                         // every lane has read its sums before any line goes
  for (int64_t line = lane; line < per_tile / 32; line += 32) ptx::discard_l2_line(all + 32 * line);
}

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

// A tile's result, by the one warp that holds it: straight to y with one split, else through
// the workspace (the fence between the two parts).
template <int kNTiles, class P>
__device__ __forceinline__ void store_tile(const P& p, const float (&acc)[kNTiles][4], int64_t tile, int split,
                                           int g, int t, int lane) {
  if (p.splits == 1) {
    store_y<kNTiles>(p, acc, tile, g, t);
    return;
  }
  write_partials<kNTiles>(p, acc, tile, split, g, t);
  __threadfence();  // the partials are visible device-wide before the count says so
  arrive_and_sum<kNTiles>(p, tile, g, t, lane);
}

}  // namespace lkw::gemv
