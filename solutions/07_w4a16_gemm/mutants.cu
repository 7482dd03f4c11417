// Mutants of chapter 07, each a plausible slip the golden cases must catch
// (tests/cpp/golden_main.cu runs each on every case of its op and wants at least one failure):
//   w4a16r_gemm/mutant_fragment_order  a repacked word read as if its two n8-tiles were swapped
//                                      (the repack's order forgotten)
//   w4a16r_gemm/mutant_scale_group     every k-step takes the scale of the next group
//   w4a16r_gemm/mutant_zero_points     a stage's zero points taken from its first k-step's group
//                                      (one zero row staged where v4 stages two): at G = 32 the
//                                      stage's second half subtracts the previous group's z, so
//                                      only the zero-point cases with G = 32 can tell
//   w4a16r_gemm/mutant_split_k_first   v5's split-K finish with its sum started from the first
//                                      split's partial and the loop over the splits also from
//                                      the first: that partial counted twice wherever K is split
//                                      (every arrival order alike: no race needed to see it)
//   w4a16r_gemm/mutant_race_no_wait    the ring's wait one stage short: a stage is read before its
//                                      copies land (racecheck catches it: the copies usually
//                                      land in time, so the outputs alone may not)
// One kernel (v3's ring, block tile and unpack, v5's split-K finish), the slip chosen at compile
// time.
#include "gemm_plan.h"
#include "tiles.cuh"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

enum class Slip { kFragmentOrder, kScaleOfNextGroup, kZeroOfStage, kSplitKFirst, kNoWait };

constexpr int kStages = 4;
constexpr int kStepWords = 128, kBlockWords = kKSteps * kStepWords;
constexpr int kStageBytes = a_stage_elems<1>() * 2 + kWarps * kBlockWords * 4;
constexpr int kTileFloats = 16 * kBlockN;  // a split's partial tile in the workspace

template <Slip kSlip>
__global__ void __launch_bounds__(kThreads)
    mutant_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                  const __nv_bfloat16* __restrict__ scales, const uint8_t* __restrict__ zeros,
                  __nv_bfloat16* __restrict__ y, int64_t m, int64_t n, int64_t k, int group_shift,
                  SplitCut cut, float* __restrict__ partials, unsigned* __restrict__ arrivals) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t nb0 = blockIdx.x * int64_t(kBlockN), n0 = nb0 + warp * kWarpN, m0 = blockIdx.y * 16;
  const int64_t groups = ((k - 1) >> group_shift) + 1;
  const int splits = gridDim.z, split = blockIdx.z;
  int64_t kt_begin, kt_end;
  split_range(cut, split, &kt_begin, &kt_end);
  auto a_stage = [&](int s) { return reinterpret_cast<__nv_bfloat16*>(smem + s * kStageBytes); };
  auto b_stage = [&](int s) { return reinterpret_cast<uint32_t*>(a_stage(s) + a_stage_elems<1>()); };
  auto load_stage = [&](int64_t kt) {
    if (kt < kt_end) {
      load_a_stage<1>(a_stage(kt % kStages), x, m0, kt, m, k);
      for (int c = threadIdx.x; c < kWarps * kBlockWords / 4; c += kThreads) {
        const int block = c / (kBlockWords / 4), piece = c % (kBlockWords / 4);
        const int64_t gn = nb0 + block * kWarpN, step = kt * kKSteps + piece / 32;
        const bool valid = gn < n && step < k / 16;
        const uint32_t* src = w + (gn / kWarpN) * (8 * k) + step * kStepWords + 4 * (piece % 32);
        ptx::cp_async_16(b_stage(kt % kStages) + block * kBlockWords + 4 * piece, valid ? src : w,
                         valid);
      }
    }
    ptx::cp_async_commit();
  };

  float acc[kNTiles][4] = {};
  for (int s = 0; s < kStages - 1; ++s) load_stage(kt_begin + s);
  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    if constexpr (kSlip == Slip::kNoWait) ptx::cp_async_wait<kStages - 1>();
    else ptx::cp_async_wait<kStages - 2>();
    __syncthreads();
    load_stage(kt + kStages - 1);
    if (n0 >= n) continue;
    const uint32_t* b_sh = b_stage(kt % kStages) + warp * kBlockWords;
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int64_t k0 = kt * kBlockK + 16 * ks;
      if (k0 >= k) break;
      uint32_t a[4];
      a_fragment<1>(a, a_stage(kt % kStages), 0, ks, lane);
      const int64_t grp = kSlip == Slip::kScaleOfNextGroup ? ((k0 >> group_shift) + 1) % groups
                                                           : k0 >> group_shift;
      const int64_t z_grp = kSlip == Slip::kZeroOfStage ? (kt * kBlockK) >> group_shift
                                                        : k0 >> group_shift;
      const uint4 frag = *reinterpret_cast<const uint4*>(b_sh + ks * kStepWords + 4 * lane);
      const uint32_t word[4] = {frag.x, frag.y, frag.z, frag.w};
      for (int wi = 0; wi < 4; ++wi) {
        const int ta = kSlip == Slip::kFragmentOrder ? 2 * wi + 1 : 2 * wi;
        const int tb = kSlip == Slip::kFragmentOrder ? 2 * wi : 2 * wi + 1;
        __nv_bfloat162 q[4];
        unpack_minus_zero(word[wi], zero_bias_at(zeros, z_grp, n0 + 8 * ta + g, n),
                          zero_bias_at(zeros, z_grp, n0 + 8 * tb + g, n), q);
        const __nv_bfloat162 s_a = scale_pair(scales, grp, n0 + 8 * ta + g, n);
        const __nv_bfloat162 s_b = scale_pair(scales, grp, n0 + 8 * tb + g, n);
        ptx::mma_bf16_16816(acc[ta], a, bits_of(__hmul2(q[0], s_a)), bits_of(__hmul2(q[1], s_a)));
        ptx::mma_bf16_16816(acc[tb], a, bits_of(__hmul2(q[2], s_b)), bits_of(__hmul2(q[3], s_b)));
      }
    }
  }
  ptx::cp_async_wait<0>();
  if (splits == 1) {
    if (n0 >= n) return;
    for (int j = 0; j < kNTiles; ++j) store_c(y, acc[j], m0 + g, n0 + 8 * j + 2 * t, m, n);
    return;
  }
  // v5's finish: this split's partial to the workspace, the arrival counted, the last one sums.
  const int64_t tile = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  float* const tile_gl = partials + tile * splits * kTileFloats;
  const int rows = int(m - m0 < 16 ? m - m0 : 16);
  if (n0 < n)
    for (int j = 0; j < kNTiles; ++j)
      for (int half = 0; half < 2; ++half)
        if (g + 8 * half < rows)
          *reinterpret_cast<float2*>(tile_gl + split * kTileFloats + (g + 8 * half) * kBlockN +
                                     warp * kWarpN + 8 * j + 2 * t) =
              make_float2(acc[j][2 * half], acc[j][2 * half + 1]);
  __shared__ bool last_sh;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_sh = atomicAdd(&arrivals[tile], 1u) == unsigned(splits - 1);
  __syncthreads();
  if (!last_sh) return;
  __threadfence();
  if (threadIdx.x == 0) arrivals[tile] = 0;
  for (int e = threadIdx.x; e < rows * kBlockN; e += kThreads) {
    const int row = e / kBlockN, col = e % kBlockN;
    if (nb0 + col >= n) continue;
    float sum = __ldcg(tile_gl + row * kBlockN + col);  // the slip: split 0's partial, and again:
    for (int s = 0; s < splits; ++s) sum += __ldcg(tile_gl + s * kTileFloats + row * kBlockN + col);
    y[(m0 + row) * n + nb0 + col] = __float2bfloat16_rn(sum);  // (M, N)
  }
}

template <Slip kSlip>
Status mutant(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16rGemm, a);
  if (!s.ok()) return s;
  dim3 grid = tile_grid(a, 1);
  const int64_t tiles = int64_t(grid.x) * grid.y, k_tiles = (a.k + kBlockK - 1) / kBlockK;
  int splits = 1;
  float* partials = nullptr;
  unsigned* arrivals = nullptr;
  if (kSlip == Slip::kSplitKFirst) {  // v5's plan: as many splits as fill the resident slots
    const auto [sms, per_sm] = kernel_fit<mutant_kernel<kSlip>>(kThreads, kStages * kStageBytes);
    splits = splits_for(tiles, k_tiles, sms, per_sm);
    if (splits > 1) {
      s = split_workspace(tiles * splits * kTileFloats, tiles, &partials, &arrivals);
      if (!s.ok()) return s;
    }
  }
  grid.z = unsigned(splits);
  return launch_tiles(mutant_kernel<kSlip>, grid, kStages * kStageBytes, stream, kW4a16rGemm.name,
                      a.x, a.w, a.scales, a.zeros, a.y, a.m, a.n, a.k,
                      group_shift_of(a.group, a.k), split_cut(k_tiles, splits), partials, arrivals);
}

const Register kFragmentOrder{gemm_version(kW4a16rGemm, "mutant_fragment_order",
                                           "repacked word read with its two n8-tiles swapped",
                                           mutant<Slip::kFragmentOrder>, {}, Kind::kMutant)};
const Register kScaleGroup{gemm_version(kW4a16rGemm, "mutant_scale_group", "scale of the next group",
                                        mutant<Slip::kScaleOfNextGroup>, {}, Kind::kMutant)};
const Register kZeroPoints{gemm_version(kW4a16rGemm, "mutant_zero_points",
                                        "a stage's zero points from its first group only",
                                        mutant<Slip::kZeroOfStage>, {}, Kind::kMutant)};
const Register kSplitKFirst{gemm_version(kW4a16rGemm, "mutant_split_k_first",
                                         "split-K sum counts the first split's partial twice",
                                         mutant<Slip::kSplitKFirst>, {}, Kind::kMutant)};
const Register kNoWait{gemm_version(kW4a16rGemm, "mutant_race_no_wait", "the ring's wait one stage short",
                                    mutant<Slip::kNoWait>, {}, Kind::kMutant)};

}  // namespace
}  // namespace lkw::w4a16
