// v0_mma_sync — the FP8 tensor core through mma.sync m16n8k32 E4M3, Ada's instruction.
//
// Chapter 07's v2 loop with FP8 operands on both sides: a block of 8 warps owns a 128 × 128 tile
// of y, copies 64-k stages of its A rows and B rows into shared memory with cp.async (a ring of
// kStages), and each warp computes a 64 × 32 piece with m16n8k32 mma: ldmatrix fills FP8 fragments
// unchanged, because in bytes they are the BF16 m16n8k16 fragments (lkw/ptx.cuh). Rows are padded
// to 80 bytes so that the 8 rows an ldmatrix names fall in 8 different bank groups. The scales do
// not depend on k: the FP32 sums leave the loop unscaled and the epilogue multiplies s_b, then
// s_a, and rounds to BF16 once. Blockwise scales are refused (v4).
// Expect on sm_89: QMMA, FP8 at twice the BF16 rate. On sm_90a (the H200) the SASS shows what
// Hopper thinks of this instruction: no QMMA; each E4M3 pair is converted to FP16 (F2FP) and fed
// to HMMA.16816, at FP16's rate, with the converts on top. Hopper's FP8 rate is wgmma's (v1).
#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"

namespace lkw::fp8 {
namespace {

constexpr int kThreads = 256;           // 8 warps: 2 along M × 4 along N
constexpr int kBlockM = 128, kBlockN = 128;
constexpr int kBlockK = 64;             // bytes (= FP8 values) of k per stage: two k32 steps
constexpr int kRowBytes = kBlockK + 16;  // padded: rows 80 bytes apart hit distinct bank groups
constexpr int kStages = 4;
constexpr int kTileBytes = kBlockM * kRowBytes;  // one operand's stage (kBlockN == kBlockM)
constexpr int kStageBytes = 2 * kTileBytes;
constexpr int kMTiles = 4, kNTiles = 4;  // a warp's m16 and n8 tiles: 64 × 32

// Stage kt of `rows` rows of a K-major operand (A or B) into a tile: 4 pieces of 16 bytes a row,
// zeros past the matrix (rows ≥ rows_total, k ≥ K) so that the tails add nothing.
__device__ __forceinline__ void load_tile(unsigned char* tile_sh, const uint8_t* src, int64_t row0,
                                          int64_t rows_total, int64_t k, int kt) {
#pragma unroll
  for (int c = threadIdx.x; c < kBlockM * 4; c += kThreads) {
    const int r = c / 4, piece = c % 4;
    const int64_t gr = row0 + r, gk = int64_t(kt) * kBlockK + 16 * piece;
    const bool valid = gr < rows_total && gk < k;
    ptx::cp_async_16(tile_sh + r * kRowBytes + 16 * piece, valid ? src + gr * k + gk : src, valid);  // (rows, K)
  }
}

__global__ void __launch_bounds__(kThreads) fp8_v0_kernel(const GemmArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int wm = warp / 4, wn = warp % 4;  // the warp's 64 × 32 piece of the tile
  const int64_t m0 = int64_t(blockIdx.y) * kBlockM, n0 = int64_t(blockIdx.x) * kBlockN;
  const int k_tiles = int((a.k + kBlockK - 1) / kBlockK);
  auto a_tile = [&](int kt) { return smem + (kt % kStages) * kStageBytes; };
  auto b_tile = [&](int kt) { return a_tile(kt) + kTileBytes; };
  auto load_stage = [&](int kt) {
    if (kt < k_tiles) {
      load_tile(a_tile(kt), a.a, m0, a.m, a.k, kt);
      load_tile(b_tile(kt), a.b, n0, a.n, a.k, kt);
    }
    ptx::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMTiles][kNTiles][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_stage(s);

  for (int kt = 0; kt < k_tiles; ++kt) {
    // Wait: stage kt landed (kStages − 2 newer groups may fly); everyone is past stage kt − 1,
    // whose slot is refilled next.
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();
    load_stage(kt + kStages - 1);
    // Compute: per k32 step, A fragments of 4 m16 tiles and B fragments of 4 n8 tiles by ldmatrix.
    const unsigned char* as = a_tile(kt) + (wm * 64) * kRowBytes;
    const unsigned char* bs = b_tile(kt) + (wn * 32) * kRowBytes;
#pragma unroll
    for (int ks = 0; ks < kBlockK / 32; ++ks) {
      // BEGIN SOLUTION: lane l names row (l % 8) + 8·((l / 8) % 2) of an A m16 tile at byte
      //   32·ks + 16·(l / 16), and row (l % 8) + 8·(l / 16) of a pair of B n8 tiles at byte
      //   32·ks + 16·((l / 8) % 2); ldmatrix_x4 then gives a0..a3, and b0, b1 of both n8 tiles.
      uint32_t af[kMTiles][4], bf[kNTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ptx::ldmatrix_x4(af[mt], as + (16 * mt + lane % 8 + 8 * ((lane / 8) % 2)) * kRowBytes +
                                     32 * ks + 16 * (lane / 16));
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t r[4];
        ptx::ldmatrix_x4(r, bs + (16 * np + lane % 8 + 8 * (lane / 16)) * kRowBytes + 32 * ks +
                                16 * ((lane / 8) % 2));
        bf[2 * np][0] = r[0], bf[2 * np][1] = r[1], bf[2 * np + 1][0] = r[2], bf[2 * np + 1][1] = r[3];
      }
      // END SOLUTION
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) ptx::mma_e4m3_16832(acc[mt][j], af[mt], bf[j][0], bf[j][1]);
    }
  }
  ptx::cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits

  // Store: y = bf16(s_a · (s_b · acc)), rows past M and columns past N dropped.
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const int64_t col = n0 + wn * 32 + 8 * j + 2 * t;
    const float sb0 = col_scale(a, col), sb1 = col_scale(a, col + 1);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int64_t row = m0 + wm * 64 + 16 * mt + g;
      store_pair(a, row, col, acc[mt][j][0], acc[mt][j][1], row_scale(a, row), sb0, sb1);
      store_pair(a, row + 8, col, acc[mt][j][2], acc[mt][j][3], row_scale(a, row + 8), sb0, sb1);
    }
  }
}

Status gemm_v0(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(a, {Granularity::kTensor, Granularity::kRowwise}, 89, "v0_mma_sync");
  if (!s.ok()) return s;
  const dim3 grid(unsigned((a.n + kBlockN - 1) / kBlockN), unsigned((a.m + kBlockM - 1) / kBlockM));
  return launch_with_smem(fp8_v0_kernel, grid, kThreads, kStages * kStageBytes, stream, kOp, a);
}

const Register kRegistered{gemm_version(
    kOp, "v0_mma_sync", "mma.sync m16n8k32 E4M3 from a cp.async ring, ldmatrix fragments", gemm_v0, 89,
    {{"fp8_v0_kernel", {"sm_89"}, {"QMMA", "LDGSTS", "LDSM"}, {"HMMA", "F2FP.F16.E4M3"}, true,
      "sm_89 runs FP8 mma.sync natively (QMMA)"},
     {"fp8_v0_kernel", {"sm_90a"}, {"HMMA.16816", "F2FP.F16.E4M3.UNPACK_B"}, {"QMMA", "QGMMA"}, true,
      "sm_90a has no FP8 mma.sync: ptxas converts to FP16 (F2FP) and issues HMMA.16816"}})};

}  // namespace
}  // namespace lkw::fp8
