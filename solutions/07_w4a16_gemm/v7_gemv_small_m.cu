// v7_gemv_small_m — at M ≤ 16 the tensor cores go, and the repacked words are streamed as a GEMV.
//
// Since v6: at M = 1 v6 reaches under half of the copy ceiling. Its wgmma multiplies a 16-token
// tile that holds one token, and each 64-k stage waits on TMA, an unpack into registers and the
// ring's barriers, with 32 to 112 blocks in flight at decode. At M ≤ 16 the arithmetic is 2·M
// FLOP per weight, which the CUDA cores keep up with at HBM speed (chapter 06 showed it on the
// natural layout): so v7 drops the tensor cores and streams chapter 07's repacked words, 16
// bytes per lane per 16-k step, through chapter 02's lop3 unpack into FP32 FMAs (gemv.cuh: the
// lane map, the K loop, the per-group scale and zero point). A block owns 64 output channels,
// its eight warps a contiguous share of K each; the four lanes of a channel meet by shuffles, the
// warps in shared memory in warp order (the same sum every run). Rows go kRows (1, 2 or 4) per
// pass over the weights, so M ≤ 4 reads them once; more rows take more passes (v6's territory).
// Expect: M = 1 near chapter 06's share of the copy ceiling on the INT4 bytes; from M ≈ 8 on the
// passes cost more than v6. SASS: LDG.E.EF.128, LOP3, FFMA, no HMMA or HGMMA, no local memory.
#include "gemv.cuh"

namespace lkw::w4a16 {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * 32;

template <int kRows>
__global__ void __launch_bounds__(kGemvThreads)
    gemm_v7_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                   const __nv_bfloat16* __restrict__ scales, const uint8_t* __restrict__ zeros,
                   __nv_bfloat16* __restrict__ y, int m, int64_t n, int64_t k, int group_shift) {
  __shared__ float red_sh[kGemvWarps][kRows][64];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, r = lane / 4, c = lane % 4;
  const int nb = blockIdx.x;  // 64-channel block
  // This warp's share of the 16-k steps: contiguous, so each group's scales are read once a warp.
  const int steps = int(k / 16);
  const int begin = steps * warp / kGemvWarps, end = steps * (warp + 1) / kGemvWarps;
  const uint32_t* words = w + int64_t(nb) * 8 * k + 4 * lane;  // (N/64, 8K)
  const __nv_bfloat16* s_nb = scales + 64 * int64_t(nb);       // (K/G, N)
  const uint8_t* z_nb = zeros ? zeros + 64 * int64_t(nb) : nullptr;  // (K/G, N), or none: z = 8

  for (int row0 = 0; row0 < m; row0 += kRows) {
    // Load and compute: this pass's rows against this warp's share of K.
    const __nv_bfloat16* xr[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) xr[i] = row0 + i < m ? x + int64_t(row0 + i) * k : nullptr;  // (M, K)
    float acc[kRows][gemv::kChannels] = {};
    gemv::accumulate<kRows>(words, s_nb, n, xr, c, r, begin, end, group_shift, acc, z_nb);

    // Reduce: lanes by shuffles, warps in shared memory in order.
    gemv::reduce_lanes<kRows>(acc, r, c, red_sh[warp]);
    __syncthreads();
    // Store: row i's 64 channels, a thread each.
    gemv::store_rows<kRows, kGemvWarps>(red_sh, m - row0, [&](int i) {
      return y + int64_t(row0 + i) * n + 64 * nb;  // (M, N)
    });
    __syncthreads();  // red_sh is the next pass's
  }
}

template <int kRows>
Status launch_v7(const GemmArgs& a, cudaStream_t stream) {
  gemm_v7_kernel<kRows><<<unsigned(a.n / 64), kGemvThreads, 0, stream>>>(
      a.x, a.w, a.scales, a.zeros, a.y, int(a.m), a.n, a.k, group_shift_of(a.group, a.k));
  return last_launch_status(kW4a16rGemm.name);
}

// Rows per pass: M itself up to 2, else 4.
Status gemm_v7(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16rGemm, a);
  if (s.ok())
    s = Check()
            .that(a.m < (int64_t(1) << 31) && a.k / 16 < (int64_t(1) << 27) && a.n / 64 < (int64_t(1) << 31),
                  "M, K/16 and N/64 must fit v7's int arithmetic")
            .status();
  if (!s.ok()) return s;
  return a.m == 1 ? launch_v7<1>(a, stream) : a.m == 2 ? launch_v7<2>(a, stream) : launch_v7<4>(a, stream);
}

const Register kRegistered{gemm_version(
    kW4a16rGemm, "v7_gemv_small_m", "M ≤ 16 as a GEMV: streamed 16-byte pieces, lop3, FP32 FMAs",
    gemm_v7,
    {{"gemm_v7_kernel",
      {},
      {"LDG.E.EF.128", "LOP3", "FFMA"},
      {"HMMA", "HGMMA", "I2F"},
      true,
      "repacked words streamed past L1, unpacked by lop3, FMAs on the CUDA cores, nothing spilled"}})};

}  // namespace
}  // namespace lkw::w4a16
