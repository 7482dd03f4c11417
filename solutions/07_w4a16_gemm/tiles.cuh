// What the shared-memory versions (v2 on) share: the x tile of a stage, its cp.async copy and its
// ldmatrix reads, and the ring's launch (grid and dynamic shared memory). The weights' side is
// each version's own lesson and stays in its file.
// A stage holds BM = 16·kMTiles rows of x by kBlockK = 64 k. Rows are padded from 128 to 144 bytes
// so that the 8 rows one ldmatrix matrix names start 36 words apart: 8 different groups of 4
// banks, no conflict.
#pragma once
#include <cuda_bf16.h>


#include "lkw/launch.h"
#include "lkw/ptx.cuh"
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

// The grid of every shared-memory version: 256 channels by BM tokens per block (by `splits` of K).
inline dim3 tile_grid(const GemmArgs& a, int m_tiles, int splits = 1) {
  return dim3(unsigned((a.n + kBlockN - 1) / kBlockN), unsigned((a.m + 16 * m_tiles - 1) / (16 * m_tiles)),
              unsigned(splits));
}

// Launch with `bytes` of dynamic shared memory, kThreads threads (lkw/launch.h: the opt-in over
// 48 KB, set once per kernel).
template <class Kernel, class... Params>
Status launch_tiles(Kernel kernel, dim3 grid, int bytes, cudaStream_t stream, const char* op, Params... params) {
  return launch_with_smem(kernel, grid, kThreads, bytes, stream, op, params...);
}

}  // namespace lkw::w4a16
