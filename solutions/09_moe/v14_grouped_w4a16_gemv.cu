// v14_grouped_w4a16_gemv — the INT4 experts at decode as chapter 06's GEMV: no tensor cores.
//
// Since v10: at decode an expert holds a row or two of a 16-row mma tile, so v10's tensor cores
// multiply sentinel rows, and each 64-k stage waits on cp.async, an unpack and a barrier: 28 to
// 46% of the copy ceiling. With one to four rows the arithmetic is a few FMAs a weight, which the
// CUDA cores keep up with at HBM speed (chapter 06), so v14 streams the words instead. A block
// takes one align block (one expert) and 64 channels, its eight warps a share of K each. Lane
// t = 4r + c reads one 16-byte piece per 16-k step: the four words of the repacked layout that
// chapter 07 gives lanes t of warps 0..3, i.e. channels 16w + 8h + r (w 0..3, h 0..1) at k = 16ks +
// 8p + 2c + j, unpacked by chapter 02's lop3 magic to (q − 8) pairs that meet x's BF16 pairs in FP32
// FMAs. The scale multiplies a group's sum once, when the group ends; the four lanes of a channel
// (c = 0..3) meet by shuffles, the warps in shared memory, in warp order. The live rows of the
// align block are listed first; kRows of them (1, 2 or 4, from the rows an expert averages) share
// each pass over the weights. Expect: decode near the copy ceiling on the routed experts' words;
// from a few rows an expert on, v10. SASS: LDG.E.128, LOP3, FFMA, no HMMA, no local memory.
#include "02_int4_dequant/dequant.cuh"
#include "experts_w4a16.cuh"

namespace lkw::moe {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 8;             // 16-byte pieces in flight per lane
constexpr int kStepWords = 128;        // a 64-channel block's words per 16-k step
constexpr int kChannels = 8;           // per lane: 16w + 8h + r for w 0..3, h 0..1

template <int kRows>
__global__ void __launch_bounds__(kThreads)
    grouped_v14_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                       const __nv_bfloat16* __restrict__ scales,
                       const int32_t* __restrict__ sorted_ids,
                       const int32_t* __restrict__ expert_ids, __nv_bfloat16* __restrict__ out,
                       int slots, int64_t n, int64_t k, int group, int groups, int num_experts,
                       Divisor topk, Divisor steps_per_group, int block_m) {
  __shared__ int list_sh[kMaxBlockM];  // the align block's live slots, in any order
  __shared__ int count_sh;
  __shared__ float red_sh[kWarps][kRows][64];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, r = lane / 4, c = lane % 4;
  const int expert = expert_ids[blockIdx.x];  // (rows / BLOCK_M)
  if (expert < 0 || expert >= num_experts) return;
  const int nb = blockIdx.y;  // 64-channel block

  // Stage rows: the live slots of the align block (sentinels and bad ids skipped).
  if (threadIdx.x == 0) count_sh = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < block_m; i += kThreads) {
    const int s = sorted_ids[int64_t(blockIdx.x) * block_m + i];  // (rows)
    if (s >= 0 && s < slots) list_sh[atomicAdd(&count_sh, 1)] = s;
  }
  __syncthreads();
  const int count = count_sh;

  const int steps = int(k / 16), group_steps = group / 16;  // group: a multiple of 32
  // This warp's share of the 16-k steps: contiguous, so a group's scales are read once a warp.
  const int begin = steps * warp / kWarps, end = steps * (warp + 1) / kWarps;
  const uint32_t* words = w + (int64_t(expert) * (n / 64) + nb) * (8 * k) + 4 * lane;  // (E, N/64, 8K)
  const __nv_bfloat16* s_e = scales + int64_t(expert) * groups * n + 64 * nb;          // (E, K/G, N)

  for (int chunk = 0; chunk < count; chunk += kRows) {
    const __nv_bfloat16* xr[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      xr[i] = chunk + i < count ? x + int64_t(divide(list_sh[chunk + i], topk)) * k : nullptr;
    float acc[kRows][kChannels] = {}, part[kRows][kChannels] = {};
    int current = divide(begin, steps_per_group);   // the group of step ks
    int boundary = (current + 1) * group_steps;     // its first step past it
    // Reduce a finished group: its FP32 sums times its scales (channel 16w + 8h + r).
    auto flush = [&](int g) {
#pragma unroll
      for (int ch = 0; ch < kChannels; ++ch) {
        const float s = __bfloat162float(s_e[int64_t(g) * n + 16 * (ch / 2) + 8 * (ch % 2) + r]);
#pragma unroll
        for (int i = 0; i < kRows; ++i) acc[i][ch] += part[i][ch] * s, part[i][ch] = 0.0f;
      }
    };
    for (int ks0 = begin; ks0 < end; ks0 += kUnroll) {
      // Load: up to kUnroll steps' 16-byte pieces, streamed past L1 (read once).
      uint4 piece[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        piece[u] = ks0 + u < end
                       ? __ldcs(reinterpret_cast<const uint4*>(words + int64_t(ks0 + u) * kStepWords))
                       : make_uint4(0, 0, 0, 0);
      // Compute: per step, x's pairs at k = 16ks + 8p + 2c, then 32 FMAs a row.
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int ks = ks0 + u;
        if (ks >= end) continue;
        if (ks == boundary) flush(current), ++current, boundary += group_steps;
        float2 xp[kRows][2];
#pragma unroll
        for (int i = 0; i < kRows; ++i)
#pragma unroll
          for (int p = 0; p < 2; ++p)
            xp[i][p] = xr[i] ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
                                   xr[i] + 16 * int64_t(ks) + 8 * p + 2 * c))  // (T, K)
                             : make_float2(0.0f, 0.0f);
        const uint32_t word[4] = {piece[u].x, piece[u].y, piece[u].z, piece[u].w};
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
          // BEGIN SOLUTION: unpack word wi to four (q − 8) pairs (chapter 02's u4_to_bf16_magic):
          //   pair 2h + p is channel 16·wi + 8h + r at k pair p; add q·x for every row
          __nv_bfloat162 q[4];
          int4::u4_to_bf16_magic(word[wi], q);
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int p = 0; p < 2; ++p) {
              const float2 qf = __bfloat1622float2(q[2 * h + p]);
#pragma unroll
              for (int i = 0; i < kRows; ++i)
                part[i][2 * wi + h] = fmaf(qf.y, xp[i][p].y, fmaf(qf.x, xp[i][p].x, part[i][2 * wi + h]));
            }
          // END SOLUTION
        }
      }
    }
    if (begin < end) flush(current);

    // Reduce: the four lanes of a channel by shuffles, then the warps in shared memory in order.
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int ch = 0; ch < kChannels; ++ch) {
        float v = acc[i][ch];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (c == 0) red_sh[warp][i][16 * (ch / 2) + 8 * (ch % 2) + r] = v;
      }
    __syncthreads();
    // Store: row i's 64 channels, one thread each.
    if (threadIdx.x < kRows * 64) {
      const int i = threadIdx.x / 64, ch = threadIdx.x % 64;
      if (chunk + i < count) {
        float sum = 0.0f;
#pragma unroll
        for (int wv = 0; wv < kWarps; ++wv) sum += red_sh[wv][i][ch];
        out[int64_t(list_sh[chunk + i]) * n + 64 * nb + ch] = __float2bfloat16_rn(sum);  // (T·topk, N)
      }
    }
    __syncthreads();  // red_sh is the next chunk's
  }
}

template <int kRows>
Status launch(const GroupedW4a16Args& a, cudaStream_t stream) {
  const dim3 grid(unsigned(a.rows / a.block_m), unsigned(a.n / 64));
  grouped_v14_kernel<kRows><<<grid, kThreads, 0, stream>>>(
      a.x, a.w, a.scales, a.sorted_ids, a.expert_ids, a.out, int(a.t * a.topk), a.n, a.k,
      int(a.group), int(a.k / a.group), a.num_experts, divisor_of(a.topk),
      divisor_of(int(a.group / 16)), a.block_m);
  return last_launch_status(kGroupedW4a16Op);
}

// Rows a pass carries: the rows an expert averages (T·topk / E), 1, 2 or 4.
Status grouped_v14_w4a16(const GroupedW4a16Args& a, cudaStream_t stream) {
  Status s = validate_grouped_w4a16(a);
  if (s.ok())
    s = Check()
            .that(a.n / 64 <= 65535, "N must be at most 65535·64 (the grid's y)")
            .that(a.topk <= (1 << 20) && a.group / 16 <= (1 << 20) && a.k / 16 < (1 << 27),
                  "topk, G/16 within a Divisor's range and K/16 below 2^27 (the steps' int math)")
            .status();
  if (!s.ok()) return s;
  const int64_t per_expert = ceil_div(a.t * a.topk, a.num_experts);
  if (per_expert <= 1) return launch<1>(a, stream);
  if (per_expert <= 2) return launch<2>(a, stream);
  return launch<4>(a, stream);
}

const Register kRegistered{grouped_w4a16_version(
    "v14_grouped_w4a16_gemv", "decode as a GEMV: 16-byte word pieces, lop3 unpack, FP32 FMAs",
    grouped_v14_w4a16,
    {{"grouped_v14_kernel",
      {},
      {"LDG.E.EF.128", "LOP3", "FFMA"},
      {"HMMA", "I2F"},
      true,
      "streamed 16-byte pieces of words, lop3 unpack, FMAs on the CUDA cores, nothing spilled"}})};

}  // namespace
}  // namespace lkw::moe
