// v2_cp_async_ldmatrix — tiles through shared memory in a ring of cp.async stages.
//
// Since v1: a block copies each 64-k stage of its x rows and of its 256 weight rows into shared
// memory with cp.async (16-byte pieces, no registers held while in flight), kStages stages ahead,
// and computes from shared memory: x read once per block instead of once per warp, weights in
// whole 16-byte pieces instead of a quad of lanes asking for the same 8 bytes. x reaches the mma
// through ldmatrix (one instruction for a 16 × 16 A fragment). The loop is the classic ring: wait
// for stage kt, one barrier (everyone is done with stage kt − 1), refill that slot with stage
// kt + kStages − 1, compute stage kt.
// The weights keep v1's natural layout, so a lane still reads 8 bytes of one row per n8-tile and
// unpacks a byte of each word: rows are padded to 48 bytes so the 8 rows a warp reads at once fall
// in different banks.
// Expect: a large step at every M (the memory system sees big, coalesced requests); the unpack is
// now the main cost per weight. SASS: LDGSTS, LDSM, HMMA, no I2F.
#include "tiles.cuh"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

constexpr int kStages = 4;
constexpr int kBRowWords = kBlockK / 8 + 4;  // 8 words of a row per stage, padded to 48 bytes

template <int kMTiles>
constexpr int stage_bytes() { return a_stage_elems<kMTiles>() * 2 + kBlockN * kBRowWords * 4; }

// Copy stage kt of the block's 256 weight rows (8 words each: two 16-byte pieces).
__device__ __forceinline__ void load_b_stage(uint32_t* b_sh, const uint32_t* w, int64_t nb0, int64_t kt,
                                             int64_t n, int64_t words) {
#pragma unroll
  for (int c = threadIdx.x; c < kBlockN * 2; c += kThreads) {
    const int row = c / 2, word = 4 * (c % 2);
    const int64_t gn = nb0 + row, gw = kt * (kBlockK / 8) + word;
    const bool valid = gn < n && gw < words;
    ptx::cp_async_16(b_sh + row * kBRowWords + word, valid ? w + gn * words + gw : w, valid);  // (N, K/8)
  }
}

template <int kMTiles>
__global__ void __launch_bounds__(kThreads)
    gemm_v2_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                   const __nv_bfloat16* __restrict__ scales, const uint8_t* __restrict__ zeros,
                   __nv_bfloat16* __restrict__ y, int64_t m, int64_t n, int64_t k,
                   int group_shift) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t nb0 = blockIdx.x * int64_t(kBlockN), n0 = nb0 + warp * kWarpN;
  const int64_t m0 = blockIdx.y * int64_t(16 * kMTiles);
  const int64_t words = k / 8, k_tiles = (k + kBlockK - 1) / kBlockK;
  auto a_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(smem + s * stage_bytes<kMTiles>());
  };
  auto b_stage = [&](int s) { return reinterpret_cast<uint32_t*>(a_stage(s) + a_stage_elems<kMTiles>()); };
  auto load_stage = [&](int64_t kt) {
    if (kt < k_tiles) {
      load_a_stage<kMTiles>(a_stage(kt % kStages), x, m0, kt, m, k);
      load_b_stage(b_stage(kt % kStages), w, nb0, kt, n, words);
    }
    ptx::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMTiles][kNTiles][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_stage(s);

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    // BEGIN SOLUTION: wait until stage kt has landed (kStages − 2 newer groups may still fly), barrier, refill.
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt visible to all; every warp is past stage kt − 1, whose slot is refilled
    load_stage(kt + kStages - 1);
    // END SOLUTION
    if (n0 >= n) continue;  // a warp past N (N % 256 != 0) only helps copy and wait
    const __nv_bfloat16* a_sh = a_stage(kt % kStages);
    const uint32_t* b_sh = b_stage(kt % kStages) + (warp * kWarpN) * kBRowWords;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int64_t k0 = kt * kBlockK + 16 * ks;
      if (k0 >= k) break;  // the last stage of K % 64 == 32
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) a_fragment<kMTiles>(a[mt], a_sh, mt, ks, lane);
      const int64_t group_idx = k0 >> group_shift;
      const uint8_t* z_row = zeros ? zeros + group_idx * n + n0 + g : nullptr;  // (K/G, N)
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const uint2 wd = *reinterpret_cast<const uint2*>(b_sh + (8 * j + g) * kBRowWords + 2 * ks);
        const __nv_bfloat162 s2 = scale_pair(scales, group_idx, n0 + 8 * j + g, n);
        const uint32_t bias = zero_bias_of(z_row, 8 * j);
        const uint32_t b0 = bits_of(__hmul2(nibble_pair_minus_zero(wd.x >> (8 * t), bias), s2));
        const uint32_t b1 = bits_of(__hmul2(nibble_pair_minus_zero(wd.y >> (8 * t), bias), s2));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) ptx::mma_bf16_16816(acc[mt][j], a[mt], b0, b1);
      }
    }
  }
  ptx::cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits

  if (n0 >= n) return;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) store_c(y, acc[mt][j], m0 + 16 * mt + g, n0 + 8 * j + 2 * t, m, n);
}

template <int kMTiles>
struct LaunchV2 {
  static Status run(const GemmArgs& a, cudaStream_t stream) {
    return launch_tiles(gemm_v2_kernel<kMTiles>, tile_grid(a, kMTiles), kStages * stage_bytes<kMTiles>(), stream,
                        kW4a16Gemm.name, a.x, a.w, a.scales, a.zeros, a.y, a.m, a.n, a.k,
                        group_shift_of(a.group, a.k));
  }
};

Status gemm_v2(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16Gemm, a);
  if (!s.ok()) return s;
  return launch_by_m<LaunchV2>(a, stream);
}

const Register kRegistered{gemm_version(
    kW4a16Gemm, "v2_cp_async_ldmatrix", "cp.async ring of 64-k stages in shared memory, ldmatrix for x",
    gemm_v2,
    {{"gemm_v2_kernel", {}, {"HMMA", "LDGSTS", "LDSM"}, {"I2F", "I2FP"}, true,
      "cp.async into shared memory, ldmatrix, tensor cores, no convert"}})};

}  // namespace
}  // namespace lkw::w4a16
