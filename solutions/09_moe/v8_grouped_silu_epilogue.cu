// v8_grouped_silu_epilogue — the gate_up GEMM with SiLU-and-mul in its epilogue.
//
// Since v7: w holds gate || up ([E, N, K], gate rows first: vLLM's w13), and what the MoE layer
// needs next is h = silu(gate) · up [T·topk, N/2], never gate_up itself. A block now computes 64
// output channels: the first 64 rows of its weight stage are gate rows c0 .. c0 + 63, the last
// 64 the up rows N/2 + c0 .. of the same channels, and a warp's two n8-tile pairs are 16 gate
// rows and the 16 up rows of the same channels. So each thread ends with the gate and the up
// of the same outputs in its registers: silu(g) · u in FP32 (g and u are never rounded to BF16,
// one rounding at the end), and the block stores N/2 channels. The mma work is v7's; the store
// is half of it, and the chain loses a kernel: gate_up (T·topk·N·2 bytes) is neither written
// nor read back by a silu_and_mul pass. N must be a multiple of 16 (two halves of n8 tiles).
// Expect: as v7's mma loop; out bytes halved and the silu_and_mul kernel gone from the chain;
// SASS: LDGSTS, LDSM, HMMA, MUFU (the exponential), no local memory.
#include "lkw/ptx.cuh"
#include "experts.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 128;  // 4 warps side by side over the output channels
constexpr int kWarpN = 32;     // a warp's weight rows: four n8 tiles, 16 gate and 16 up
constexpr int kNTiles = kWarpN / 8;
constexpr int kBlockN = kThreads / 32 * kWarpN;  // weight rows per stage
constexpr int kHalfN = kBlockN / 2;              // output channels per block
constexpr int kBlockK = 64;             // k per stage: four k16 steps
constexpr int kRowElems = kBlockK + 8;  // 144-byte rows: ldmatrix's 8 rows hit 8 bank groups
constexpr int kStages = 3;

static_assert(kBlockN * (kBlockK / 8) % kThreads == 0 && 16 * (kBlockK / 8) == kThreads,
              "whole pieces per thread: kMTiles of x, 8 of w");

template <int kMTiles>
constexpr int stage_elems() { return (16 * kMTiles + kBlockN) * kRowElems; }

// The stage row of the first weight row of warp `warp`'s n8-tile pair jp: pair 0 is the warp's
// 16 gate rows (first half of the stage), pair 1 its 16 up rows (second half).
__device__ __forceinline__ int b_pair_row(int warp, int jp) { return jp * kHalfN + 16 * warp; }

// Stage load: k from kt·64 of the tile's gathered x rows (token_sh: −1 = sentinel row) and of
// the expert's gate rows c0 .. c0 + 63 then up rows N/2 + c0 .., in 16-byte pieces. Pieces past
// K, past N/2 or of a sentinel row read nothing and land as zeros.
template <int kMTiles>
__device__ __forceinline__ void load_stage(__nv_bfloat16* a_sh, __nv_bfloat16* b_sh,
                                           const __nv_bfloat16* x, const __nv_bfloat16* w_e,
                                           const int* token_sh, int64_t c0, int kt, int64_t n,
                                           int64_t k) {
  constexpr int kPiecesPerRow = kBlockK / 8;
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {  // 16·kMTiles rows of 8 pieces: kMTiles per thread
    const int c = threadIdx.x + i * kThreads;
    const int row = c / kPiecesPerRow, col = 8 * (c % kPiecesPerRow);
    const int token = token_sh[row];
    const int64_t gk = int64_t(kt) * kBlockK + col;
    const bool valid = token >= 0 && gk < k;
    const __nv_bfloat16* src = valid ? x + token * k + gk : x;  // (T, K)
    ptx::cp_async_16(a_sh + row * kRowElems + col, src, valid);
  }
#pragma unroll
  for (int i = 0; i < kBlockN * kPiecesPerRow / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int row = c / kPiecesPerRow, col = 8 * (c % kPiecesPerRow);
    // BEGIN SOLUTION: stage row `row` is gate row c0 + row (first half) or up row
    //   N/2 + c0 + row − 64 (second half); valid while the channel is below N/2 and k below K
    const int64_t channel = c0 + row % kHalfN, gk = int64_t(kt) * kBlockK + col;
    const int64_t gn = (row < kHalfN ? 0 : n / 2) + channel;
    const bool valid = channel < n / 2 && gk < k;
    // STUB: const int64_t gn = 0, gk = 0;
    // STUB: const bool valid = false;
    // END SOLUTION
    const __nv_bfloat16* src = valid ? w_e + gn * k + gk : w_e;  // (N, K)
    ptx::cp_async_16(b_sh + row * kRowElems + col, src, valid);
  }
}

template <int kMTiles>
__global__ void __launch_bounds__(kThreads)
    grouped_v8_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                      const int32_t* __restrict__ sorted_ids,
                      const int32_t* __restrict__ expert_ids, __nv_bfloat16* __restrict__ out,
                      int slots, int64_t n, int64_t k, int num_experts, int topk, int block_m) {
  constexpr int kBM = 16 * kMTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int slot_sh[kBM], token_sh[kBM];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kBM;  // rows < 2^31: 32-bit index arithmetic
  const int64_t c0 = int64_t(blockIdx.y) * kHalfN;

  // Stage rows: which expert, which slots, which tokens (one division a row). A block of no
  // expert (or of an id past E) and a tile of sentinels only have nothing to compute: the whole
  // block leaves together.
  const int expert = expert_ids[row0 / block_m];  // (rows / BLOCK_M)
  if (expert < 0 || expert >= num_experts) return;
  int slot = -1;
  if (threadIdx.x < kBM) {
    slot = sorted_ids[row0 + threadIdx.x];  // (rows)
    slot = slot >= 0 && slot < slots ? slot : -1;
    slot_sh[threadIdx.x] = slot;
    token_sh[threadIdx.x] = slot >= 0 ? slot / topk : -1;
  }
  if (!__syncthreads_or(slot >= 0)) return;

  const __nv_bfloat16* w_e = w + int64_t(expert) * n * k;  // (E, N, K) → (N, K)
  const int k_tiles = int((k + kBlockK - 1) / kBlockK);
  auto a_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(smem) + s * stage_elems<kMTiles>();
  };
  auto b_stage = [&](int s) { return a_stage(s) + kBM * kRowElems; };
  auto fetch = [&](int kt) {
    if (kt < k_tiles)
      load_stage<kMTiles>(a_stage(kt % kStages), b_stage(kt % kStages), x, w_e, token_sh, c0, kt,
                          n, k);
    ptx::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMTiles][kNTiles][4] = {};
  const bool warp_live = c0 + 16 * warp < n / 2;  // N/2 % 64 != 0: the last block's idle warps
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) fetch(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt visible to all; every warp is done with the slot refilled next
    fetch(kt + kStages - 1);
    if (!warp_live) continue;
    const __nv_bfloat16* a_sh = a_stage(kt % kStages);
    const __nv_bfloat16* b_sh = b_stage(kt % kStages);
#pragma unroll
    for (int ks = 0; ks < kBlockK / 16; ++ks) {
      if (int64_t(kt) * kBlockK + 16 * ks >= k) break;  // K's tail: no k16 step of zeros only
      uint32_t a[kMTiles][4], b[kNTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {  // matrices: rows 0-7 | 8-15 × k 0-7 | 8-15
        const int row = 16 * mt + lane % 8 + 8 * ((lane / 8) % 2), col = 16 * ks + 8 * (lane / 16);
        ptx::ldmatrix_x4(a[mt], a_sh + row * kRowElems + col);
      }
#pragma unroll
      for (int jp = 0; jp < kNTiles / 2; ++jp) {  // matrices: n tile 2jp | 2jp+1 × k 0-7 | 8-15
        uint32_t r[4];
        const int row = b_pair_row(warp, jp) + lane % 8 + 8 * (lane / 16);
        const int col = 16 * ks + 8 * ((lane / 8) % 2);
        ptx::ldmatrix_x4(r, b_sh + row * kRowElems + col);
        b[2 * jp][0] = r[0], b[2 * jp][1] = r[1], b[2 * jp + 1][0] = r[2], b[2 * jp + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) ptx::mma_bf16_16816(acc[mt][j], a[mt], b[j][0], b[j][1]);
    }
  }
  ptx::cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits

  // Stage store: tile j (gate) and tile j + 2 (up) hold the same outputs; row r of the tile is
  // slot slot_sh[r]'s row of out; sentinel rows store nothing.
  if (!warp_live) return;
  const int64_t out_n = n / 2;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int s = slot_sh[16 * mt + g + 8 * half];
#pragma unroll
      for (int j = 0; j < kNTiles / 2; ++j) {
        const int64_t col = c0 + 16 * warp + 8 * j + 2 * t;
        const float* gate = &acc[mt][j][2 * half];             // columns col, col + 1
        const float* up = &acc[mt][j + kNTiles / 2][2 * half];  // the same two channels
        // BEGIN SOLUTION: h = silu(gate) · up for both columns (sigmoid from moe.cuh), in FP32,
        //   rounded once into a bf16 pair
        const __nv_bfloat162 h = __floats2bfloat162_rn(gate[0] * sigmoid(gate[0]) * up[0],
                                                       gate[1] * sigmoid(gate[1]) * up[1]);
        // STUB: const __nv_bfloat162 h = __floats2bfloat162_rn(0.0f, 0.0f);
        // END SOLUTION
        if (s >= 0 && col < out_n)  // N/2 is a multiple of 8: an n8 tile is all in or all out
          *reinterpret_cast<__nv_bfloat162*>(out + int64_t(s) * out_n + col) = h;  // (T·topk, N/2)
      }
    }
}

template <int kMTiles>
Status launch(const GroupedArgs& a, cudaStream_t stream) {
  const dim3 grid(unsigned(a.rows / (16 * kMTiles)), unsigned(ceil_div(a.n / 2, kHalfN)));
  return launch_with_smem(grouped_v8_kernel<kMTiles>, grid, kThreads,
                          kStages * stage_elems<kMTiles>() * 2, stream, kGroupedSiluOp, a.x, a.w,
                          a.sorted_ids, a.expert_ids, a.out, int(a.t * a.topk), a.n, a.k,
                          a.num_experts, a.topk, a.block_m);
}

Status grouped_v8_silu(const GroupedArgs& a, cudaStream_t stream) {
  Status s = validate_grouped(a);
  if (!s.ok()) return s;
  switch (row_tiles_for(a)) {
    case 1: return launch<1>(a, stream);
    case 2: return launch<2>(a, stream);
    default: return launch<4>(a, stream);
  }
}

const Register kRegistered{grouped_version(
    true, "v8_grouped_silu_epilogue", "gate and up tiles side by side, silu(gate)·up stored",
    grouped_v8_silu,
    {{"grouped_v8_kernel",
      {},
      {"HMMA", "LDGSTS", "LDSM", "MUFU.EX2"},
      {},
      true,
      "cp.async gather, ldmatrix, tensor cores, the exponential in the epilogue, no spills"}})};

}  // namespace
}  // namespace lkw::moe
