// v8_group_scales — fewer instructions a byte: a group's scale multiplies the group's FP32 sum
// once, and a warp of its own keeps the ring full.
//
// Since v6: Nsight Compute shows v6 at small M issuing nearly twice the instructions of Marlin or
// Machete for the same bytes, and warpgroups waiting on slots that thread 0, busy with its own
// stage, asked for late. Two changes. Scaling is linear, Σ s·(q − z)·x = s·Σ (q − z)·x: the
// wgmmas sum a group's unscaled (q − z)·x, and s·sum joins the result where the group (or the
// split) ends: a few FFMAs a group for a multiply a weight, and no weight rounded to BF16. And the
// loads move to a warp that computes nothing, so the ring runs a full turn ahead of the slowest
// warpgroup. Zero points are a template argument. Two accumulators cap the tile at 64 tokens:
// larger M runs 64-token tiles side by side. A knob: a ring slot holds several 64-k stages (four up
// to 32 tokens, two at 64), one wait and one release a slot (ablation_v8_64k_slots: one stage).
// Expect: at M ≤ 64 less time than v6; at M ≥ 128 v6's 128-token tile stays ahead. SASS: HGMMA,
// UTMALDG, LOP3, HADD2, FFMA; no HMUL2 (the scale), no HMMA, no I2F.
#include "gemm_plan.h"
#include "tiles.cuh"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

constexpr int kGroups = kBlockN / 64;       // warpgroups: the repacked 64-channel blocks, one each
constexpr int kConsumers = kGroups * 128;   // the warpgroups that compute
constexpr int kThreads8 = kConsumers + 32;  // and one warp that loads
constexpr int kStepWords = 32 * 4;          // a 64-channel block's words per k-step
constexpr int kBlockWords = kKSteps * kStepWords;  // per 64-k stage: 2 KB, contiguous in HBM
constexpr int kScaleRows = 2;                      // a stage's groups: k = 0..31 and 32..63 of it
constexpr int kRaster = 8;               // token tiles that share a run of N tiles (L2 reuse)
constexpr int kOutRow = kBlockN + 8;     // y tile row in shared memory, padded
constexpr int kRingBudget = 220 * 1024;  // one block an SM: most of its shared memory

// The ring: kSlots slots of kSub 64-k stages each; a stage holds x, words, scales, zero points.
template <int kBT, int kSub>
struct Tile {
  static constexpr int kXBytes = kBT * 128;  // kBT rows of 64 k: 1024-byte swizzle atoms
  static constexpr int kWBytes = kGroups * kBlockWords * 4;
  static constexpr int kSBytes = kScaleRows * kBlockN * 2;
  static constexpr int kTmaBytes = kXBytes + kWBytes + kSBytes;  // + kZeroRows·kBlockN with zeros
  static constexpr int kStageBytes = kTmaBytes + 1024;  // zero points: 512 bytes, padded to 1024
  static constexpr int kSlots = std::min(16, kRingBudget / (kSub * kStageBytes));
  static constexpr int kRingBytes = kSlots * kSub * kStageBytes;
  static_assert(kSlots >= 2, "a slot fills while another is computed");
  static_assert(kStageBytes % 1024 == 0, "every stage's x tile must start 1024-aligned");
  static_assert(kBT * kOutRow * 2 <= kRingBytes, "the y tile reuses the ring");
};

using Maps = WgmmaMaps;  // x, words, scales, zero points: a TMA box each per stage (tiles.cuh)

template <int kBT, bool kZeros, int kSub>
__global__ void __launch_bounds__(kThreads8, 1)
    gemm_v8_kernel(const __grid_constant__ Maps maps, __nv_bfloat16* __restrict__ y, int64_t m,
                   int64_t n, int64_t k, int group_shift, SplitCut cut,
                   float* __restrict__ partials, unsigned* __restrict__ arrivals) {
  using T = Tile<kBT, kSub>;
  constexpr int kSlots = T::kSlots;
  extern __shared__ unsigned char smem_raw[];
  // The swizzle atoms must be 1024-aligned in the shared window (offset computed there, so the
  // pointer stays a shared-memory one for the compiler).
  unsigned char* const smem =
      smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  // One split: the grid runs kRaster token tiles of one N tile back to back (a wave shares its x
  // and W in L2), z the raster group. Several: the token tiles fit one group, z is the split.
  const int splits = cut.base == 0 && cut.extra == 0 ? 1 : int(gridDim.z),
            split = splits == 1 ? 0 : int(blockIdx.z);
  const int64_t tm = (splits == 1 ? int64_t(blockIdx.z) * kRaster : 0) + blockIdx.x;
  if (tm * kBT >= m) return;  // the last raster group's missing tiles
  const int64_t t0 = tm * kBT, nb0 = int64_t(blockIdx.y) * kBlockN;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  const int g = lane / 4, t = lane % 4;
  int64_t begin = 0, end = (k + kSub * kBlockK - 1) / (kSub * kBlockK);  // this split's slots
  if (splits > 1) split_range(cut, split, &begin, &end);
  const int kt_begin = int(begin) * kSub, kt_end = int(end) * kSub;  // stages past K: zeros
  auto x_stage = [&](int s) { return smem + s * T::kStageBytes; };
  auto b_stage = [&](int s) { return reinterpret_cast<uint32_t*>(x_stage(s) + T::kXBytes); };
  auto s_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(x_stage(s) + T::kXBytes + T::kWBytes);
  };
  auto z_stage = [&](int s) { return x_stage(s) + T::kTmaBytes; };
  // Slot s is full when its phase completes on full_sh[s] (one arrival and the slot's bytes),
  // empty when every consumer warp has arrived on empty_sh[s].
  __shared__ uint64_t full_sh[kSlots], empty_sh[kSlots];
  if (threadIdx.x == 0)
    for (int s = 0; s < kSlots; ++s)
      ptx::mbarrier_init(&full_sh[s], 1), ptx::mbarrier_init(&empty_sh[s], kConsumers / 32);
  __syncthreads();
  // Load: lane 0 of the last warp asks the copy engine for a slot's stages as soon as it is empty.
  // It computes nothing, so the loads run a whole ring ahead of the slowest consumer; in v6 thread
  // 0 loaded between its own stages, and the warpgroups that waited on it waited for data.
  int p_kt = kt_begin, p_slot = 0;
  unsigned p_phase = 0;
  auto load_slot = [&] {
    uint64_t* const full = &full_sh[p_slot];
    ptx::mbarrier_wait(&empty_sh[p_slot], p_phase ^ 1);  // passes at once on the first round
    ptx::mbarrier_arrive_expect_tx(full,
                                   kSub * (T::kTmaBytes + (kZeros ? kZeroRows * kBlockN : 0)));
    for (int st = p_slot * kSub; st < (p_slot + 1) * kSub; ++st, ++p_kt) {
      ptx::tma_load_2d(x_stage(st), &maps.x, p_kt * kBlockK, int(t0), full);
      ptx::tma_load_2d(b_stage(st), &maps.w, p_kt * (kBlockWords / 2), int(nb0 / 64), full);
#pragma unroll
      for (int r = 0; r < kScaleRows; ++r) {
        const int row = (p_kt * kBlockK + 32 * r) >> group_shift;  // of [K/G, N]
        ptx::tma_load_2d(s_stage(st) + r * kBlockN, &maps.s, int(nb0), row, full);
        if (kZeros) ptx::tma_load_2d(z_stage(st) + r * kBlockN, &maps.z, int(nb0), row, full);
      }
    }
    if (++p_slot == kSlots) p_slot = 0, p_phase ^= 1;
  };
  if (threadIdx.x == kConsumers)
    while (p_kt < kt_end) load_slot();

  // part: the open group's sum of (q − z)·x, the wgmmas' accumulator; total: Σ s·part so far.
  float part[kBT / 2] = {}, total[kBT / 2] = {};
  ptx::wgmma_fence_operands(part);
  bool fresh = true;  // part holds no open group: the next wgmma starts a sum (scale-d off)
  // A group of G = 2^group_shift k closes where a 32-k row ends on a multiple of G (G = K: never,
  // the split's end closes it), and every split closes its open group at its last row.
  const unsigned group_mask = group_shift >= 31 ? ~0u : (1u << group_shift) - 1;
  auto closes = [&](int kt, int r) {
    const unsigned k_end = unsigned(kt) * kBlockK + 32 * (r + 1);  // K < 2^31: no wrap
    return (k_end & group_mask) == 0 || (r == 1 && kt + 1 == kt_end);
  };
  // This thread's words, and its channels' scales and zero points, in a stage.
  const int w_off = group * kBlockWords + 4 * lane + warp, c_off = group * 64 + 16 * warp + g;
  // Fold: total += s · part for the row's channels (g, g + 8). The scale is read once a group, in
  // FP32: the only rounding left is the FP32 sum's.
  auto fold = [&](const __nv_bfloat16* s_row) {
    // BEGIN SOLUTION: accumulator j holds channel 16w + g for j % 4 < 2, channel 16w + 8 + g above
    //   (s_row[0] and s_row[8]): total[j] += that channel's scale · part[j], in FP32.
    const float s_lo = __bfloat162float(s_row[0]), s_hi = __bfloat162float(s_row[8]);
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j) total[j] = fmaf((j / 2) % 2 ? s_hi : s_lo, part[j], total[j]);
    // STUB: (void)s_row;
    // END SOLUTION
    fresh = true;
  };
  int slot = 0;
  unsigned phase = 0;
  for (int kt0 = kt_begin; kt0 < kt_end && threadIdx.x < kConsumers; kt0 += kSub) {
    // Wait: the slot's boxes landed (async proxy writes, which the tensor core reads through).
    ptx::mbarrier_wait(&full_sh[slot], phase);
#pragma unroll
    for (int u = 0; u < kSub; ++u) {  // every split holds whole slots: no stage to skip
      const int kt = kt0 + u, st = slot * kSub + u;
      // Compute: warp w's A fragment is word w of each lane's 16 bytes (channels 16w + g, + 8);
      // past K (the last stage of K % 64 == 32) x arrives as zeros and adds exact zeros.
      const uint32_t* b_sh = b_stage(st) + w_off;
      const __nv_bfloat16* s_sh = s_stage(st) + c_off;
      const uint8_t* z_sh = z_stage(st) + c_off;
      // The descriptor's high word is constant: k-step ks adds 2·ks to the low word only.
      const uint64_t desc = ptx::wgmma_desc_k_major_sw128(x_stage(st));
      const uint64_t desc_hi = desc & 0xffffffff00000000ull;
      const uint32_t desc_lo = uint32_t(desc);
      uint32_t word[kKSteps];
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) word[ks] = b_sh[ks * kStepWords];
      uint32_t a[kKSteps][4];  // one A fragment per k-step: a wgmma holds its A until the wait
#pragma unroll
      for (int r = 0; r < kScaleRows; ++r) {
        const uint32_t z_lo = kZeros ? zero_bias(z_sh[r * kBlockN]) : kBias8,
                       z_hi = kZeros ? zero_bias(z_sh[r * kBlockN + 8]) : kBias8;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int ks = 2 * r + h;
          __nv_bfloat162 q[4];
          unpack_minus_zero(word[ks], z_lo, z_hi, q);
          // v6's fragment without the multiply: a0, a2 = channel 16w + g, a1, a3 = 16w + 8 + g.
          a[ks][0] = bits_of(q[0]), a[ks][1] = bits_of(q[2]);
          a[ks][2] = bits_of(q[1]), a[ks][3] = bits_of(q[3]);
          ptx::wgmma_fence();
          ptx::wgmma_bf16_rs<kBT>(part, a[ks], desc_hi | (desc_lo + 2 * ks), !fresh);
          fresh = false;
        }
        if (r == 0 && closes(kt, 0)) {  // G = 32: the first row's group closes mid-stage
          ptx::wgmma_commit();
          ptx::wgmma_wait<0>();
          fold(s_sh);
        }
      }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();  // A's registers are the next stage's
      if (closes(kt, 1)) fold(s_sh + kBlockN);
    }
    // Release: the warp's reads of the slot, wgmma's too, are over.
    if (lane == 0) ptx::mbarrier_arrive(&empty_sh[slot]);
    if (++slot == kSlots) slot = 0, phase ^= 1;
  }
  ptx::wgmma_fence_operands(part);
  __syncthreads();  // every stage is consumed: the ring becomes the y tile

  // Store: accumulator j of a thread is channel 16w + g (+ 8 for j % 4 ≥ 2), token 8·(j / 4) + 2t
  // (+ 1 for odd j); through shared memory [token][channel] so y's rows leave 16 bytes at a time.
  __nv_bfloat16* const out_sh = reinterpret_cast<__nv_bfloat16*>(smem);
  const bool consumer = threadIdx.x < kConsumers;  // the producer warp holds no sums
  if (splits == 1 && consumer) {
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j) {
      const int token = 8 * (j / 4) + 2 * t + j % 2,
                channel = group * 64 + 16 * warp + g + 8 * ((j / 2) % 2);
      out_sh[token * kOutRow + channel] = __float2bfloat16_rn(total[j]);
    }
  } else if (splits > 1) {
    // Reduce: this split's tile to the workspace, [tile][split][256 channels][kBT tokens] FP32, the
    // token pairs (2t, 2t + 1) of a channel side by side; pairs past M are neither written nor
    // read.
    const int rows = int(m - t0 < kBT ? m - t0 : kBT);
    const int64_t tile = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    float* const tile_gl = partials + tile * splits * (kBlockN * kBT);
#pragma unroll
    for (int j = 0; j < kBT / 2; j += 2) {
      const int token = 8 * (j / 4) + 2 * t,
                channel = group * 64 + 16 * warp + g + 8 * ((j / 2) % 2);
      if (token < rows && consumer)
        *reinterpret_cast<float2*>(tile_gl + (split * kBlockN + channel) * kBT + token) =
            make_float2(total[j], total[j + 1]);
    }
    // v5's arrival: fence, barrier, count in; the last split of the tile goes on.
    __shared__ bool last_sh;
    __threadfence();  // this block's partials visible device-wide before its arrival is
    __syncthreads();
    if (threadIdx.x == 0) last_sh = atomicAdd(&arrivals[tile], 1u) == unsigned(splits - 1);
    __syncthreads();
    if (!last_sh) return;
    __threadfence();  // the other splits' partials, published before their arrivals, are read after
                      // ours
    if (threadIdx.x == 0) arrivals[tile] = 0;  // re-armed for the next launch
    sum_split_partials<kBT, kThreads8, kOutRow>(tile_gl, splits, rows, out_sh);  // tiles.cuh
  }
  __syncthreads();
  store_y_tile<kBT, kThreads8, kOutRow>(out_sh, y, t0, nb0, m, n);
}

template <int kBT, bool kZeros, int kSub>
Status launch_v8(const GemmArgs& a, cudaStream_t stream) {
  constexpr int kBytes = Tile<kBT, kSub>::kRingBytes + 1024;  // + the alignment of the first stage
  const auto [sms, per_sm] = kernel_fit<gemm_v8_kernel<kBT, kZeros, kSub>>(kThreads8, kBytes);
  const int64_t tiles_m = (a.m + kBT - 1) / kBT, tiles_n = (a.n + kBlockN - 1) / kBlockN;
  const int64_t k_tiles = (a.k + kBlockK - 1) / kBlockK, k_slots = (k_tiles + kSub - 1) / kSub;
  // Split K only where the token tiles fit one raster group (the grid's z is then the split); a
  // split takes whole slots.
  const int splits =
      tiles_m <= kRaster
          ? int(std::min<int64_t>(splits_for(tiles_m * tiles_n, k_tiles, sms, per_sm), k_slots))
          : 1;
  float* partials = nullptr;
  unsigned* arrivals = nullptr;
  SplitCut cut{0, 0};  // {0, 0}: one split
  if (splits > 1) {
    Status s = split_workspace(tiles_m * tiles_n * splits * kBlockN * kBT, tiles_m * tiles_n,
                               &partials, &arrivals);
    if (!s.ok()) return s;
    cut = split_cut(k_slots, splits);
  }
  const dim3 grid(unsigned(std::min<int64_t>(tiles_m, kRaster)), unsigned(tiles_n),
                  unsigned(splits > 1 ? splits : (tiles_m + kRaster - 1) / kRaster));
  Maps maps;
  Status s = wgmma_maps(&maps, a, kBT);
  if (!s.ok()) return s;
  gemm_v8_kernel<kBT, kZeros, kSub><<<grid, kThreads8, kBytes, stream>>>(
      maps, a.y, a.m, a.n, a.k, group_shift_of(a.group, a.k), cut, partials, arrivals);
  return last_launch_status(kW4a16rGemm.name);
}

template <int kBT, int kSub>
Status launch_v8(const GemmArgs& a, cudaStream_t stream) {
  return a.zeros ? launch_v8<kBT, true, kSub>(a, stream) : launch_v8<kBT, false, kSub>(a, stream);
}

// Tiles of 16, 32 or 64 tokens (part and total, kBT / 2 registers each, leave no room for 128),
// with kSubSmall 64-k stages a slot up to 32 tokens and kSub64 at 64.
template <int kSubSmall, int kSub64>
Status gemm_v8(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16rGemm, a);
  if (s.ok()) s = Check().arch_at_least(90).status();  // wgmma: sm_90a
  if (!s.ok()) return s;
  return a.m <= 16   ? launch_v8<16, kSubSmall>(a, stream)
         : a.m <= 32 ? launch_v8<32, kSubSmall>(a, stream)
                     : launch_v8<64, kSub64>(a, stream);
}

Version v8_version(const char* id, const char* summary, GemmLaunch launch,
                   std::vector<SassFact> sass, Kind kind) {
  Version v = gemm_version(kW4a16rGemm, id, summary, launch, std::move(sass), kind);
  v.min_arch = 90;
  return v;
}
const Register kRegistered{v8_version(
    "v8_group_scales",
    "wgmma on unscaled (q - z): each group's FP32 sum scaled once; 16- to 64-token tiles",
    gemm_v8<4, 2>,
    {{"gemm_v8_kernel",
      {"sm_90a"},
      {"HGMMA", "UTMALDG", "LOP3", "FFMA", "ATOMG"},
      {"HMMA", "HMUL2", "I2F", "I2FP", "LDGSTS"},
      true,
      "unscaled weights feed HGMMA and the group scale is an FFMA on the sum: no HMUL2, no "
      "mma.sync, no int-to-float convert"}},
    Kind::kVersion)};
// The ablation (benched, tested, never graded): a slot of one 64-k stage.
const Register kOneStageSlots{v8_version("ablation_v8_64k_slots",
                                         "v8 with one 64-k stage a ring slot", gemm_v8<1, 1>, {},
                                         Kind::kAblation)};

}  // namespace
}  // namespace lkw::w4a16
