// Chapter 07 — the repacked INT4 weights read as a GEMV at small M (v7; chapter 09's v14 runs the
// same loop over one expert's words): no tensor cores, every 16-byte piece read once.
//
// A block owns 64 output channels (one row of the repacked layout, [N/64, 8K]) and splits K among
// its warps. Per 16-k step, lane t = 4r + c reads its 16 bytes at word 128·ks + 4t: the four words
// chapter 07's layout gives lane t of warps 0..3, which hold channels 16w + 8h + r (w 0..3, h 0..1)
// at k = 16ks + 8p + 2c + j (p, j 0..1), element 4h + 2p + j of word w. Chapter 02's lop3 magic
// turns a word into four (q − z) pairs (the bias 128 + z of w4a16_gemm.cuh; z = 8 without zero
// points), pair 2h + p, which meet x's BF16 pair at k = 16ks + 8p + 2c in FP32 FMAs. A group's sum
// is multiplied by its scale once, when the group ends.
#pragma once
#include "w4a16_gemm.cuh"

namespace lkw::w4a16::gemv {

constexpr int kStepWords = 128;  // a 64-channel row's words per 16-k step
constexpr int kChannels = 8;     // a lane's: 16w + 8h + r, accumulator 2w + h
constexpr int kUnroll = 8;       // 16-byte pieces in flight per lane

// The channel (0..63 of the block) of accumulator ch of a lane with r = lane / 4.
__device__ __forceinline__ int channel(int ch, int r) { return 16 * (ch / 2) + 8 * (ch % 2) + r; }

// One step: x's pairs at k = 16ks + 8p + 2c (rows without a pointer add zeros), the piece's four
// words unpacked with the current group's biases (bias[ch] of accumulator ch), 2 FMAs per
// (channel, pair, row) into part.
template <int kRows>
__device__ __forceinline__ void step(const uint4& piece, const __nv_bfloat16* const (&xr)[kRows],
                                     int64_t k0, const uint32_t (&bias)[kChannels],
                                     float (&part)[kRows][kChannels]) {
  float2 xp[kRows][2];
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int p = 0; p < 2; ++p)
      xp[i][p] = xr[i] ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(xr[i] + k0 + 8 * p))
                       : make_float2(0.0f, 0.0f);  // (M, K)
  const uint32_t word[4] = {piece.x, piece.y, piece.z, piece.w};
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    // BEGIN SOLUTION: unpack word wi into four (q − z) pairs (unpack_minus_zero with the biases of
    //   accumulators 2wi and 2wi + 1); pair 2h + p is channel 16·wi + 8h + r at x's pair p: add
    //   both products for every row into part[i][2wi + h]
    __nv_bfloat162 q[4];
    unpack_minus_zero(word[wi], bias[2 * wi], bias[2 * wi + 1], q);
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

// Steps begin..end of one 64-channel row of words (`words` at this lane's first word) into acc:
// kUnroll pieces loaded (streamed past L1: read once) before any is used; each group's FP32 sum
// times its scale (`scales` at the row's first channel of [K/G, N]) when the group ends. The zero
// points (`zeros`, at the same channel of [K/G, N], or null: z = 8) are read when a group starts.
template <int kRows>
__device__ __forceinline__ void accumulate(const uint32_t* words, const __nv_bfloat16* scales, int64_t n,
                                           const __nv_bfloat16* const (&xr)[kRows], int c, int r,
                                           int begin, int end, int group_shift,
                                           float (&acc)[kRows][kChannels],
                                           const uint8_t* zeros = nullptr) {
  float part[kRows][kChannels] = {};
  int current = int((int64_t(16) * begin) >> group_shift);
  uint32_t bias[kChannels];  // the unpack's 128 + z of each accumulator's channel, this group
  auto start_group = [&]() {
#pragma unroll
    for (int ch = 0; ch < kChannels; ++ch)
      bias[ch] = zero_bias_at(zeros, current, channel(ch, r), n);
  };
  if (begin < end) start_group();
  auto flush = [&]() {
#pragma unroll
    for (int ch = 0; ch < kChannels; ++ch) {
      const float s = __bfloat162float(scales[int64_t(current) * n + channel(ch, r)]);  // (K/G, N)
#pragma unroll
      for (int i = 0; i < kRows; ++i) acc[i][ch] += part[i][ch] * s, part[i][ch] = 0.0f;
    }
  };
  for (int ks0 = begin; ks0 < end; ks0 += kUnroll) {
    uint4 piece[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      piece[u] = ks0 + u < end ? __ldcs(reinterpret_cast<const uint4*>(words + int64_t(ks0 + u) * kStepWords))
                               : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int ks = ks0 + u;
      if (ks >= end) continue;
      const int g = int((int64_t(16) * ks) >> group_shift);
      if (g != current) flush(), current = g, start_group();
      step<kRows>(piece[u], xr, 16 * int64_t(ks) + 2 * c, bias, part);
    }
  }
  if (begin < end) flush();
}

// The four lanes of each channel (c = 0..3) by shuffles; lane c = 0 writes row i's channel to
// red[i][channel] (this warp's slice of the block's shared reduction).
template <int kRows>
__device__ __forceinline__ void reduce_lanes(const float (&acc)[kRows][kChannels], int r, int c,
                                             float (*red)[64]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int ch = 0; ch < kChannels; ++ch) {
      float v = acc[i][ch];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (c == 0) red[i][channel(ch, r)] = v;
    }
}

// Store: the warps' sums of row i (red[warp][i][channel]) added in warp order (the same sum every
// run), rounded once, to the 64 channels at out_row(i) (a pointer, channel 0 of the block); a
// thread a (row, channel), rows from `live` on skipped. The caller syncs before and after.
template <int kRows, int kWarps, class OutRow>
__device__ __forceinline__ void store_rows(const float (&red)[kWarps][kRows][64], int live,
                                           OutRow out_row) {
  if (threadIdx.x >= kRows * 64) return;
  const int i = threadIdx.x / 64, ch = threadIdx.x % 64;
  if (i >= live) return;
  float sum = 0.0f;
#pragma unroll
  for (int wv = 0; wv < kWarps; ++wv) sum += red[wv][i][ch];
  out_row(i)[ch] = __float2bfloat16_rn(sum);
}

}  // namespace lkw::w4a16::gemv
