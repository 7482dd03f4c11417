// v6_small_m — decode's M: the weights stream through mma.sync, the few tokens on its narrow side.
//
// Since v5: at M ≤ 16 a 128-row wgmma tile is mostly padding, and the work is a stream of B (N·K
// bytes read once) that v5's TMA ring, built for reuse, does not keep full. v6 swaps the operands
// as chapter 06's GEMV did: B's rows are the m16n8k16 mma's 16-row side, the tokens its 8-wide
// side. No shared-memory ring: each warp holds its rows' next K blocks in registers (16-byte loads,
// 8 rows × 64 contiguous bytes each), the 8 warps of a block take turns along K and add their sums
// in shared memory at the end, in warp order. Each K block's sum is promoted with its scales (v4's
// rule; scale 1 for tensor and rowwise). B is converted to FP16 once (cvt, exact) for every token
// tile. Every block reads all of A (from L2): with several token tiles a block owns 32 rows of B,
// so that each token word loaded serves both 16-row tiles (a launch knob). The k order inside a
// block is the loads' (lane t: bytes 16t and 64 + 16t), the same for both operands. PDL: B is asked
// for before the kernel ahead ends, A and the scales after griddepcontrol.wait. M > 16: v5.
// Expect most of the copy ceiling where N·K fills the GPU. SASS: HMMA.16816 fed by F2FP, no spills.
#include <algorithm>

#include "fp8_gemm.cuh"
#include "lkw/launch.h"
#include "lkw/ptx.cuh"

namespace lkw::fp8 {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRows = 16;      // B rows (columns of y) a block owns: the mma's 16-row side
constexpr int kTokens = 32;    // rows of A a block takes: at most 4 n8 tiles
constexpr int kGemvMaxM = 16;  // larger M: v5 (faster at M = 32: results, book 08)
constexpr int kBlockBytes = kScaleBlock;  // a K block: 128 bytes of each row, 4 mma k-steps

// K blocks a warp has in flight, 2 KB each a row tile: with one token tile 4 (16 loads of 16 bytes
// a lane, two blocks of 8 warps an SM), with more what their fragments and sums leave room for
// without spilling. Row tiles a block owns (kR, a launch knob): two, where there are several token
// tiles, let each token word a lane loads (from L2: every block reads all of A) serve 32 rows of B;
// they take the registers of one block an SM.
template <int kTiles, int kR>
constexpr int in_flight() {
  return kTiles == 1 ? 4 : kR == 2 ? 2 : kTiles == 2 ? 3 : 1;
}
template <int kR>
constexpr int blocks_per_sm() {
  return kR == 1 ? 2 : 1;
}

// A lane's two 16-byte pieces of one row (of B or of A) in K block kb: bytes 16t and 64 + 16t,
// zeros past K (K is a multiple of 16: a piece is whole or absent). B goes through the streaming
// load (read once: first out of the caches), A through the read-only path (every block reads it).
template <bool kStream>
__device__ __forceinline__ void load_pieces(uint4 (&v)[2], const uint8_t* row, int64_t kb, int t,
                                            int64_t k) {
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int64_t at = kb * kBlockBytes + 64 * p + 16 * t;
    const uint4* src = reinterpret_cast<const uint4*>(row + at);
    v[p] = at < k ? (kStream ? __ldcs(src) : __ldg(src)) : make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ uint32_t word(const uint4 (&v)[2], int q) {  // 4-byte word q of 8
  const uint4& piece = v[q / 4];
  return q % 4 == 0 ? piece.x : q % 4 == 1 ? piece.y : q % 4 == 2 ? piece.z : piece.w;
}

// The E4M3 pair in half h (0: bytes 0-1, 1: bytes 2-3) of word w as an FP16 pair, the lower byte in
// the lower half: one cvt (F2FP), exact.
__device__ __forceinline__ uint32_t f16_pair(uint32_t w, int h) {
  const __half2_raw p = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> (16 * h)), __NV_E4M3);
  return uint32_t(p.x) | uint32_t(p.y) << 16;
}

template <int kTiles, int kR, bool kBlockwise>
__global__ void __launch_bounds__(kThreads, blocks_per_sm<kR>()) fp8_v6_kernel(const GemmArgs a) {
  constexpr int kU = in_flight<kTiles, kR>();
  __shared__ float partial_sh[kWarps][kR * kTiles * 4][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * kRows * kR, m0 = int64_t(blockIdx.y) * kTokens;
  const int64_t k_blocks = (a.k + kBlockBytes - 1) / kBlockBytes, stride = int64_t(kWarps) * kU;
  float acc[kR][kTiles][4] = {};

  // Load: the warp's kU K blocks from kb0, both of the lane's rows (g and g + 8) of each row tile
  // (a tile past N, the last block's when N / 16 is odd: zeros, never stored).
  uint4 w[kU][kR][2][2];
  auto load_weights = [&](int64_t kb0) {
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = n0 + kRows * r + g + 8 * h;
          w[u][r][h][0] = w[u][r][h][1] = make_uint4(0, 0, 0, 0);
          if (row < a.n) load_pieces<true>(w[u][r][h], a.b + row * a.k, kb0 + u, t, a.k);  // (N, K)
        }
  };
  int64_t kb0 = int64_t(warp) * kU;
  load_weights(kb0);            // B does not depend on the kernel ahead: asked for first
  ptx::grid_dependency_wait();  // A and its scales may: that kernel wrote them

  for (; kb0 < k_blocks; kb0 += stride) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t kb = kb0 + u;
      if (kb >= k_blocks) break;
      // Compute: each (row tile, token tile)'s fresh sum of this K block, 8 k16 steps of one word
      // each; the tokens are loaded once for all row tiles.
      uint4 x[kTiles][2];
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt) {
        const int64_t m = m0 + 8 * nt + g;  // the token this lane brings to tile nt
        x[nt][0] = x[nt][1] = make_uint4(0, 0, 0, 0);
        if (m < a.m) load_pieces<false>(x[nt], a.a + m * a.k, kb, t, a.k);  // (M, K)
      }
      float c[kR][kTiles][4] = {};
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          // BEGIN SOLUTION: word j of rows g and g + 8, converted once to FP16 pairs (a0, a1 the
          //   low pairs, a2, a3 the high ones), against each tile's token word j (b0 low, b1 high)
          const uint32_t r0 = word(w[u][r][0], j), r1 = word(w[u][r][1], j);
          const uint32_t frag[4] = {f16_pair(r0, 0), f16_pair(r1, 0), f16_pair(r0, 1),
                                    f16_pair(r1, 1)};
#pragma unroll
          for (int nt = 0; nt < kTiles; ++nt) {
            const uint32_t token = word(x[nt], j);
            ptx::mma_f16_16816(c[r][nt], frag, f16_pair(token, 0), f16_pair(token, 1));
          }
          // END SOLUTION
        }
      // Promote: sum c[r][nt][i] is row n0 + 16r + g + 8·(i / 2) of B (one scale block: 16·kR
      // divides 128), token m0 + 8nt + 2t + i % 2.
      const float s_b = kBlockwise ? *block_scale_b(a, n0, int(kb)) : 1.f;
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float s =
              kBlockwise ? *block_scale_a(a, m0 + 8 * nt + 2 * t + q, int(kb)) * s_b : 1.f;
#pragma unroll
          for (int r = 0; r < kR; ++r)
#pragma unroll
            for (int i = q; i < 4; i += 2) acc[r][nt][i] = fmaf(c[r][nt][i], s, acc[r][nt][i]);
        }
    }
    if (kb0 + stride < k_blocks) load_weights(kb0 + stride);
  }

  // Reduce: the 8 warps' sums in shared memory, added in warp order.
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial_sh[warp][(r * kTiles + nt) * 4 + i][lane] = acc[r][nt][i];
  __syncthreads();
  // Store: y[m, n] = bf16(s_a · (s_b · sum)) (blockwise: the sum is scaled already).
  for (int e = threadIdx.x; e < kR * kTiles * 4 * 32; e += kThreads) {
    const int slot = e / 32, l = e % 32, i = slot % 4, nt = (slot / 4) % kTiles,
              r = slot / (4 * kTiles);
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += partial_sh[v][slot][l];
    const int64_t n = n0 + kRows * r + l / 4 + 8 * (i / 2), m = m0 + 8 * nt + 2 * (l % 4) + i % 2;
    if (m < a.m && n < a.n)
      a.y[m * a.n + n] = __float2bfloat16_rn(
          kBlockwise ? sum : row_scale(a, m) * (col_scale(a, n) * sum));  // (M, N)
  }
}

template <int kTiles, int kR>
auto gemv_kernel(bool blockwise) {
  return blockwise ? fp8_v6_kernel<kTiles, kR, true> : fp8_v6_kernel<kTiles, kR, false>;
}

// The GEMV at any M (32 tokens a grid row: above 32 each row re-reads B, which is v5's to avoid),
// with two row tiles a block where there are several token tiles (kTwoRowTiles), as a programmatic
// dependent of the kernel ahead where pdl is on and the device has it.
template <bool kTwoRowTiles>
Status launch_gemv(const GemmArgs& a, bool pdl, cudaStream_t stream) {
  constexpr int kR = kTwoRowTiles ? 2 : 1;
  const int64_t tokens = std::min<int64_t>(a.m, kTokens);
  const bool blockwise = a.granularity == Granularity::kBlockwise;
  const auto kernel = tokens <= 8    ? gemv_kernel<1, 1>(blockwise)
                      : tokens <= 16 ? gemv_kernel<2, kR>(blockwise)
                                     : gemv_kernel<4, kR>(blockwise);
  const int rows = kRows * (tokens <= 8 ? 1 : kR);
  if ((a.m + kTokens - 1) / kTokens > 65535)
    return error(Code::kInvalidArgument,
                 "v6_small_m: M must be at most 65535 · 32 (grid rows of 32 tokens)");
  const dim3 grid(unsigned((a.n + rows - 1) / rows), unsigned((a.m + kTokens - 1) / kTokens));
  return launch_dependent(kernel, grid, kThreads, 0, pdl, stream, "v6_small_m", a);
}

// The version: the GEMV up to kGemvMaxM tokens, v5 above. The ablations, one knob each: PDL off;
// the GEMV at every M (the bench's M = 32, 64 and 128 rows, where v5 takes over); one row tile a
// block at every M.
template <bool kPdl = true, bool kGemvOnly = false, bool kTwoRowTiles = true>
Status gemm_v6(const GemmArgs& a, cudaStream_t stream) {
  const char* id = kGemvOnly       ? "ablation_v6_gemv_only"
                   : !kTwoRowTiles ? "ablation_v6_one_row_tile"
                   : kPdl          ? "v6_small_m"
                                   : "ablation_v6_no_pdl";
  if (!kGemvOnly && a.m > kGemvMaxM) return gemm_v5_tuned(a, stream);
  Status s = validate_gemm(
      a, {Granularity::kTensor, Granularity::kRowwise, Granularity::kBlockwise}, 90, id);
  if (!s.ok()) return s;
  return launch_gemv<kTwoRowTiles>(a, kPdl, stream);
}

// HMMA fed by F2FP conversions (cvt e4m3x2 -> f16x2); LDG.E.EF.128, the weights' streaming loads.
const SassFact kGemvFacts{
    "fp8_v6_kernel",     {"sm_90a"}, {"HMMA.16816", "F2FP.F16.E4M3.UNPACK_B", "LDG.E.EF.128"},
    {"LDGSTS", "QGMMA"}, true,       "the swapped GEMV: mma.sync on 16 rows of B, no ring"};
const RegisterGemm kRegistered{
    {kBlockwiseOp, kOp},
    "v6_small_m",
    "M <= 16: B streamed through mma.sync with the tokens as the 8-wide side; v5 above",
    gemm_v6<>,
    90,
    {kGemvFacts}};
const RegisterGemm kNoPdl{{kBlockwiseOp, kOp},
                          "ablation_v6_no_pdl",
                          "v6 launched without PDL: the weights wait for the kernel ahead to end",
                          gemm_v6<false>,
                          90,
                          {kGemvFacts},
                          Kind::kAblation};
const RegisterGemm kGemvOnly{{kBlockwiseOp, kOp},
                             "ablation_v6_gemv_only",
                             "v6's GEMV at every M (32 tokens a grid row), no hand-over to v5",
                             gemm_v6<true, true>,
                             90,
                             {kGemvFacts},
                             Kind::kAblation};
const RegisterGemm kOneRowTile{
    {kBlockwiseOp, kOp},
    "ablation_v6_one_row_tile",
    "v6 with 16 rows of B a block at every M: each token load serves 16 rows",
    gemm_v6<true, false, false>,
    90,
    {kGemvFacts},
    Kind::kAblation};

}  // namespace
}  // namespace lkw::fp8
