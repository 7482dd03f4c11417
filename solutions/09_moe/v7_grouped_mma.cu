// v7_grouped_mma — every expert's GEMM in one launch, x rows gathered through sorted_token_ids.
//
// Since the align (v0–v3): its output is the grouped GEMM's schedule. A block takes BM = 16·kMTiles
// rows of sorted_token_ids (inside one align block, so one expert) and 128 output channels:
// expert_ids names the expert (−1: the block returns at once), each row's slot s names the
// token s / topk whose x row it gathers (the sentinel T·topk: a zero row, nothing stored). Then
// it is chapter 07's v2 ring with BF16 weights: 64-k stages of the gathered x rows and of
// w[e]'s 128 rows copied by cp.async (no register held in flight: a gather costs no more than a
// dense tile), ldmatrix for both operands (w's rows are the mma's "col" B, as stored), mma.sync
// m16n8k16 with FP32 sums, each row's result stored at out[s]. BM is the largest of 64, 32, 16
// that divides BLOCK_M and fits the rows an expert gets on average: at decode an expert holds
// a row or two, and a 64-row tile would multiply 62 sentinel rows for nothing.
// Expect: one launch for all experts, the routed experts' weights read once per BM rows;
// SASS: LDGSTS, LDSM, HMMA, no local memory.
#include "lkw/ptx.cuh"
#include "experts.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 128;  // 4 warps side by side over N
constexpr int kWarpN = 32;     // a warp's channels: four n8 tiles
constexpr int kNTiles = kWarpN / 8;
constexpr int kBlockN = kThreads / 32 * kWarpN;
constexpr int kBlockK = 64;             // k per stage: four k16 steps
constexpr int kRowElems = kBlockK + 8;  // 144-byte rows: ldmatrix's 8 rows hit 8 bank groups
constexpr int kStages = 3;

static_assert(kBlockN * (kBlockK / 8) % kThreads == 0 && 16 * (kBlockK / 8) == kThreads,
              "whole pieces per thread: kMTiles of x, 8 of w");

template <int kMTiles>
constexpr int stage_elems() { return (16 * kMTiles + kBlockN) * kRowElems; }

// The stage row of the first weight row of warp `warp`'s n8-tile pair jp: warps side by side.
__device__ __forceinline__ int b_pair_row(int warp, int jp) { return warp * kWarpN + 16 * jp; }

// Stage load: k from kt·64 of the tile's gathered x rows (token_sh: −1 = sentinel row) and of
// the expert's weight rows n0 .. n0 + 127, in 16-byte pieces. Pieces past K, past N or of a
// sentinel row read nothing and land as zeros (they meet real values in the mma).
template <int kMTiles>
__device__ __forceinline__ void load_stage(__nv_bfloat16* a_sh, __nv_bfloat16* b_sh,
                                           const __nv_bfloat16* x, const __nv_bfloat16* w_e,
                                           const int* token_sh, int64_t n0, int kt, int64_t n,
                                           int64_t k) {
  constexpr int kPiecesPerRow = kBlockK / 8;
  // BEGIN SOLUTION: the x rows: piece c is row c / 8, column 8·(c % 8) of the stage; the row's
  //   token from token_sh (−1: a sentinel row) or k past K copies nothing (valid = false)
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
  // END SOLUTION
#pragma unroll
  for (int i = 0; i < kBlockN * kPiecesPerRow / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int row = c / kPiecesPerRow, col = 8 * (c % kPiecesPerRow);
    const int64_t gn = n0 + row, gk = int64_t(kt) * kBlockK + col;
    const bool valid = gn < n && gk < k;
    const __nv_bfloat16* src = valid ? w_e + gn * k + gk : w_e;  // (N, K)
    ptx::cp_async_16(b_sh + row * kRowElems + col, src, valid);
  }
}

template <int kMTiles>
__global__ void __launch_bounds__(kThreads)
    grouped_v7_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                      const int32_t* __restrict__ sorted_ids,
                      const int32_t* __restrict__ expert_ids, __nv_bfloat16* __restrict__ out,
                      int slots, int64_t n, int64_t k, int num_experts, int topk, int block_m) {
  constexpr int kBM = 16 * kMTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int slot_sh[kBM], token_sh[kBM];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kBM;  // rows < 2^31: 32-bit index arithmetic
  const int64_t n0 = int64_t(blockIdx.y) * kBlockN;

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
      load_stage<kMTiles>(a_stage(kt % kStages), b_stage(kt % kStages), x, w_e, token_sh, n0, kt,
                          n, k);
    ptx::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMTiles][kNTiles][4] = {};
  const bool warp_live = n0 + warp * kWarpN < n;  // N % 128 != 0: the last block's idle warps
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

  // Stage store: row r of the tile is slot slot_sh[r]'s row of out; sentinel rows store nothing.
  if (!warp_live) return;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int s = slot_sh[16 * mt + g + 8 * half];
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int64_t col = n0 + warp * kWarpN + 8 * j + 2 * t;
        if (s >= 0 && col < n)  // N is a multiple of 8: an n8 tile is all in or all out
          *reinterpret_cast<__nv_bfloat162*>(out + int64_t(s) * n + col) =  // (T·topk, N)
              __floats2bfloat162_rn(acc[mt][j][2 * half], acc[mt][j][2 * half + 1]);
      }
    }
}

template <int kMTiles>
Status launch(const GroupedArgs& a, cudaStream_t stream) {
  const dim3 grid(unsigned(a.rows / (16 * kMTiles)), unsigned(ceil_div(a.n, kBlockN)));
  return launch_with_smem(grouped_v7_kernel<kMTiles>, grid, kThreads,
                          kStages * stage_elems<kMTiles>() * 2, stream, kGroupedOp, a.x, a.w,
                          a.sorted_ids, a.expert_ids, a.out, int(a.t * a.topk), a.n, a.k,
                          a.num_experts, a.topk, a.block_m);
}

Status grouped_v7_mma(const GroupedArgs& a, cudaStream_t stream) {
  Status s = validate_grouped(a);
  if (!s.ok()) return s;
  switch (row_tiles_for(a)) {
    case 1: return launch<1>(a, stream);
    case 2: return launch<2>(a, stream);
    default: return launch<4>(a, stream);
  }
}

const Register kRegistered{grouped_version(
    false, "v7_grouped_mma", "rows gathered through sorted_token_ids, cp.async ring, mma.sync",
    grouped_v7_mma,
    {{"grouped_v7_kernel",
      {},
      {"HMMA", "LDGSTS", "LDSM"},
      {},
      true,
      "cp.async gather, ldmatrix, tensor cores, nothing spilled"}})};

}  // namespace
}  // namespace lkw::moe
