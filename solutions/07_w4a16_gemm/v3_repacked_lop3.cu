// v3_repacked_lop3 — the weights repacked offline so that one shared read is a lane's B fragment.
//
// Since v2: v2's lane reads 8 bytes per n8-tile and unpacks one byte of each word: 8 shared loads
// and 16 single-pair unpacks per k-step for 64 channels, and most of each word it reads belongs to
// other lanes. Here the weights are stored once, offline (lkw.w4a16.repack), in the order the mma
// consumes them: for each 64 channels and 16 k, lane l's 16 bytes are exactly its B fragments of
// the eight n8-tiles, each word two tiles' pairs in the interleaved nibble order of chapter 02.
// So a k-step is one conflict-free 16-byte shared read per lane and four magic unpacks (LOP3 +
// HSUB2 per pair, every nibble used; the two channels' 128 + z biases subtracted, w4a16_gemm.cuh's
// unpack_minus_zero), and a stage of a 64-channel block is 2 KB contiguous in HBM.
// Expect: the unpack cost per weight drops several-fold and the copies are whole 2 KB runs; v3
// reaches the memory bound at small M where the grid fills the GPU. SASS: LDGSTS, LDSM, LDS.128,
// LOP3, HMMA, no I2F.
#include "tiles.cuh"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

constexpr int kStages = 4;
constexpr int kStepWords = 32 * 4;  // a 64-channel block's words per k-step: 32 lanes × 16 bytes
constexpr int kBlockWords = kKSteps * kStepWords;  // per 64-k stage: 2 KB, contiguous in HBM

template <int kMTiles>
constexpr int stage_bytes() { return a_stage_elems<kMTiles>() * 2 + kWarps * kBlockWords * 4; }

// Copy stage kt of the block's four 64-channel blocks: each a 2 KB run of the repacked tensor
// [N/64][K/16][32 lanes][4 words]; k-steps past K read nothing.
__device__ __forceinline__ void load_b_stage(uint32_t* b_sh, const uint32_t* w, int64_t nb0, int64_t kt,
                                             int64_t n, int64_t k) {
  // BEGIN SOLUTION: piece c: block c / 128 of the four, 16-byte piece c % 128 of its 2 KB run.
#pragma unroll
  for (int c = threadIdx.x; c < kWarps * kBlockWords / 4; c += kThreads) {
    const int block = c / (kBlockWords / 4), piece = c % (kBlockWords / 4);
    const int64_t gn = nb0 + block * kWarpN, step = kt * kKSteps + piece / 32;
    const bool valid = gn < n && step < k / 16;
    const uint32_t* src = w + (gn / kWarpN) * (8 * k) + step * kStepWords + 4 * (piece % 32);  // (N/64, 8K)
    ptx::cp_async_16(b_sh + block * kBlockWords + 4 * piece, valid ? src : w, valid);
  }
  // STUB: (void)b_sh; (void)w; (void)nb0; (void)kt; (void)n; (void)k;
  // END SOLUTION
}

template <int kMTiles>
__global__ void __launch_bounds__(kThreads)
    gemm_v3_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                   const __nv_bfloat16* __restrict__ scales, const uint8_t* __restrict__ zeros,
                   __nv_bfloat16* __restrict__ y, int64_t m, int64_t n, int64_t k,
                   int group_shift) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t nb0 = blockIdx.x * int64_t(kBlockN), n0 = nb0 + warp * kWarpN;
  const int64_t m0 = blockIdx.y * int64_t(16 * kMTiles);
  const int64_t k_tiles = (k + kBlockK - 1) / kBlockK;
  auto a_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(smem + s * stage_bytes<kMTiles>());
  };
  auto b_stage = [&](int s) { return reinterpret_cast<uint32_t*>(a_stage(s) + a_stage_elems<kMTiles>()); };
  auto load_stage = [&](int64_t kt) {
    if (kt < k_tiles) {
      load_a_stage<kMTiles>(a_stage(kt % kStages), x, m0, kt, m, k);
      load_b_stage(b_stage(kt % kStages), w, nb0, kt, n, k);
    }
    ptx::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMTiles][kNTiles][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_stage(s);

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<kStages - 2>();  // v2's ring, unchanged
    __syncthreads();
    load_stage(kt + kStages - 1);
    if (n0 >= n) continue;  // a warp past N (N % 256 != 0) only helps copy and wait
    const __nv_bfloat16* a_sh = a_stage(kt % kStages);
    const uint32_t* b_sh = b_stage(kt % kStages) + warp * kBlockWords;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int64_t k0 = kt * kBlockK + 16 * ks;
      if (k0 >= k) break;  // the last stage of K % 64 == 32
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) a_fragment<kMTiles>(a[mt], a_sh, mt, ks, lane);
      const int64_t group_idx = k0 >> group_shift;
      // Load B: this lane's 16 bytes, the B fragments of all eight n8-tiles.
      const uint4 frag = *reinterpret_cast<const uint4*>(b_sh + ks * kStepWords + 4 * lane);
      const uint32_t word[4] = {frag.x, frag.y, frag.z, frag.w};
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
        // BEGIN SOLUTION: unpack word wi into (q − z) pairs (channels n0 + 16wi + g and + 8: tiles
        //   2wi and 2wi + 1), each scaled by its channel's scale.
        const int64_t n_a = n0 + 16 * wi + g;
        __nv_bfloat162 q[4];
        unpack_minus_zero(word[wi], zero_bias_at(zeros, group_idx, n_a, n),
                          zero_bias_at(zeros, group_idx, n_a + 8, n), q);
        const __nv_bfloat162 s_a = scale_pair(scales, group_idx, n_a, n);
        const __nv_bfloat162 s_b = scale_pair(scales, group_idx, n_a + 8, n);
        const uint32_t b[4] = {bits_of(__hmul2(q[0], s_a)), bits_of(__hmul2(q[1], s_a)),
                               bits_of(__hmul2(q[2], s_b)), bits_of(__hmul2(q[3], s_b))};
        // STUB: const uint32_t b[4] = {};
        // END SOLUTION
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ptx::mma_bf16_16816(acc[mt][2 * wi], a[mt], b[0], b[1]);
          ptx::mma_bf16_16816(acc[mt][2 * wi + 1], a[mt], b[2], b[3]);
        }
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
struct LaunchV3 {
  static Status run(const GemmArgs& a, cudaStream_t stream) {
    return launch_tiles(gemm_v3_kernel<kMTiles>, tile_grid(a, kMTiles), kStages * stage_bytes<kMTiles>(), stream,
                        kW4a16rGemm.name, a.x, a.w, a.scales, a.zeros, a.y, a.m, a.n, a.k,
                        group_shift_of(a.group, a.k));
  }
};

Status gemm_v3(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16rGemm, a);
  if (!s.ok()) return s;
  return launch_by_m<LaunchV3>(a, stream);
}

const Register kRegistered{gemm_version(
    kW4a16rGemm, "v3_repacked_lop3", "offline repack: one 16-byte shared read per lane and k-step, lop3 unpack",
    gemm_v3,
    {{"gemm_v3_kernel", {}, {"HMMA", "LDGSTS", "LDSM", "LDS.128", "LOP3"}, {"I2F", "I2FP"}, true,
      "16-byte fragment reads, lop3 unpack, tensor cores, no convert"}})};

}  // namespace
}  // namespace lkw::w4a16
