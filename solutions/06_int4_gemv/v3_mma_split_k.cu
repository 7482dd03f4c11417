// v3_mma_split_k — the multiply-adds on the tensor cores, weights streamed with cp.async, split-K.
//
// Since v2: v2 spends about 4 CUDA-core instructions per weight at M = 1 and one FMA more per weight
// and row of x. Here the unpacked weights are the 16-row A operand of mma.sync m16n8k16 and x^T the
// 8-column B ("swap AB"): one instruction does 2048 multiply-adds and what is left per weight is
// the unpack, whatever M is. A lane's k-slots are its own weights (the mma only needs A and B to
// agree). The weights stream through a 4-stage cp.async ring per warp (no registers held in
// flight); a block is 4 warps taking turns along K on one tile of 16 rows. G = 128 scales the FP32
// sums once per group; G < 128 and zero points scale in A, chapter 02's W_hat. Split-K (grid
// (N/16, S), S chosen so the last wave is full) finishes through a workspace: the last of a tile's
// S blocks adds the partials in split order (mma_tile.cuh).
// Expect: about a third of v2's instructions per weight, nearly flat in M; not yet at the bound
// (occupancy capped by registers and the ring). SASS: LDGSTS.E.BYPASS.LTC256B.128, LDG.E.128 for x,
// HMMA, LOP3, no I2F, no local memory.
#include <algorithm>

#include "02_int4_dequant/dequant.cuh"
#include "int4_gemv.cuh"
#include "gemv_plan.h"
#include "lkw/ptx.cuh"
#include "mma_tile.cuh"

namespace lkw::gemv {
namespace {

using ptx::cp_async_16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_bf16_16816;

constexpr int kWarps = 4;                         // warps per block: one row tile, K interleaved
constexpr int kStages = 4;                        // iterations of weights in the ring per warp

struct Params {
  const __nv_bfloat16* x;       // [M, K]
  const uint32_t* w;            // [N, K/8]
  const __nv_bfloat16* scales;  // [N, K/G]
  const uint32_t* zeros;        // [N, K/G/8] or null
  __nv_bfloat16* y;             // [M, N]
  float* partials;              // [N/16 tiles, S, M, 16] when S > 1
  unsigned* arrivals;           // [N/16 tiles]: splits of the tile done so far
  int m, k, k_split, splits, group_shift;
  int64_t n;
};

// What a lane reads, as pointers to the start of its split (offsets within a split are 32-bit):
// for its rows g and g + 8 the 16-byte weight chunk at k_begin + 32t, the scales and zero-point
// words of the rows, and per n-tile the row of x its B column carries at k_begin + 32t.
template <int kNTiles>
struct Lane {
  const uint4* w[2];
  const __nv_bfloat16* s[2];
  const uint32_t* z[2];
  const __nv_bfloat16* x[kNTiles];
  int group0;       // group index of k_begin
  int group_of[2];  // group offset of chunk u within an iteration: (128u + 32t) >> group_shift
  int t, lane;
};

// What one iteration gives a lane: [row g, g + 8][chunk u]; x as [n-tile][chunk u][word i].
template <int kNTiles>
struct Loads {
  uint4 w[2][2];
  __nv_bfloat16 s[2][2];
  uint32_t z[2][2];  // the zero points themselves (4 bits), with kZp
  uint4 x[kNTiles][2][4];
};

// The weights of iteration kk (k offset within the split) into the ring: chunk u of row r at
// kk + 128u + 32t, zero-filled from k_len on (the end of K: only the last split has a tail).
template <int kNTiles>
__device__ __forceinline__ void copy_weights(uint4 (&slot_sh)[4][32], const Lane<kNTiles>& ln,
                                             int kk, int k_len) {
  // BEGIN SOLUTION: for r, u = 0, 1: cp_async_16 into slot_sh[2r + u][lane] from ln.w[r] + (kk + 128u) / 32, valid while kk + 128u + 32t < k_len (an invalid chunk still names a valid address: the lane's first chunk).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const bool valid = kk + 128 * u + 32 * ln.t < k_len;
      cp_async_16(&slot_sh[2 * r + u][ln.lane], ln.w[r] + (valid ? (kk + 128 * u) / 32 : 0), valid);
    }
  }
  // END SOLUTION
}

// One iteration's operands for a lane, in two steps. First, before waiting for the ring, what
// comes from global memory through L1: the scales (and zero points) of its groups and its x
// fragments — issued early, their latency hides behind the wait. Then its weights from the ring.
// kTail: chunks from k_len on get zero scales and zero x (their weights are zero-filled), so
// they add nothing. Elsewhere B needs no guard: a lane whose row of x is past M reads row 0, and
// the C columns it feeds are never stored.
template <int kNTiles, bool kZp, bool kTail>
__device__ __forceinline__ void load_globals(Loads<kNTiles>& l, const Lane<kNTiles>& ln, int kk,
                                             int k_len, int group_shift) {
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int group = (kk >> group_shift) + ln.group_of[u];  // within the split
    const bool in_k = !kTail || kk + 128 * u + 32 * ln.t < k_len;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (in_k) {
        l.s[r][u] = ln.s[r][group];  // (N, K/G)
        if constexpr (kZp) {
          const int abs_group = ln.group0 + group;
          l.z[r][u] = (ln.z[r][abs_group / 8] >> (4 * (abs_group % 8))) & 0xfu;  // (N, K/G/8)
        }
      } else {
        l.s[r][u] = __float2bfloat16_rn(0.0f);
        if constexpr (kZp) l.z[r][u] = 0;
      }
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        l.x[j][u][i] = in_k ? __ldg(reinterpret_cast<const uint4*>(ln.x[j] + kk + 128 * u + 8 * i))
                            : make_uint4(0, 0, 0, 0);  // (M, K)
  }
}

template <int kNTiles>
__device__ __forceinline__ void load_weights(Loads<kNTiles>& l, const uint4 (&slot_sh)[4][32],
                                             int lane) {
#pragma unroll
  for (int u = 0; u < 2; ++u)
#pragma unroll
    for (int r = 0; r < 2; ++r) l.w[r][u] = slot_sh[2 * r + u][lane];
}

template <int kNTiles, bool kScaleInA, bool kZp>
__device__ __forceinline__ void mma_iteration(const Loads<kNTiles>& l, float (&acc)[kNTiles][4]) {
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    __nv_bfloat162 s2[2], neg_zs2[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      s2[r] = __bfloat162bfloat162(l.s[r][u]);
      if constexpr (kZp) neg_zs2[r] = neg_zero_times_scale(l.z[r][u], l.s[r][u]);
    }
    float sums[kNTiles][4] = {};  // this chunk's Σ x·(q − 8), when the scale comes after
    float(&c)[kNTiles][4] = kScaleInA ? acc : sums;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // BEGIN SOLUTION: unpack word i of both rows into a_lo[4], a_hi[4] (unpack_a); for every n-tile j two mma steps with A = {a_lo[2h], a_hi[2h], a_lo[2h+1], a_hi[2h+1]} and B = pairs 2h, 2h+1 of x fragment l.x[j][u][i] (h = 0, 1).
      const uint4& w_lo = l.w[0][u];
      const uint4& w_hi = l.w[1][u];
      uint32_t a_lo[4], a_hi[4];
      unpack_a<kScaleInA, kZp>(i == 0 ? w_lo.x : i == 1 ? w_lo.y : i == 2 ? w_lo.z : w_lo.w, s2[0],
                               neg_zs2[0], a_lo);
      unpack_a<kScaleInA, kZp>(i == 0 ? w_hi.x : i == 1 ? w_hi.y : i == 2 ? w_hi.z : w_hi.w, s2[1],
                               neg_zs2[1], a_hi);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const uint4& xv = l.x[j][u][i];
        const uint32_t a0[4] = {a_lo[0], a_hi[0], a_lo[1], a_hi[1]};
        const uint32_t a1[4] = {a_lo[2], a_hi[2], a_lo[3], a_hi[3]};
        mma_bf16_16816(c[j], a0, xv.x, xv.y);
        mma_bf16_16816(c[j], a1, xv.z, xv.w);
      }
      // END SOLUTION
    }
    if constexpr (!kScaleInA) {
      // BEGIN SOLUTION: once per group and row: acc += s·sums (c0, c1 are row g: scale of row 0; c2, c3 row g + 8: row 1).
      const float s_lo = bf16_to_f32(l.s[0][u]), s_hi = bf16_to_f32(l.s[1][u]);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        acc[j][0] = fmaf(s_lo, sums[j][0], acc[j][0]);
        acc[j][1] = fmaf(s_lo, sums[j][1], acc[j][1]);
        acc[j][2] = fmaf(s_hi, sums[j][2], acc[j][2]);
        acc[j][3] = fmaf(s_hi, sums[j][3], acc[j][3]);
      }
      // END SOLUTION
    }
  }
}

// Register budgets: ≤ 102 per thread with one n-tile (5 blocks, 20 warps per SM), ≤ 170 with two
// (their accumulators and x fragments double; asked for less, ptxas spills).
template <int kNTiles, bool kScaleInA, bool kZp>
__global__ void __launch_bounds__(kWarps * 32, kNTiles == 1 ? 5 : 3)
    gemv_v3_kernel(const Params p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t tile = blockIdx.x;  // rows 16·tile .. 16·tile + 15
  const int k_begin = int(blockIdx.y) * p.k_split;
  const int k_len = min(p.k - k_begin, p.k_split);  // k of this split
  const int groups = p.k >> p.group_shift;

  Lane<kNTiles> ln;
  ln.t = t;
  ln.lane = lane;
  ln.group0 = k_begin >> p.group_shift;
#pragma unroll
  for (int u = 0; u < 2; ++u) ln.group_of[u] = (128 * u + 32 * t) >> p.group_shift;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int64_t row = tile * kTileRows + g + 8 * r;
    row = row < p.n ? row : p.n - 1;  // past N: reads row N − 1, never written
    ln.w[r] = reinterpret_cast<const uint4*>(p.w + row * (p.k / 8)) + (k_begin + 32 * t) / 32;
    ln.s[r] = p.scales + row * groups + ln.group0;           // (N, K/G)
    ln.z[r] = kZp ? p.zeros + row * (groups / 8) : nullptr;  // (N, K/G/8)
  }
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {  // B column g of n-tile j: row 8j + g of x (row 0 past M)
    const int m = 8 * j + g < p.m ? 8 * j + g : 0;
    ln.x[j] = p.x + int64_t(m) * p.k + k_begin + 32 * t;  // (M, K)
  }

  // The four warps share the tile's rows and take turns along K: warp w computes iterations
  // w, w + 4, w + 8, ..., so at any time the block reads 4 neighbouring 128-byte lines of each
  // row, 512 contiguous bytes (DRAM pages open once, not once per line). Each warp streams its
  // iterations through its own ring of kStages: kStages − 1 in flight while one is computed.
  __shared__ uint4 ring_sh[kWarps][kStages][4][32];  // (warp, stage, row·chunk, lane) × 16 B
  uint4(&ring)[kStages][4][32] = ring_sh[warp];
  const int iters = (k_len + kIterK - 1) / kIterK;
  const int whole = k_len / kIterK;  // iterations without a tail
  const int mine = iters > warp ? (iters - warp + kWarps - 1) / kWarps : 0;  // this warp's share
  float acc[kNTiles][4] = {};
  // BEGIN SOLUTION: prologue: copy the warp's first kStages − 1 iterations (w + 4i); per whole iteration copy one ahead, commit, load_globals, wait, load_weights, mma_iteration; then the K tail.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < mine) copy_weights(ring[s], ln, (warp + kWarps * s) * kIterK, k_len);
    cp_async_commit();
  }
  int i = 0;
  for (; i < mine && warp + kWarps * i < whole; ++i) {
    const int ahead = i + kStages - 1;
    if (ahead < mine) copy_weights(ring[ahead % kStages], ln, (warp + kWarps * ahead) * kIterK, k_len);
    cp_async_commit();
    const int kk = (warp + kWarps * i) * kIterK;
    Loads<kNTiles> l;
    load_globals<kNTiles, kZp, false>(l, ln, kk, k_len, p.group_shift);
    cp_async_wait<kStages - 1>();  // this iteration's weights have landed
    load_weights(l, ring[i % kStages], lane);
    mma_iteration<kNTiles, kScaleInA, kZp>(l, acc);
  }
  if (i < mine) {  // the K tail: K not a multiple of 256, the last iteration of the last split
    const int kk = (warp + kWarps * i) * kIterK;
    Loads<kNTiles> l;
    load_globals<kNTiles, kZp, true>(l, ln, kk, k_len, p.group_shift);
    cp_async_wait<0>();
    load_weights(l, ring[i % kStages], lane);
    mma_iteration<kNTiles, kScaleInA, kZp>(l, acc);
  }
  // END SOLUTION

  // The four warps' sums of the tile, added in warp order by warp 0.
  __shared__ float sums_sh[kWarps][kNTiles * 4][32];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) sums_sh[warp][4 * j + e][lane] = acc[j][e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += sums_sh[w][4 * j + e][lane];
      acc[j][e] = sum;
    }
  store_tile<kNTiles>(p, acc, tile, int(blockIdx.y), g, t, lane);
}

template <int kNTiles, bool kScaleInA, bool kZp>
Status launch_v3(const GemvOp& op, const GemvArgs& a, cudaStream_t stream) {
  auto* kernel = gemv_v3_kernel<kNTiles, kScaleInA, kZp>;
  static const int blocks_per_sm = [kernel] {
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, 0);
    return blocks > 0 ? blocks : 1;
  }();
  const SplitK plan = plan_split_k(a.n, a.k, int64_t(sm_count()) * blocks_per_sm, kWarps);  // gemv_plan.h
  const int64_t tiles = ceil_div(a.n, kTileRows);
  Params p{a.x,      a.w,  a.scales,           a.zeros,     a.y,
           nullptr,  nullptr, int(a.m),        int(a.k),    int(plan.k_split),
           plan.splits, log2_of(a.group), a.n};
  if (plan.splits > 1) {
    Status s = workspace(tiles * tile_partials(plan.splits, int(a.m)), tiles, &p.partials, &p.arrivals);
    if (!s.ok()) return s;
  }
  kernel<<<dim3(unsigned(tiles), unsigned(plan.splits)), kWarps * 32, 0, stream>>>(p);
  return last_launch_status(op.name);
}

template <const GemvOp& kOp>
Status gemv_v3(const GemvArgs& a, cudaStream_t stream) {
  Status s = validate_gemv(kOp, a, 16);
  if (!s.ok()) return s;
  constexpr bool kZp = kOp.zero_points;
  const bool two_tiles = a.m > 8;
  if constexpr (kZp) {
    return two_tiles ? launch_v3<2, true, true>(kOp, a, stream)
                     : launch_v3<1, true, true>(kOp, a, stream);
  } else {
    if (a.group == 128)  // one group per mma step: scale the FP32 sums
      return two_tiles ? launch_v3<2, false, false>(kOp, a, stream)
                       : launch_v3<1, false, false>(kOp, a, stream);
    return two_tiles ? launch_v3<2, true, false>(kOp, a, stream)
                     : launch_v3<1, true, false>(kOp, a, stream);
  }
}

std::vector<SassFact> facts() {
  return {{"gemv_v3_kernel", {}, {"LDGSTS.E.BYPASS.LTC256B.128", "LDG.E.128", "HMMA", "LOP3"},
           {"I2F", "I2FP"}, true,
           "16-byte async weight copies (LDGSTS), 16-byte x loads, mma.sync (HMMA), LOP3 unpack, "
           "no integer→float convert"}};
}

constexpr const char* kSummary = "tensor cores (mma m16n8k16, weights as A), cp.async ring, split-K";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v3_mma_split_k", kSummary, gemv_v3<kInt4iGemv>, facts())};
const Register kRegisteredZp{
    gemv_version(kInt4iZpGemv, "v3_mma_split_k", kSummary, gemv_v3<kInt4iZpGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
