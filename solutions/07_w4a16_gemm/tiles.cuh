// What the shared-memory versions (v2 on) share: the x tile of a stage, its cp.async copy and its
// ldmatrix reads, the ring's launch (grid and dynamic shared memory), and the wgmma versions' sum
// of split partials and y-tile store. The weights' side is each version's own lesson and stays in
// its file.
// A stage holds BM = 16·kMTiles rows of x by kBlockK = 64 k. Rows are padded from 128 to 144 bytes
// so that the 8 rows one ldmatrix matrix names start 36 words apart: 8 different groups of 4
// banks, no conflict.
#pragma once
#include <cuda_bf16.h>


#include "lkw/launch.h"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {

constexpr int kBlockK = 64;              // k per stage: 4 mma k-steps
constexpr int kKSteps = kBlockK / 16;
constexpr int kARowElems = kBlockK + 8;  // 144-byte rows in shared memory
constexpr int kThreads = kWarps * 32;

template <int kMTiles>
constexpr int a_stage_elems() { return 16 * kMTiles * kARowElems; }

// Copy stage `kt` of x (rows m0 .. m0 + BM, k from kt·64) into a_sh: 16-byte pieces, each thread
// a few; rows past M and k past K read nothing and leave zeros (they multiply real weights, so
// they must be zero, not stale).
template <int kMTiles>
__device__ __forceinline__ void load_a_stage(__nv_bfloat16* a_sh, const __nv_bfloat16* x, int64_t m0,
                                             int64_t kt, int64_t m, int64_t k) {
  constexpr int kPieces = 16 * kMTiles * (kBlockK / 8);
#pragma unroll
  for (int c = threadIdx.x; c < kPieces; c += kThreads) {
    const int row = c / (kBlockK / 8), col = 8 * (c % (kBlockK / 8));
    const int64_t gr = m0 + row, gk = kt * kBlockK + col;
    const bool valid = gr < m && gk < k;
    ptx::cp_async_16(a_sh + row * kARowElems + col, valid ? x + gr * k + gk : x, valid);  // (M, K)
  }
}

// A fragments of m16 tile `mt` at k-step `ks` of a stage: one ldmatrix.x4, lane l naming row
// (l % 8) + 8·((l / 8) % 2) and column 8·(l / 16) of the 16 × 16 tile, so matrices 0..3 are a0..a3.
template <int kMTiles>
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const __nv_bfloat16* a_sh, int mt, int ks, int lane) {
  const int row = 16 * mt + lane % 8 + 8 * ((lane / 8) % 2), col = 16 * ks + 8 * (lane / 16);
  ptx::ldmatrix_x4(a, a_sh + row * kARowElems + col);
}

// Copy the zero points of stage kt beside its scales (v4, v5): row r holds the group of
// k = 64·kt + 32·r for the block's 256 channels, 256 bytes of a row of [K/G, N]; threads 64..95
// one 16-byte piece each (threads 0..63 copy the scales). A half stage past K reads nothing.
constexpr int kZeroRows = 2;
static_assert(kThreads >= 64 + kZeroRows * kBlockN / 16, "a thread per zero-point piece");
__device__ __forceinline__ void load_zero_stage(uint8_t* z_sh, const uint8_t* zeros, int64_t nb0,
                                                int64_t kt, int64_t n, int64_t k, int group_shift) {
  constexpr int kPieces = kBlockN / 16;
  const int c = int(threadIdx.x) - 64;
  if (c >= 0 && c < kZeroRows * kPieces) {
    const int r = c / kPieces, piece = c % kPieces;
    const int64_t k_at = kt * kBlockK + 32 * r, gn = nb0 + 16 * piece;
    const bool valid = k_at < k && gn < n;
    const uint8_t* src = zeros + (k_at >> group_shift) * n + gn;  // (K/G, N)
    ptx::cp_async_16(z_sh + r * kBlockN + 16 * piece, valid ? src : zeros, valid);
  }
}

// The grid of every shared-memory version: 256 channels by BM tokens per block (by `splits` of K).
inline dim3 tile_grid(const GemmArgs& a, int m_tiles, int splits = 1) {
  return dim3(unsigned((a.n + kBlockN - 1) / kBlockN), unsigned((a.m + 16 * m_tiles - 1) / (16 * m_tiles)),
              unsigned(splits));
}

// The tensor maps of the wgmma versions (v6, v8, v9), a TMA box each per stage (lkw/tma.h; zeros
// past the tensors' edges): x [M, K] in bt × 64 boxes swizzled for the wgmma descriptor; the
// repacked words [N/64, 8K] seen as [N/64, 4K] 8-byte elements, whose (bn / 64) × 256 box is the
// bn / 64 64-channel blocks' 2 KB of a stage; the scales [K/G, N] in 1 × bn boxes, one per group
// row of the stage, and the zero points [K/G, N] (where given; else z is left empty) in the same
// boxes.
// bn, the channels of a tile: kBlockN (v6, v8) or 128 (v9).
struct WgmmaMaps {
  CUtensorMap x, w, s, z;
};
inline Status wgmma_maps(WgmmaMaps* maps, const GemmArgs& a, int bt, int bn = kBlockN) {
  *maps = {};
  const auto none = CU_TENSOR_MAP_SWIZZLE_NONE;
  Status s = tensor_map_bf16_sw128(&maps->x, a.x, a.m, a.k, bt);
  if (s.ok())
    s = tensor_map_2d(&maps->w, a.w, CU_TENSOR_MAP_DATA_TYPE_UINT64, 8, a.n / 64, a.k * 4,
                      bn / 64, kKSteps * 64, none);  // a stage: 2 KB, 256 8-byte elements
  if (s.ok())
    s = tensor_map_2d(&maps->s, a.scales, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.k / a.group, a.n,
                      1, bn, none);
  if (s.ok() && a.zeros)
    s = tensor_map_2d(&maps->z, a.zeros, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.k / a.group, a.n, 1,
                      bn, none);
  return s;
}

// The wgmma versions' (v6, v8, v9) ends of a tile, run by kThreads threads (tid 0 .. kThreads − 1:
// v9's consumers count from 0 past its producer warpgroup), on tiles of kBN channels. The last
// split of a tile sums every split's partial ([split][kBN channels][kBT tokens] FP32 at tile_gl,
// the token pairs of a channel side by side) into the y tile out_sh [kBT][kOutRow] BF16: a thread
// one (channel, token pair), neighbouring threads a channel's neighbouring pairs, so a warp's
// loads are whole lines of the workspace; pairs from `rows` on (past M) are skipped.
template <int kBT, int kThreads, int kOutRow, int kBN = kBlockN>
__device__ __forceinline__ void sum_split_partials(const float* tile_gl, int splits, int rows,
                                                   __nv_bfloat16* out_sh,
                                                   int tid = int(threadIdx.x)) {
  constexpr int kPairs = kBT / 2;  // a power of two: shifts, not a division (no I2F)
  for (int q = tid; q < kBN * kPairs; q += kThreads) {
    const int channel = q / kPairs, token = 2 * (q % kPairs);
    if (token >= rows) continue;
    const float2* p = reinterpret_cast<const float2*>(tile_gl + channel * kBT + token);
    constexpr int kSplitStride = kBN * kBT / 2;  // float2s between two splits' tiles
    float2 sum = make_float2(0.f, 0.f);
    int s = 0;
    for (; s + 4 <= splits; s += 4) {  // four loads in flight, the sum in split order
      float2 v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = __ldcg(p + (s + i) * kSplitStride);
#pragma unroll
      for (int i = 0; i < 4; ++i) sum.x += v[i].x, sum.y += v[i].y;
    }
    for (; s < splits; ++s) {
      const float2 v = __ldcg(p + s * kSplitStride);
      sum.x += v.x, sum.y += v.y;
    }
    out_sh[token * kOutRow + channel] = __float2bfloat16_rn(sum.x);
    out_sh[(token + 1) * kOutRow + channel] = __float2bfloat16_rn(sum.y);
  }
}

// The y tile's rows inside M and columns inside N to y (M, N), 16 bytes a store.
template <int kBT, int kThreads, int kOutRow, int kBN = kBlockN>
__device__ __forceinline__ void store_y_tile(const __nv_bfloat16* out_sh, __nv_bfloat16* y,
                                             int64_t t0, int64_t nb0, int64_t m, int64_t n,
                                             int tid = int(threadIdx.x)) {
  for (int c = tid; c < kBT * (kBN / 8); c += kThreads) {
    const int row = c / (kBN / 8), col = 8 * (c % (kBN / 8));
    if (t0 + row < m && nb0 + col < n)
      *reinterpret_cast<uint4*>(y + (t0 + row) * n + nb0 + col) =
          *reinterpret_cast<const uint4*>(out_sh + row * kOutRow + col);
  }
}

// Launch with `bytes` of dynamic shared memory, kThreads threads (lkw/launch.h: the opt-in over
// 48 KB, set once per kernel).
template <class Kernel, class... Params>
Status launch_tiles(Kernel kernel, dim3 grid, int bytes, cudaStream_t stream, const char* op, Params... params) {
  return launch_with_smem(kernel, grid, kThreads, bytes, stream, op, params...);
}

}  // namespace lkw::w4a16
