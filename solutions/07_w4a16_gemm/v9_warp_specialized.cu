// v9_warp_specialized — prefill: a producer warpgroup loads; two consumer warpgroups, with the
// registers it gave up, multiply 256-token tiles and unpack the next stage under this one's wgmmas.
//
// Since v6: at large M v6's four warpgroups wait on the same stage, read its words and unpack in
// step, and each waits for its own wgmmas before it unpacks the next stage: at every stage the
// tensor core runs dry while all four refill it. Warp specialization pays for the fix. Warpgroup 0
// loads and keeps 40 registers (setmaxnreg.dec); warpgroups 1 and 2 claim 232 each (setmaxnreg.inc)
// and spend them twice: a 256-token accumulator (m64n256k16, 128 registers), so that each unpacked
// fragment feeds twice v6's tokens (half the unpack a FLOP), and a second set of A fragments, so
// that a warpgroup unpacks stage s + 1 while the tensor core multiplies stage s and waits for s
// only then. A tile is 128 channels (a 64-channel block a consumer) by 256 tokens; knobs: 128
// tokens up to M = 128, there with two 64-k stages a ring slot (v8's slots; ablation_v9_64k_slots:
// one), v6's split of K where the tiles leave SMs idle, zero points a template argument.
// Expect: at M ≥ 256 most of the gap to cuBLAS's BF16 rate closed. SASS: HGMMA, UTMALDG,
// USETMAXREG; no HMMA, no I2F, no spills.
#include "gemm_plan.h"
#include "tiles.cuh"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

constexpr int kConsumers = 2;                      // warpgroups, one 64-channel block each
constexpr int kThreads9 = 128 * (1 + kConsumers);  // and the producer warpgroup
constexpr int kBN = 64 * kConsumers;               // channels of a tile
constexpr int kStepWords = 32 * 4;                 // a 64-channel block's words per k-step
constexpr int kBlockWords = kKSteps * kStepWords;  // per 64-k stage: 2 KB, contiguous in HBM
constexpr int kScaleRows = 2;                      // a stage's groups: k = 0..31 and 32..63 of it
constexpr int kRaster = 8;               // token tiles that share a run of N tiles (L2 reuse)
constexpr int kOutRow = kBN + 8;         // y tile row in shared memory, padded
constexpr int kRingBudget = 220 * 1024;  // one block an SM: most of its shared memory
// The launch gives every thread 65536 / 384 = 168 registers (launch bounds); setmaxnreg moves
// them. Claiming more than the producer released would hang the consumers' setmaxnreg.inc.
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(ptx::setmaxnreg_fits(128, kProducerRegs, 128 * kConsumers, kConsumerRegs),
              "the consumers may claim only what the producer gave up");

// The ring: kSlots slots of kSub 64-k stages each (v8's slots); a stage holds x, words, scales,
// zero points.
template <int kBT, int kSub>
struct Tile {
  static constexpr int kXBytes = kBT * 128;  // kBT rows of 64 k: 1024-byte swizzle atoms
  static constexpr int kWBytes = kConsumers * kBlockWords * 4;
  static constexpr int kSBytes = kScaleRows * kBN * 2;
  static constexpr int kTmaBytes = kXBytes + kWBytes + kSBytes;  // + kZeroRows·kBN with zeros
  static constexpr int kStageBytes = (kTmaBytes + kZeroRows * kBN + 1023) / 1024 * 1024;
  static constexpr int kSlots = std::min(8, kRingBudget / (kSub * kStageBytes));
  static constexpr int kRingBytes = kSlots * kSub * kStageBytes;
  static_assert(kSlots >= 3, "a slot loads while two are computed on");
  static_assert(kBT * kOutRow * 2 <= kRingBytes, "the y tile reuses the ring");
};

using Maps = WgmmaMaps;  // x, words, scales, zero points: a TMA box each per stage (tiles.cuh)

template <int kBT, bool kZeros, int kSub>
__global__ void __launch_bounds__(kThreads9, 1)
    gemm_v9_kernel(const __grid_constant__ Maps maps, __nv_bfloat16* __restrict__ y, int64_t m,
                   int64_t n, int64_t k, int group_shift, SplitCut cut,
                   float* __restrict__ partials, unsigned* __restrict__ arrivals) {
  using T = Tile<kBT, kSub>;
  constexpr int kSlots = T::kSlots, kSteps = kSub * kKSteps;  // k-steps a slot
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem =
      smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  // v6's grid: kRaster token tiles of one N tile back to back, z the raster group or the split.
  const int splits = cut.base == 0 && cut.extra == 0 ? 1 : int(gridDim.z),
            split = splits == 1 ? 0 : int(blockIdx.z);
  const int64_t tm = (splits == 1 ? int64_t(blockIdx.z) * kRaster : 0) + blockIdx.x;
  if (tm * kBT >= m) return;  // the last raster group's missing tiles
  const int64_t t0 = tm * kBT, nb0 = int64_t(blockIdx.y) * kBN;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  int64_t begin = 0, end = (k + kSub * kBlockK - 1) / (kSub * kBlockK);  // this split's slots
  if (splits > 1) split_range(cut, split, &begin, &end);
  const int kt_begin = int(begin), kt_end = int(end);  // in slots; stages past K load zeros
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
      ptx::mbarrier_init(&full_sh[s], 1), ptx::mbarrier_init(&empty_sh[s], 4 * kConsumers);
  __syncthreads();

  if (group == 0) {
    // Load: the producer warpgroup gives its registers away; one thread asks the copy engine for
    // each slot's stages as soon as the slot is empty, a whole ring ahead of the consumers.
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    int slot = 0;
    unsigned phase = 0;
    for (int kt = kt_begin; kt < kt_end; ++kt) {
      uint64_t* const full = &full_sh[slot];
      ptx::mbarrier_wait(&empty_sh[slot], phase ^ 1);  // passes at once on the first round
      ptx::mbarrier_arrive_expect_tx(full,
                                     kSub * (T::kTmaBytes + (kZeros ? kZeroRows * kBN : 0)));
      for (int u = 0; u < kSub; ++u) {
        const int st = slot * kSub + u, stage = kt * kSub + u, kk = stage * kBlockK;
        ptx::tma_load_2d(x_stage(st), &maps.x, kk, int(t0), full);
        ptx::tma_load_2d(b_stage(st), &maps.w, stage * (kBlockWords / 2), int(nb0 / 64), full);
#pragma unroll
        for (int r = 0; r < kScaleRows; ++r) {
          const int row = (kk + 32 * r) >> group_shift;  // of [K/G, N]
          ptx::tma_load_2d(s_stage(st) + r * kBN, &maps.s, int(nb0), row, full);
          if (kZeros) ptx::tma_load_2d(z_stage(st) + r * kBN, &maps.z, int(nb0), row, full);
        }
      }
      if (++slot == kSlots) slot = 0, phase ^= 1;
    }
    return;
  }

  // Consumers: warpgroup c = group − 1 takes the tile's 64-channel block c; warp w its m16 rows.
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int c = group - 1, g = lane / 4, t = lane % 4;
  const int w_off = c * kBlockWords + 4 * lane + warp, c_off = c * 64 + 16 * warp + g;
  // Unpack: slot `slot`'s A fragments, four a stage, scaled (v6's fragment: a0, a2 = channel
  // 16w + g, a1, a3 = channel 16w + 8 + g).
  auto unpack = [&](int slot, uint32_t (&a)[kSteps][4]) {
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      const int st = slot * kSub + u;
      const uint32_t* b_sh = b_stage(st) + w_off;
      const __nv_bfloat16* s_sh = s_stage(st) + c_off;
      const uint8_t* z_sh = z_stage(st) + c_off;
      uint32_t word[kKSteps];
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) word[ks] = b_sh[ks * kStepWords];
#pragma unroll
      for (int r = 0; r < kScaleRows; ++r) {
        const __nv_bfloat162 s_lo = __bfloat162bfloat162(s_sh[r * kBN]),
                             s_hi = __bfloat162bfloat162(s_sh[r * kBN + 8]);
        const uint32_t z_lo = kZeros ? zero_bias(z_sh[r * kBN]) : kBias8,
                       z_hi = kZeros ? zero_bias(z_sh[r * kBN + 8]) : kBias8;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int ks = 2 * r + h, j = u * kKSteps + ks;
          __nv_bfloat162 q[4];
          unpack_minus_zero(word[ks], z_lo, z_hi, q);
          a[j][0] = bits_of(__hmul2(q[0], s_lo)), a[j][1] = bits_of(__hmul2(q[2], s_hi));
          a[j][2] = bits_of(__hmul2(q[1], s_lo)), a[j][3] = bits_of(__hmul2(q[3], s_hi));
        }
      }
    }
  };
  float acc[kBT / 2] = {};
  ptx::wgmma_fence_operands(acc);
  uint32_t a0[kSteps][4], a1[kSteps][4];  // this slot's fragments and the next one's
  int slot = 0;
  unsigned phase = 0;
  // One slot: issue its k-steps from `cur`; while the tensor core runs them, wait for the next
  // slot and unpack it into `next`; only then retire this slot's wgmmas and release it.
  auto step = [&](int kt, uint32_t (&cur)[kSteps][4], uint32_t (&next)[kSteps][4]) {
    ptx::wgmma_fence();
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      const uint64_t desc = ptx::wgmma_desc_k_major_sw128(x_stage(slot * kSub + u));
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)  // k-step ks: 32 bytes on
        ptx::wgmma_bf16_rs<kBT>(acc, cur[u * kKSteps + ks], desc + 2 * ks);
    }
    ptx::wgmma_commit();
    const int next_slot = slot + 1 == kSlots ? 0 : slot + 1;
    const unsigned next_phase = slot + 1 == kSlots ? phase ^ 1 : phase;
    // BEGIN SOLUTION: the overlap: when a next slot exists (kt + 1 < kt_end), wait for it
    //   (next_slot, next_phase) and unpack it into `next`, then wait for this slot's wgmmas.
    if (kt + 1 < kt_end) {
      ptx::mbarrier_wait(&full_sh[next_slot], next_phase);
      unpack(next_slot, next);
    }
    ptx::wgmma_wait<0>();
    // STUB: ptx::wgmma_wait<0>();
    // END SOLUTION
    ptx::wgmma_fence_operands(acc);
#pragma unroll
    for (int j = 0; j < kSteps; ++j) ptx::wgmma_fence_operands(cur[j]);  // held until here
    // Release: the warp's reads of the slot, wgmma's too, are over.
    if (lane == 0) ptx::mbarrier_arrive(&empty_sh[slot]);
    slot = next_slot, phase = next_phase;
  };
  if (kt_begin < kt_end) {
    ptx::mbarrier_wait(&full_sh[0], 0);
    unpack(0, a0);
  }
  for (int kt = kt_begin; kt < kt_end; kt += 2) {  // two steps a turn: a0 and a1 trade roles
    step(kt, a0, a1);
    if (kt + 1 < kt_end) step(kt + 1, a1, a0);
  }
  ptx::wgmma_fence_operands(acc);
  // Only the consumers go on (the producer has returned): a named barrier, not __syncthreads.
  constexpr int kConsumerThreads = 128 * kConsumers;
  const int tid = int(threadIdx.x) - 128;
  ptx::named_barrier_sync(1, kConsumerThreads);  // every stage is consumed: the ring is the y tile

  // Store: v6's, on a 128-channel tile: accumulator j is channel 16w + g (+ 8 for j % 4 ≥ 2) of
  // the consumer's block, token 8·(j / 4) + 2t (+ 1 for odd j).
  __nv_bfloat16* const out_sh = reinterpret_cast<__nv_bfloat16*>(smem);
  if (splits == 1) {
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j) {
      const int token = 8 * (j / 4) + 2 * t + j % 2, channel = c_off + 8 * ((j / 2) % 2);
      out_sh[token * kOutRow + channel] = __float2bfloat16_rn(acc[j]);
    }
  } else {
    // Reduce: v6's split-K finish, [tile][split][128 channels][kBT tokens] FP32.
    const int rows = int(m - t0 < kBT ? m - t0 : kBT);
    const int64_t tile = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    float* const tile_gl = partials + tile * splits * (kBN * kBT);
#pragma unroll
    for (int j = 0; j < kBT / 2; j += 2) {
      const int token = 8 * (j / 4) + 2 * t, channel = c_off + 8 * ((j / 2) % 2);
      if (token < rows)
        *reinterpret_cast<float2*>(tile_gl + (split * kBN + channel) * kBT + token) =
            make_float2(acc[j], acc[j + 1]);
    }
    __shared__ bool last_sh;
    __threadfence();  // this block's partials visible device-wide before its arrival is
    ptx::named_barrier_sync(1, kConsumerThreads);
    if (tid == 0) last_sh = atomicAdd(&arrivals[tile], 1u) == unsigned(splits - 1);
    ptx::named_barrier_sync(1, kConsumerThreads);
    if (!last_sh) return;
    __threadfence();  // the other splits' partials, published before their arrivals, read after
    if (tid == 0) arrivals[tile] = 0;  // re-armed for the next launch
    sum_split_partials<kBT, kConsumerThreads, kOutRow, kBN>(tile_gl, splits, rows, out_sh, tid);
  }
  ptx::named_barrier_sync(1, kConsumerThreads);
  store_y_tile<kBT, kConsumerThreads, kOutRow, kBN>(out_sh, y, t0, nb0, m, n, tid);
}

template <int kBT, bool kZeros, int kSub>
Status launch_v9(const GemmArgs& a, cudaStream_t stream) {
  constexpr int kBytes = Tile<kBT, kSub>::kRingBytes + 1024;  // + the alignment of the first stage
  const auto [sms, per_sm] = kernel_fit<gemm_v9_kernel<kBT, kZeros, kSub>>(kThreads9, kBytes);
  const int64_t tiles_m = (a.m + kBT - 1) / kBT, tiles_n = (a.n + kBN - 1) / kBN;
  const int64_t k_tiles = (a.k + kBlockK - 1) / kBlockK, k_slots = (k_tiles + kSub - 1) / kSub;
  // v6's plan: split K only where the token tiles fit one raster group (z is then the split); a
  // split takes whole slots.
  const int splits =
      tiles_m <= kRaster
          ? int(std::min<int64_t>(splits_for(tiles_m * tiles_n, k_tiles, sms, per_sm), k_slots))
          : 1;
  float* partials = nullptr;
  unsigned* arrivals = nullptr;
  SplitCut cut{0, 0};  // {0, 0}: one split
  if (splits > 1) {
    Status s = split_workspace(tiles_m * tiles_n * splits * kBN * kBT, tiles_m * tiles_n,
                               &partials, &arrivals);
    if (!s.ok()) return s;
    cut = split_cut(k_slots, splits);
  }
  const dim3 grid(unsigned(std::min<int64_t>(tiles_m, kRaster)), unsigned(tiles_n),
                  unsigned(splits > 1 ? splits : (tiles_m + kRaster - 1) / kRaster));
  Maps maps;
  Status s = wgmma_maps(&maps, a, kBT, kBN);
  if (!s.ok()) return s;
  gemm_v9_kernel<kBT, kZeros, kSub><<<grid, kThreads9, kBytes, stream>>>(
      maps, a.y, a.m, a.n, a.k, group_shift_of(a.group, a.k), cut, partials, arrivals);
  return last_launch_status(kW4a16rGemm.name);
}

template <int kBT, int kSub>
Status launch_v9(const GemmArgs& a, cudaStream_t stream) {
  return a.zeros ? launch_v9<kBT, true, kSub>(a, stream) : launch_v9<kBT, false, kSub>(a, stream);
}

// 256-token tiles; 128 up to M = 128, where a 256-token tile would be half padding; kSub128 and
// kSub256 64-k stages a slot.
template <int kSub128, int kSub256>
Status gemm_v9(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16rGemm, a);
  if (s.ok()) s = Check().arch_at_least(90).status();  // wgmma, setmaxnreg: sm_90a
  if (!s.ok()) return s;
  return a.m <= 128 ? launch_v9<128, kSub128>(a, stream) : launch_v9<256, kSub256>(a, stream);
}

Version v9_version(const char* id, const char* summary, GemmLaunch launch,
                   std::vector<SassFact> sass, Kind kind) {
  Version v = gemm_version(kW4a16rGemm, id, summary, launch, std::move(sass), kind);
  v.min_arch = 90;
  return v;
}
const Register kRegistered{v9_version(
    "v9_warp_specialized",
    "a producer warpgroup loads; two consumers multiply 256-token tiles, unpacking ahead",
    gemm_v9<2, 1>,
    {{"gemm_v9_kernel",
      {"sm_90a"},
      {"HGMMA", "UTMALDG", "LOP3", "USETMAXREG"},
      {"HMMA", "I2F", "I2FP", "LDGSTS"},
      true,
      "registers moved by setmaxnreg to the consumers; unpacked weights feed HGMMA; no "
      "mma.sync, no int-to-float convert"}},
    Kind::kVersion)};
// The ablation (benched, tested, never graded): a slot of one 64-k stage.
const Register kOneStageSlots{v9_version("ablation_v9_64k_slots",
                                         "v9 with one 64-k stage a ring slot at every M",
                                         gemm_v9<1, 1>, {}, Kind::kAblation)};

}  // namespace
}  // namespace lkw::w4a16
