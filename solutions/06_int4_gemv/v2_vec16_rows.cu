// v2_vec16_rows — 16-byte weight loads, two rows per warp, every load of an iteration in flight
// before the first unpack.
//
// Since v1: a lane loads 16 bytes (4 words, 32 weights of one group) per load instead of 4, so a
// warp-wide load is one contiguous 512-byte run of a row. Per iteration a lane issues
// kRows × kChunks = 4 such loads (and the 4 scales of their groups) before it unpacks anything:
// 64 bytes in flight per lane, about 32 KB per SM at 16 resident warps — what Little's law asks
// of HBM's latency at this bandwidth. Each warp owns two rows, so every 16-byte load of x serves
// both; x (at most 16 × K BF16) is tiny and read by every warp, so it comes through L1 (__ldg),
// hot after the first warps of an SM have touched it. The scale is applied once per word to an
// FP32 partial sum, as in v1. The K tail (K not a multiple of 2048) takes a guarded last
// iteration; rows past N are clamped to row N − 1 for the loads and never written.
// Expect: the memory side right (whole lines, loads in flight), the CUDA cores the limit: about
// 4 instructions per weight at M = 1 (unpack, two bit moves, FMA, and x's share), and 1 FMA per
// weight per row of x on top, so the time grows with M; SASS: LDG.E.128, no I2F.
#include "02_int4_dequant/dequant.cuh"
#include "int4_gemv.cuh"

namespace lkw::gemv {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 2;                             // rows per warp
constexpr int kChunks = 2;                           // 16-byte chunks per row and lane
constexpr int kChunkK = 32;                          // weights per chunk: 4 words
constexpr int kIterK = 32 * kChunks * kChunkK;       // k per warp iteration: 2048

struct Loads {
  uint4 w[kRows][kChunks];
  float s[kRows][kChunks];
};

// The lane's chunk u of the iteration at k0: weights k0 + 1024·u + 32·lane + [0, 32).
template <bool kFull>
__device__ __forceinline__ Loads load_iteration(const uint4* const (&w_rows)[kRows],
                                                const __nv_bfloat16* const (&s_rows)[kRows],
                                                int64_t k0, int64_t k, int lane, int group_shift) {
  Loads l;
  // BEGIN SOLUTION: for every row and chunk: if the chunk starts below K (always, when kFull), load its 16 bytes and its group's scale; else zeros.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t kc = k0 + 32 * (32 * u + lane);
      if (kFull || kc < k) {
        l.w[r][u] = w_rows[r][kc / 32];                               // (N, K/32) × 16 B
        l.s[r][u] = bf16_to_f32(s_rows[r][kc >> group_shift]);        // (N, K/G)
      } else {
        l.w[r][u] = make_uint4(0, 0, 0, 0);
        l.s[r][u] = 0.0f;
      }
    }
  }
  // END SOLUTION
  return l;
}

template <bool kFull>
__device__ __forceinline__ void compute_iteration(const Loads& l, const __nv_bfloat16* x,
                                                  int m_rows, int64_t k0, int64_t k, int lane,
                                                  float (&acc)[kRows][kMaxM]) {
#pragma unroll
  for (int u = 0; u < kChunks; ++u) {
    const int64_t kc = k0 + 32 * (32 * u + lane);
    if (!kFull && kc >= k) break;
    uint32_t words[kRows][4];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      words[r][0] = l.w[r][u].x;
      words[r][1] = l.w[r][u].y;
      words[r][2] = l.w[r][u].z;
      words[r][3] = l.w[r][u].w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // BEGIN SOLUTION: unpack word i of both rows to 8 FP32 each (magic unpack, bit moves); then per row m of x: one 16-byte __ldg of x[m, kc + 8i ..), 8 FMAs per weight row, one FMA by that row's scale.
      float q[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        __nv_bfloat162 pairs[4];
        int4::u4_to_bf16_magic(words[r][i], pairs);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          q[r][2 * j] = bf16_lo_to_f32(bits_of(pairs[j]));
          q[r][2 * j + 1] = bf16_hi_to_f32(bits_of(pairs[j]));
        }
      }
#pragma unroll
      for (int m = 0; m < kMaxM; ++m) {
        if (m >= m_rows) break;
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * k + kc + 8 * i));  // (M, K)
        const uint32_t xp[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float partial = 0.0f;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            partial = fmaf(q[r][2 * j], bf16_lo_to_f32(xp[j]), partial);
            partial = fmaf(q[r][2 * j + 1], bf16_hi_to_f32(xp[j]), partial);
          }
          acc[r][m] = fmaf(l.s[r][u], partial, acc[r][m]);
        }
      }
      // END SOLUTION
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32, 2)
    gemv_v2_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                   const __nv_bfloat16* __restrict__ scales, __nv_bfloat16* __restrict__ y,
                   int m_rows, int64_t n, int64_t k, int group_shift) {
  const int lane = threadIdx.x % 32;
  const int64_t row0 = (blockIdx.x * int64_t(kWarps) + threadIdx.x / 32) * kRows;
  if (row0 >= n) return;  // the whole warp
  const uint4* w_rows[kRows];
  const __nv_bfloat16* s_rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + r < n ? row0 + r : n - 1;  // past N: reads row N − 1, never written
    w_rows[r] = reinterpret_cast<const uint4*>(w + row * (k / 8));  // (N, K/8)
    s_rows[r] = scales + row * (k >> group_shift);                   // (N, K/G)
  }

  float acc[kRows][kMaxM] = {};
  const int64_t full_end = k / kIterK * kIterK;
  for (int64_t k0 = 0; k0 < full_end; k0 += kIterK) {
    const Loads l = load_iteration<true>(w_rows, s_rows, k0, k, lane, group_shift);
    compute_iteration<true>(l, x, m_rows, k0, k, lane, acc);
  }
  if (full_end < k) {
    const Loads l = load_iteration<false>(w_rows, s_rows, full_end, k, lane, group_shift);
    compute_iteration<false>(l, x, m_rows, full_end, k, lane, acc);
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
      if (m >= m_rows) break;
      const float sum = warp_sum(acc[r][m]);
      if (lane == 0 && row0 + r < n) y[m * n + row0 + r] = __float2bfloat16_rn(sum);  // (M, N)
    }
  }
}

Status gemv_v2(const GemvArgs& a, cudaStream_t stream) {
  Status s = validate_gemv(kInt4iGemv, a, 16);
  if (!s.ok()) return s;
  constexpr int64_t kRowsPerBlock = kWarps * kRows;
  const unsigned blocks = unsigned((a.n + kRowsPerBlock - 1) / kRowsPerBlock);
  gemv_v2_kernel<<<blocks, kWarps * 32, 0, stream>>>(a.x, a.w, a.scales, a.y, int(a.m), a.n, a.k,
                                                     log2_of(a.group));
  return last_launch_status(kInt4iGemv.name);
}

const Register kRegistered{gemv_version(
    kInt4iGemv, "v2_vec16_rows", "16-byte weight loads, 2 rows per warp, 4 loads in flight",
    gemv_v2,
    {{"gemv_v2_kernel", {}, {"LDG.E.128", "LOP3"}, {"I2F", "I2FP"}, true,
      "16-byte weight loads, LOP3 unpack, no integer→float convert"}})};

}  // namespace
}  // namespace lkw::gemv
