// v4_scales_in_shared — the group scales travel with the stage, through shared memory.
//
// Since v3: each lane fetched its channels' scales from global memory at every k-step (eight 2-byte
// loads for 64 channels, L1 hits after the first, but each a load instruction with a 64-bit
// address, scattered over 64 rows' worth of the [K/G, N] table). Here the scales of a stage's
// groups (a stage of 64 k spans one group, or two at G = 32) ride in the same cp.async group as the
// weights: 256 channels × 2 bytes per group row, 16-byte pieces, one row of the table each. The
// compute reads them from shared memory next to the fragment, so a k-step issues no global load.
// Zero points, where given, ride the same way (256 bytes per group row, tiles.cuh's
// load_zero_stage) and become the unpack's 128 + z biases.
// Expect: a small gain where the loop is instruction-bound (large M, small G); nothing changes in
// the bytes. SASS: as v3, with fewer LDG in the main loop.
#include "tiles.cuh"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

constexpr int kStages = 4;
constexpr int kStepWords = 32 * 4;  // a 64-channel block's words per k-step: 32 lanes × 16 bytes
constexpr int kBlockWords = kKSteps * kStepWords;  // per 64-k stage: 2 KB, contiguous in HBM

constexpr int kScaleRows = 2;  // a stage's groups: k = 0..31 and 32..63 of it (the same group at G ≥ 64)

template <int kMTiles>
constexpr int stage_bytes() {  // x, words, scales, zero points
  return a_stage_elems<kMTiles>() * 2 + kWarps * kBlockWords * 4 + kScaleRows * kBlockN * 2 +
         kZeroRows * kBlockN;
}

// Copy stage kt of the block's four 64-channel blocks: each a 2 KB run of the repacked tensor
// [N/64][K/16][32 lanes][4 words]; k-steps past K read nothing.
__device__ __forceinline__ void load_b_stage(uint32_t* b_sh, const uint32_t* w, int64_t nb0, int64_t kt,
                                             int64_t n, int64_t k) {
#pragma unroll
  for (int c = threadIdx.x; c < kWarps * kBlockWords / 4; c += kThreads) {
    const int block = c / (kBlockWords / 4), piece = c % (kBlockWords / 4);
    const int64_t gn = nb0 + block * kWarpN, step = kt * kKSteps + piece / 32;
    const bool valid = gn < n && step < k / 16;
    const uint32_t* src = w + (gn / kWarpN) * (8 * k) + step * kStepWords + 4 * (piece % 32);  // (N/64, 8K)
    ptx::cp_async_16(b_sh + block * kBlockWords + 4 * piece, valid ? src : w, valid);
  }
}

// Copy the scales of stage kt: row r holds the group of k = 64·kt + 32·r for the block's 256
// channels (a row of [K/G, N]); a half stage past K reads nothing.
__device__ __forceinline__ void load_scale_stage(__nv_bfloat16* s_sh, const __nv_bfloat16* scales, int64_t nb0,
                                                 int64_t kt, int64_t n, int64_t k, int group_shift) {
  // BEGIN SOLUTION: 2 rows × 32 pieces of 16 bytes (8 channels each); threads 0..63 one piece each.
  constexpr int kPieces = kBlockN / 8;
  if (threadIdx.x < kScaleRows * kPieces) {
    const int r = threadIdx.x / kPieces, piece = threadIdx.x % kPieces;
    const int64_t k_at = kt * kBlockK + 32 * r, gn = nb0 + 8 * piece;
    const bool valid = k_at < k && gn < n;
    const __nv_bfloat16* src = scales + (k_at >> group_shift) * n + gn;  // (K/G, N)
    ptx::cp_async_16(s_sh + r * kBlockN + 8 * piece, valid ? src : scales, valid);
  }
  // STUB: (void)s_sh; (void)scales; (void)nb0; (void)kt; (void)n; (void)k; (void)group_shift;
  // END SOLUTION
}

template <int kMTiles>
__global__ void __launch_bounds__(kThreads)
    gemm_v4_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
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
  auto s_stage = [&](int s) { return reinterpret_cast<__nv_bfloat16*>(b_stage(s) + kWarps * kBlockWords); };
  auto z_stage = [&](int s) {
    return reinterpret_cast<uint8_t*>(s_stage(s) + kScaleRows * kBlockN);
  };
  auto load_stage = [&](int64_t kt) {
    if (kt < k_tiles) {
      load_a_stage<kMTiles>(a_stage(kt % kStages), x, m0, kt, m, k);
      load_b_stage(b_stage(kt % kStages), w, nb0, kt, n, k);
      load_scale_stage(s_stage(kt % kStages), scales, nb0, kt, n, k, group_shift);
      if (zeros) load_zero_stage(z_stage(kt % kStages), zeros, nb0, kt, n, k, group_shift);
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
    const __nv_bfloat16* s_sh = s_stage(kt % kStages) + warp * kWarpN;
    const uint8_t* z_sh = z_stage(kt % kStages) + warp * kWarpN;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int64_t k0 = kt * kBlockK + 16 * ks;
      if (k0 >= k) break;  // the last stage of K % 64 == 32
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) a_fragment<kMTiles>(a[mt], a_sh, mt, ks, lane);
      const __nv_bfloat16* s_row = s_sh + (ks / 2) * kBlockN;  // this k-step's group row
      const uint8_t* z_row = zeros ? z_sh + (ks / 2) * kBlockN : nullptr;  // null: z = 8
      // Load B: this lane's 16 bytes, the B fragments of all eight n8-tiles.
      const uint4 frag = *reinterpret_cast<const uint4*>(b_sh + ks * kStepWords + 4 * lane);
      const uint32_t word[4] = {frag.x, frag.y, frag.z, frag.w};
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
        __nv_bfloat162 q[4];
        unpack_minus_zero(word[wi], zero_bias_of(z_row, 16 * wi + g),
                          zero_bias_of(z_row, 16 * wi + 8 + g), q);
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

  if (n0 >= n) return;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) store_c(y, acc[mt][j], m0 + 16 * mt + g, n0 + 8 * j + 2 * t, m, n);
}

template <int kMTiles>
struct LaunchV4 {
  static Status run(const GemmArgs& a, cudaStream_t stream) {
    return launch_tiles(gemm_v4_kernel<kMTiles>, tile_grid(a, kMTiles), kStages * stage_bytes<kMTiles>(), stream,
                        kW4a16rGemm.name, a.x, a.w, a.scales, a.zeros, a.y, a.m, a.n, a.k,
                        group_shift_of(a.group, a.k));
  }
};

Status gemm_v4(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16rGemm, a);
  if (!s.ok()) return s;
  return launch_by_m<LaunchV4>(a, stream);
}

const Register kRegistered{gemm_version(
    kW4a16rGemm, "v4_scales_in_shared", "the stage's group scales copied with it into shared memory",
    gemm_v4,
    {{"gemm_v4_kernel", {}, {"HMMA", "LDGSTS", "LDSM", "LDS.128", "LOP3"}, {"I2F", "I2FP", "LDG.E.U16"}, true,
      "scales from shared memory, 16-byte fragment reads, lop3, tensor cores"}})};

}  // namespace
}  // namespace lkw::w4a16
