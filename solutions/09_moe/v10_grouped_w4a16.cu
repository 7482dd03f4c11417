// v10_grouped_w4a16 — v7 with INT4 weights: chapter 07's repacked words, group scales, split-K.
//
// Since v7: expert e's weights are chapter 07's INT4 (uint32 [N/64, 8K] repacked, BF16 scales
// [K/G, N], W_hat = s·(q − 8)). The weights' side is chapter 07's v4: a stage copies each
// 64-channel block's 2 KB run of words and its two scale rows into shared memory; a k16 step is
// one 16-byte shared read per lane (B fragments of 64 channels), four lop3 unpacks and an HMUL2
// by the scale before the mma. At decode (T ≤ 64) the bound is the routed experts' weights, 0.5
// byte per weight + 2/G of scale: a quarter of v7's. But decode routes a few experts, and a small
// N leaves a few dozen tiles (Mixtral's down GEMM at T = 1: 2 experts × 16 = 32 blocks streaming
// K = 14336 each): so K is split as in chapter 07's v5 where the tiles of a uniform routing would
// leave SMs idle; each split stores its FP32 rows by slot, the last to arrive sums them in split
// order. Expect: near the copy bound on the routed experts' bytes at T ≤ 64. SASS: LDGSTS, LDSM
// (x), LDS.128 (words), LOP3, HMMA, no I2F, no local memory.
#include "02_int4_dequant/dequant.cuh"
#include "07_w4a16_gemm/gemm_plan.h"
#include "07_w4a16_gemm/tiles.cuh"
#include "lkw/ptx.cuh"
#include "experts_w4a16.cuh"

namespace lkw::moe {
namespace {

using w4a16::bits_of;  // chapter 07's register helpers
using w4a16::group_shift_of;
using w4a16::SplitCut;
// Chapter 07's tiles (tiles.cuh): 4 warps side by side over N, 64 channels (one repacked block,
// eight n8 tiles) a warp, 64-k stages of four k16 steps, x rows padded to 144 bytes so that
// ldmatrix's 8 rows hit 8 bank groups.
using w4a16::kBlockK;
using w4a16::kBlockN;
using w4a16::kKSteps;
using w4a16::kNTiles;
using w4a16::kThreads;
using w4a16::kWarpN;
constexpr int kRowElems = w4a16::kARowElems;
constexpr int kStages = 4;
constexpr int kStepWords = 32 * 4;                 // a 64-channel block's words per k16 step
constexpr int kBlockWords = kKSteps * kStepWords;  // per stage: 2 KB, contiguous in HBM
constexpr int kScaleRows = 2;  // the groups of k 0..31 and 32..63 of a stage (one at G ≥ 64)

static_assert(kWarpN == kRepackN, "a warp's 16-byte read per k16 step is one repacked block");
static_assert(16 * (kBlockK / 8) == kThreads && kScaleRows * kBlockN / 8 <= kThreads,
              "x: kMTiles pieces per thread; scales: one piece per thread at most");

template <int kMTiles>
constexpr int stage_bytes() {
  return 16 * kMTiles * kRowElems * 2 + kBlockN / kWarpN * kBlockWords * 4 +
         kScaleRows * kBlockN * 2;
}

// Stage load of x, as v7's: k from kt·64 of the tile's gathered rows (token_sh: −1 = sentinel
// row), 16-byte pieces; pieces past K or of a sentinel row read nothing and land as zeros.
template <int kMTiles>
__device__ __forceinline__ void load_x_stage(__nv_bfloat16* a_sh, const __nv_bfloat16* x,
                                             const int* token_sh, int kt, int64_t k) {
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
}

// Stage load of the expert's weights (w_e, s_e: already at expert e): the block's four 64-channel
// blocks, each its 2 KB run of [N/64][K/16][32 lanes][4 words], and the scale rows of k = 64·kt
// and 64·kt + 32 for the block's 256 channels (rows of [K/G, N]). k16 steps past K, channels
// past N and a half stage past K read nothing.
__device__ __forceinline__ void load_w4_stage(uint32_t* b_sh, __nv_bfloat16* s_sh,
                                              const uint32_t* w_e, const __nv_bfloat16* s_e,
                                              int64_t n0, int kt, int64_t n, int64_t k,
                                              int group_shift) {
  // BEGIN SOLUTION: chapter 07's v4 copies from w_e and s_e: piece c of the words is block
  //   c / 128, piece c % 128 of its 2 KB run; threads 0..63 copy the scales, row r = tid / 32
  //   holding group (64·kt + 32·r) >> group_shift, 8 channels a thread
#pragma unroll
  for (int c = threadIdx.x; c < kBlockN / kWarpN * kBlockWords / 4; c += kThreads) {
    const int block = c / (kBlockWords / 4), piece = c % (kBlockWords / 4);
    const int64_t gn = n0 + block * kWarpN, step = int64_t(kt) * kKSteps + piece / 32;
    const bool valid = gn < n && step < k / 16;
    const uint32_t* src =
        w_e + (gn / kWarpN) * (8 * k) + step * kStepWords + 4 * (piece % 32);  // (N/64, 8K)
    ptx::cp_async_16(b_sh + block * kBlockWords + 4 * piece, valid ? src : w_e, valid);
  }
  constexpr int kPieces = kBlockN / 8;
  if (threadIdx.x < kScaleRows * kPieces) {
    const int r = threadIdx.x / kPieces, piece = threadIdx.x % kPieces;
    const int64_t k_at = int64_t(kt) * kBlockK + 32 * r, gn = n0 + 8 * piece;
    const bool valid = k_at < k && gn < n;
    const __nv_bfloat16* src = s_e + (k_at >> group_shift) * n + gn;  // (K/G, N)
    ptx::cp_async_16(s_sh + r * kBlockN + 8 * piece, valid ? src : s_e, valid);
  }
  // STUB: (void)b_sh; (void)s_sh; (void)w_e; (void)s_e; (void)n0; (void)kt; (void)n; (void)k;
  // STUB: (void)group_shift;
  // END SOLUTION
}

template <int kMTiles>
__global__ void __launch_bounds__(kThreads)
    grouped_v10_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                       const __nv_bfloat16* __restrict__ scales,
                       const int32_t* __restrict__ sorted_ids,
                       const int32_t* __restrict__ expert_ids, __nv_bfloat16* __restrict__ out,
                       int slots, int64_t n, int64_t k, int64_t groups, int group_shift,
                       int num_experts, Divisor topk, Divisor block_m, SplitCut cut,
                       float* __restrict__ partials, unsigned* __restrict__ arrivals) {
  constexpr int kBM = 16 * kMTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int slot_sh[kBM], token_sh[kBM];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kBM;  // rows < 2^31: 32-bit index arithmetic
  const int64_t n0 = int64_t(blockIdx.y) * kBlockN;

  // Stage rows: which expert, which slots, which tokens (v7's, its two divisions by run-time
  // values as a multiply and a shift: no I2F in the kernel).
  const int expert = expert_ids[divide(row0, block_m)];  // (rows / BLOCK_M)
  if (expert < 0 || expert >= num_experts) return;
  int slot = -1;
  if (threadIdx.x < kBM) {
    slot = sorted_ids[row0 + threadIdx.x];  // (rows)
    slot = slot >= 0 && slot < slots ? slot : -1;
    slot_sh[threadIdx.x] = slot;
    token_sh[threadIdx.x] = slot >= 0 ? divide(slot, topk) : -1;
  }
  if (!__syncthreads_or(slot >= 0)) return;

  const uint32_t* w_e = w + int64_t(expert) * (n / kRepackN) * (8 * k);  // (E, N/64, 8K)
  const __nv_bfloat16* s_e = scales + int64_t(expert) * groups * n;      // (E, K/G, N)
  // This block's stages: all of K, or its split's share (chapter 07's v5; gridDim.z splits).
  const int splits = int(gridDim.z);
  int64_t begin = 0, end = (k + kBlockK - 1) / kBlockK;
  if (splits > 1) w4a16::split_range(cut, int(blockIdx.z), &begin, &end);
  const int stages = int(end - begin);
  auto a_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(smem + s * stage_bytes<kMTiles>());
  };
  auto b_stage = [&](int s) { return reinterpret_cast<uint32_t*>(a_stage(s) + kBM * kRowElems); };
  auto s_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(b_stage(s) + kBlockN / kWarpN * kBlockWords);
  };
  auto fetch = [&](int i) {  // the block's stage i: k tile begin + i, ring slot i % kStages
    if (i < stages) {
      const int kt = int(begin) + i;
      load_x_stage<kMTiles>(a_stage(i % kStages), x, token_sh, kt, k);
      load_w4_stage(b_stage(i % kStages), s_stage(i % kStages), w_e, s_e, n0, kt, n, k,
                    group_shift);
    }
    ptx::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMTiles][kNTiles][4] = {};
  const bool warp_live = n0 + warp * kWarpN < n;  // N % 256 != 0: the last block's idle warps
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) fetch(s);
  for (int i = 0; i < stages; ++i) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage i visible to all; every warp is done with the slot refilled next
    fetch(i + kStages - 1);
    if (!warp_live) continue;
    const int64_t kt = begin + i;
    const __nv_bfloat16* a_sh = a_stage(i % kStages);
    const uint32_t* b_sh = b_stage(i % kStages) + warp * kBlockWords;
    const __nv_bfloat16* s_sh = s_stage(i % kStages) + warp * kWarpN;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if (kt * kBlockK + 16 * ks >= k) break;  // K % 64 == 32: the last stage's half
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) w4a16::a_fragment<kMTiles>(a[mt], a_sh, mt, ks, lane);
      // B: this lane's 16 bytes are its fragments of all eight n8 tiles; word wi holds tiles
      // 2wi (channel 16wi + g) and 2wi + 1 (channel 16wi + 8 + g). The scale multiplies the
      // unpacked (q − 8) in BF16 (exact integers times s, one rounding), where an FP32 scale of
      // the sums would need a separate accumulator per group.
      const __nv_bfloat16* s_row = s_sh + (ks / 2) * kBlockN;  // this k16 step's group row
      const uint4 frag = *reinterpret_cast<const uint4*>(b_sh + ks * kStepWords + 4 * lane);
      const uint32_t word[4] = {frag.x, frag.y, frag.z, frag.w};
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
        __nv_bfloat162 q[4];
        int4::u4_to_bf16_magic(word[wi], q);
        const __nv_bfloat162 s_a = __bfloat162bfloat162(s_row[16 * wi + g]);
        const __nv_bfloat162 s_b = __bfloat162bfloat162(s_row[16 * wi + 8 + g]);
        const uint32_t b[4] = {bits_of(__hmul2(q[0], s_a)), bits_of(__hmul2(q[1], s_a)),
                               bits_of(__hmul2(q[2], s_b)), bits_of(__hmul2(q[3], s_b))};
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ptx::mma_bf16_16816(acc[mt][2 * wi], a[mt], b[0], b[1]);
          ptx::mma_bf16_16816(acc[mt][2 * wi + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  ptx::cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits

  // Stage store (v7's): row r of the tile is slot slot_sh[r]'s row of out; sentinels store
  // nothing. Thread (g, t) holds, for each m16 tile, half and n8 tile, two channels of one row.
  auto for_each_pair = [&](auto&& body) {  // body(slot, column, the pair's two sums)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int s = slot_sh[16 * mt + g + 8 * half];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)  // N is a multiple of 64: a live warp's columns exist
          if (s >= 0)
            body(s, n0 + warp * kWarpN + 8 * j + 2 * t, acc[mt][j][2 * half],
                 acc[mt][j][2 * half + 1]);
      }
  };
  if (splits == 1) {
    if (warp_live)
      for_each_pair([&](int s, int64_t col, float v0, float v1) {
        *reinterpret_cast<__nv_bfloat162*>(out + int64_t(s) * n + col) =  // (T·topk, N)
            __floats2bfloat162_rn(v0, v1);
      });
    return;
  }

  // Reduce (chapter 07's v5): this split's FP32 rows to the workspace, [split][slot][N]; then
  // count in, and the tile's last split adds every split's rows in split order (the same sum in
  // every run) and stores them.
  if (warp_live)
    for_each_pair([&](int s, int64_t col, float v0, float v1) {
      *reinterpret_cast<float2*>(partials + (int64_t(blockIdx.z) * slots + s) * n + col) =
          make_float2(v0, v1);
    });
  __shared__ bool last_sh;
  const unsigned tile = blockIdx.x * gridDim.y + blockIdx.y;
  __threadfence();  // this block's partials visible device-wide before its arrival is
  __syncthreads();
  if (threadIdx.x == 0) last_sh = atomicAdd(&arrivals[tile], 1u) == unsigned(splits - 1);
  __syncthreads();
  if (!last_sh) return;
  __threadfence();  // the other splits' partials, published before their arrivals, read after
  if (threadIdx.x == 0) arrivals[tile] = 0;  // re-armed for the next launch
  if (warp_live)
    for_each_pair([&](int s, int64_t col, float, float) {
      float2 sum = make_float2(0.f, 0.f);
      for (int z = 0; z < splits; ++z) {
        const float2 p =
            __ldcg(reinterpret_cast<const float2*>(partials + (int64_t(z) * slots + s) * n + col));
        sum.x += p.x, sum.y += p.y;
      }
      *reinterpret_cast<__nv_bfloat162*>(out + int64_t(s) * n + col) =
          __floats2bfloat162_rn(sum.x, sum.y);
    });
}

// Splits: chapter 07's rule (gemm_plan.h) on the live tiles of a uniform routing
// (uniform_live_tiles): none once they fill every resident block slot, as at prefill.
template <int kMTiles>
Status launch(const GroupedW4a16Args& a, cudaStream_t stream) {
  constexpr int kBytes = kStages * stage_bytes<kMTiles>();
  const auto [sms, per_sm] = kernel_fit<grouped_v10_kernel<kMTiles>>(kThreads, kBytes);
  const int64_t tiles_m = a.rows / (16 * kMTiles), tiles_n = ceil_div(a.n, kBlockN);
  const int64_t k_tiles = ceil_div(a.k, kBlockK), slots = a.t * a.topk;
  const int splits = w4a16::splits_for(
      uniform_live_tiles(a.t, a.topk, a.num_experts, 16 * kMTiles, tiles_n), k_tiles, sms, per_sm);
  float* partials = nullptr;
  unsigned* arrivals = nullptr;
  SplitCut cut{0, 0};  // {0, 0}: one split
  if (splits > 1) {
    const Status s =
        w4a16::split_workspace(splits * slots * a.n, tiles_m * tiles_n, &partials, &arrivals);
    if (!s.ok()) return s;
    cut = w4a16::split_cut(k_tiles, splits);
  }
  const dim3 grid{unsigned(tiles_m), unsigned(tiles_n), unsigned(splits)};
  return launch_with_smem(grouped_v10_kernel<kMTiles>, grid, kThreads, kBytes, stream,
                          kGroupedW4a16Op, a.x, a.w, a.scales, a.sorted_ids, a.expert_ids, a.out,
                          int(slots), a.n, a.k, a.k / a.group, group_shift_of(a.group, a.k),
                          a.num_experts, divisor_of(a.topk), divisor_of(a.block_m), cut, partials,
                          arrivals);
}

Status grouped_v10_w4a16(const GroupedW4a16Args& a, cudaStream_t stream) {
  Status s = validate_grouped_w4a16(a);
  if (!s.ok()) return s;
  switch (row_tiles_for(a)) {
    case 1: return launch<1>(a, stream);
    case 2: return launch<2>(a, stream);
    default: return launch<4>(a, stream);
  }
}

const Register kRegistered{grouped_w4a16_version(
    "v10_grouped_w4a16", "v7 with chapter 07's INT4 weights: repacked words, scales in shared",
    grouped_v10_w4a16,
    {{"grouped_v10_kernel",
      {},
      {"HMMA", "LDGSTS", "LDSM", "LDS.128", "LOP3"},
      {"I2F", "I2FP", "LDG.E.U16"},
      true,
      "cp.async gather and weights, lop3 unpack, scales from shared memory, nothing spilled"}})};

}  // namespace
}  // namespace lkw::moe
