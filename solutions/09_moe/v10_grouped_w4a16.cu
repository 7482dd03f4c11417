// v10_grouped_w4a16 — v7 with INT4 weights: chapter 07's repacked words and group scales.
//
// Since v7: expert e's weights are chapter 07's INT4 (uint32 [N/64, 8K] repacked, BF16 scales
// [K/G, N], W_hat = s·(q − 8)). The x side, the schedule and the store are v7's; the weights'
// side is chapter 07's v4: a stage copies each 64-channel block's 2 KB run of words and the
// stage's two scale rows (k 0..31, 32..63) into shared memory; a k16 step is one 16-byte shared
// read per lane (its B fragments of 64 channels: a warp takes 64, v7's 32), four lop3 unpacks and
// an HMUL2 by the channel's scale before the mma. At decode (T ≤ 64, a row or two per expert)
// the bound is the routed experts' weights: 0.5 byte per weight + 2/G of scale, a quarter of
// v7's. BM is v7's pick (16 rows at decode); a stage being a quarter of v7's, the ring gets one
// more: more bytes in flight for decode's few blocks.
// Expect: v7's schedule at a quarter of the weight bytes; with few routed experts and small N the
// grid is a few dozen blocks, too few to keep HBM busy (split-K is chapter 07's v5). SASS:
// LDGSTS, LDSM (x), LDS.128 (words), LOP3, HMMA, no I2F, no local memory.
#include "02_int4_dequant/dequant.cuh"
#include "07_w4a16_gemm/w4a16_gemm.cuh"
#include "lkw/ptx.cuh"
#include "experts.cuh"

namespace lkw::moe {
namespace {

using w4a16::bits_of;  // chapter 07's register helpers
using w4a16::group_shift_of;

constexpr int kThreads = 128;  // 4 warps side by side over N
constexpr int kWarpN = 64;     // a warp's channels: one repacked block, eight n8 tiles
constexpr int kNTiles = kWarpN / 8;
constexpr int kBlockN = kThreads / 32 * kWarpN;
constexpr int kBlockK = 64;  // k per stage: four k16 steps
constexpr int kKSteps = kBlockK / 16;
constexpr int kRowElems = kBlockK + 8;  // 144-byte rows: ldmatrix's 8 rows hit 8 bank groups
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
                       int num_experts, Divisor topk, Divisor block_m) {
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
  const int k_tiles = int((k + kBlockK - 1) / kBlockK);
  auto a_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(smem + s * stage_bytes<kMTiles>());
  };
  auto b_stage = [&](int s) { return reinterpret_cast<uint32_t*>(a_stage(s) + kBM * kRowElems); };
  auto s_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(b_stage(s) + kBlockN / kWarpN * kBlockWords);
  };
  auto fetch = [&](int kt) {
    if (kt < k_tiles) {
      load_x_stage<kMTiles>(a_stage(kt % kStages), x, token_sh, kt, k);
      load_w4_stage(b_stage(kt % kStages), s_stage(kt % kStages), w_e, s_e, n0, kt, n, k,
                    group_shift);
    }
    ptx::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMTiles][kNTiles][4] = {};
  const bool warp_live = n0 + warp * kWarpN < n;  // N % 256 != 0: the last block's idle warps
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) fetch(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt visible to all; every warp is done with the slot refilled next
    fetch(kt + kStages - 1);
    if (!warp_live) continue;
    const __nv_bfloat16* a_sh = a_stage(kt % kStages);
    const uint32_t* b_sh = b_stage(kt % kStages) + warp * kBlockWords;
    const __nv_bfloat16* s_sh = s_stage(kt % kStages) + warp * kWarpN;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if (int64_t(kt) * kBlockK + 16 * ks >= k) break;  // K % 64 == 32: the last stage's half
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {  // matrices: rows 0-7 | 8-15 × k 0-7 | 8-15
        const int row = 16 * mt + lane % 8 + 8 * ((lane / 8) % 2), col = 16 * ks + 8 * (lane / 16);
        ptx::ldmatrix_x4(a[mt], a_sh + row * kRowElems + col);
      }
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

  // Stage store (v7's): row r of the tile is slot slot_sh[r]'s row of out; sentinels store nothing.
  if (!warp_live) return;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int s = slot_sh[16 * mt + g + 8 * half];
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int64_t col = n0 + warp * kWarpN + 8 * j + 2 * t;
        if (s >= 0)  // N is a multiple of 64: a live warp's channels all exist
          *reinterpret_cast<__nv_bfloat162*>(out + int64_t(s) * n + col) =  // (T·topk, N)
              __floats2bfloat162_rn(acc[mt][j][2 * half], acc[mt][j][2 * half + 1]);
      }
    }
}

// BM: v7's rule, the largest m16 count whose tile divides BLOCK_M and no more than the rows an
// expert gets on average need (T·topk / E, rounded up to 16).
inline int m_tiles_for(const GroupedW4a16Args& a) {
  const int64_t per_expert = ceil_div(a.t * a.topk, a.num_experts);
  int tiles = per_expert <= 16 ? 1 : per_expert <= 32 ? 2 : 4;
  while (a.block_m % (16 * tiles)) tiles /= 2;
  return tiles;
}

template <int kMTiles>
Status launch(const GroupedW4a16Args& a, cudaStream_t stream) {
  const dim3 grid(unsigned(a.rows / (16 * kMTiles)), unsigned(ceil_div(a.n, kBlockN)));
  return launch_with_smem(grouped_v10_kernel<kMTiles>, grid, kThreads,
                          kStages * stage_bytes<kMTiles>(), stream, kGroupedW4a16Op, a.x, a.w,
                          a.scales, a.sorted_ids, a.expert_ids, a.out, int(a.t * a.topk), a.n, a.k,
                          a.k / a.group, group_shift_of(a.group, a.k), a.num_experts,
                          divisor_of(a.topk), divisor_of(a.block_m));
}

Status grouped_v10_w4a16(const GroupedW4a16Args& a, cudaStream_t stream) {
  Status s = validate_grouped_w4a16(a);
  if (!s.ok()) return s;
  switch (m_tiles_for(a)) {
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
