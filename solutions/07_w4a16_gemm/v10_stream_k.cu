// v10_stream_k — v9's block made persistent: where the tiles leave the last wave ragged, one
// block an SM takes an equal run of the tiles' stages, and a tile cut between two runs is summed
// by the part that arrives last.
//
// Since v9: on 28672 × 8192 at M ≤ 256 v9 has 224 tiles for 132 SMs: a second wave of 92 tiles
// leaves 40 SMs idle for a whole tile's time, and v5's split of K cannot fix it (it cuts every
// tile the same number of times: 224 · s blocks are never a whole number of waves). Stream-K cuts
// the stages, not the tiles: 224 · 128 stages / 132 blocks is 217 stages each, 1.7 tiles. The
// host plans the runs (gemm_plan.h); the producer and the consumers walk the same run of
// segments, the ring flowing from one tile into the next; a whole tile is stored as v9 stores it
// (from a y tile of its own: the ring is busy with the next tile), a cut one goes to the partial
// slots, and its last part sums them in block order (a fixed order: the same bits every run).
// Knobs: stream-K only where the wave is ragged and x stays in L2 (few token tiles), else v9's
// grid of whole tiles; 128 tokens up to M = 128.
// Expect: at M = 128 and 256 on 28672 × 8192 the idle fifth of the second wave recovered.
#include "gemm_plan.h"
#include "tiles.cuh"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

constexpr int kConsumers = 2;                       // warpgroups, one 64-channel block each
constexpr int kThreads10 = 128 * (1 + kConsumers);  // and the producer warpgroup
constexpr int kBN = 64 * kConsumers;                // channels of a tile
constexpr int kStepWords = 32 * 4;                  // a 64-channel block's words per k-step
constexpr int kBlockWords = kKSteps * kStepWords;   // per 64-k stage: 2 KB, contiguous in HBM
constexpr int kScaleRows = 2;                       // a stage's groups: k = 0..31 and 32..63 of it
constexpr int kRaster = 8;        // token tiles that share a run of N tiles (L2 reuse)
constexpr int kOutRow = kBN + 8;  // y tile row in shared memory, padded
constexpr int kSmem = 227 * 1024 - 1024 - 256;  // the opt-in maximum, less alignment and barriers
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(ptx::setmaxnreg_fits(128, kProducerRegs, 128 * kConsumers, kConsumerRegs),
              "the consumers may claim only what the producer gave up");

template <int kBT>
struct Tile {
  static constexpr int kXBytes = kBT * 128;  // kBT rows of 64 k: 1024-byte swizzle atoms
  static constexpr int kWBytes = kConsumers * kBlockWords * 4;
  static constexpr int kSBytes = kScaleRows * kBN * 2;
  static constexpr int kTmaBytes = kXBytes + kWBytes + kSBytes;  // + kZeroRows·kBN with zeros
  static constexpr int kStageBytes = (kTmaBytes + kZeroRows * kBN + 1023) / 1024 * 1024;
  static constexpr int kOutBytes = kBT * kOutRow * 2;  // the y tile: the ring is never free
  static constexpr int kStages = std::min(8, (kSmem - kOutBytes) / kStageBytes);
  static constexpr int kRingBytes = kStages * kStageBytes;
  static_assert(kStages >= 3, "a stage loads while two are computed on");
};

template <int kBT, bool kZeros>
__global__ void __launch_bounds__(kThreads10, 1)
    gemm_v10_kernel(const __grid_constant__ WgmmaMaps maps,
                    const __grid_constant__ StreamKPlan plan, __nv_bfloat16* __restrict__ y,
                    int64_t m, int64_t n, int k_tiles, int group_shift,
                    float* __restrict__ partials, unsigned* __restrict__ arrivals) {
  using T = Tile<kBT>;
  constexpr int kStages = T::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem =
      smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  // The block's run: stream-K's segments, or (blocks = 0) the one whole tile of v9's grid.
  const bool streamed = plan.blocks > 0;
  const int b = int(blockIdx.x);
  const int tm_dp = int(blockIdx.z) * kRaster + b;
  if (!streamed && int64_t(tm_dp) * kBT >= m) return;  // the last raster group's missing tiles
  const Segment run0 = streamed ? first_segment(plan, b) : Segment{tm_dp, blockIdx.y, 0, k_tiles};
  auto next = [&](const Segment& s) { return streamed ? next_segment(plan, b, s) : Segment{}; };
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  auto x_stage = [&](int s) { return smem + s * T::kStageBytes; };
  auto b_stage = [&](int s) { return reinterpret_cast<uint32_t*>(x_stage(s) + T::kXBytes); };
  auto s_stage = [&](int s) {
    return reinterpret_cast<__nv_bfloat16*>(x_stage(s) + T::kXBytes + T::kWBytes);
  };
  auto z_stage = [&](int s) { return x_stage(s) + T::kTmaBytes; };
  __shared__ uint64_t full_sh[kStages], empty_sh[kStages];
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s)
      ptx::mbarrier_init(&full_sh[s], 1), ptx::mbarrier_init(&empty_sh[s], 4 * kConsumers);
  __syncthreads();

  if (group == 0) {
    // Load: v9's producer, walking the run: one ring across every segment, so the next tile's
    // stages load while the consumers finish this one.
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    int slot = 0;
    unsigned phase = 0;
    for (Segment sg = run0; sg.kb < sg.ke; sg = next(sg)) {
      const int t0 = sg.tm * kBT, nb64 = int(sg.tn * (kBN / 64)), nb0 = int(sg.tn * kBN);
      for (int kt = sg.kb; kt < sg.ke; ++kt) {
        uint64_t* const full = &full_sh[slot];
        ptx::mbarrier_wait(&empty_sh[slot], phase ^ 1);  // passes at once on the first round
        ptx::mbarrier_arrive_expect_tx(full, T::kTmaBytes + (kZeros ? kZeroRows * kBN : 0));
        ptx::tma_load_2d(x_stage(slot), &maps.x, kt * kBlockK, t0, full);
        ptx::tma_load_2d(b_stage(slot), &maps.w, kt * (kBlockWords / 2), nb64, full);
#pragma unroll
        for (int r = 0; r < kScaleRows; ++r) {
          const int row = (kt * kBlockK + 32 * r) >> group_shift;  // of [K/G, N]
          ptx::tma_load_2d(s_stage(slot) + r * kBN, &maps.s, nb0, row, full);
          if (kZeros) ptx::tma_load_2d(z_stage(slot) + r * kBN, &maps.z, nb0, row, full);
        }
        if (++slot == kStages) slot = 0, phase ^= 1;
      }
    }
    return;
  }

  // Consumers: v9's, a segment at a time.
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int c = group - 1, g = lane / 4, t = lane % 4;
  const int w_off = c * kBlockWords + 4 * lane + warp, c_off = c * 64 + 16 * warp + g;
  auto unpack = [&](int slot, uint32_t(&a)[kKSteps][4]) {  // v9's
    const uint32_t* b_sh = b_stage(slot) + w_off;
    const __nv_bfloat16* s_sh = s_stage(slot) + c_off;
    const uint8_t* z_sh = z_stage(slot) + c_off;
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
        const int ks = 2 * r + h;
        __nv_bfloat162 q[4];
        unpack_minus_zero(word[ks], z_lo, z_hi, q);
        a[ks][0] = bits_of(__hmul2(q[0], s_lo)), a[ks][1] = bits_of(__hmul2(q[2], s_hi));
        a[ks][2] = bits_of(__hmul2(q[1], s_lo)), a[ks][3] = bits_of(__hmul2(q[3], s_hi));
      }
    }
  };
  float acc[kBT / 2];
  uint32_t a0[kKSteps][4], a1[kKSteps][4];
  int slot = 0, kt_end = 0;
  unsigned phase = 0;
  auto step = [&](int kt, uint32_t(&cur)[kKSteps][4], uint32_t(&next)[kKSteps][4]) {  // v9's
    const uint64_t desc = ptx::wgmma_desc_k_major_sw128(x_stage(slot));
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) ptx::wgmma_bf16_rs<kBT>(acc, cur[ks], desc + 2 * ks);
    ptx::wgmma_commit();
    const int next_slot = slot + 1 == kStages ? 0 : slot + 1;
    const unsigned next_phase = slot + 1 == kStages ? phase ^ 1 : phase;
    if (kt + 1 < kt_end) {
      ptx::mbarrier_wait(&full_sh[next_slot], next_phase);
      unpack(next_slot, next);
    }
    ptx::wgmma_wait<0>();
    ptx::wgmma_fence_operands(acc);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) ptx::wgmma_fence_operands(cur[ks]);
    if (lane == 0) ptx::mbarrier_arrive(&empty_sh[slot]);
    slot = next_slot, phase = next_phase;
  };
  constexpr int kConsumerThreads = 128 * kConsumers;
  constexpr int kTileFloats = kBN * kBT;
  const int tid = int(threadIdx.x) - 128;
  __nv_bfloat16* const out_sh = reinterpret_cast<__nv_bfloat16*>(smem + T::kRingBytes);
  __shared__ bool last_sh;
  for (Segment sg = run0; sg.kb < sg.ke; sg = next(sg)) {
    // Compute: the segment's stages into a zeroed accumulator.
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j) acc[j] = 0.f;
    ptx::wgmma_fence_operands(acc);
    kt_end = sg.ke;
    ptx::mbarrier_wait(&full_sh[slot], phase);
    unpack(slot, a0);
    for (int kt = sg.kb; kt < kt_end; kt += 2) {  // two steps a turn: a0 and a1 trade roles
      step(kt, a0, a1);
      if (kt + 1 < kt_end) step(kt + 1, a1, a0);
    }
    ptx::wgmma_fence_operands(acc);
    const int64_t t0 = int64_t(sg.tm) * kBT, nb0 = sg.tn * kBN;
    const int rows = int(m - t0 < kBT ? m - t0 : kBT);
    ptx::named_barrier_sync(1, kConsumerThreads);  // the last tile's store has read out_sh
    if (sg.kb == 0 && sg.ke == k_tiles) {
      // Whole: v9's store of the accumulator into the y tile.
#pragma unroll
      for (int j = 0; j < kBT / 2; ++j) {
        const int token = 8 * (j / 4) + 2 * t + j % 2, channel = c_off + 8 * ((j / 2) % 2);
        out_sh[token * kOutRow + channel] = __float2bfloat16_rn(acc[j]);
      }
    } else {
      // Cut: this part to its slot ([kBN channels][kBT tokens] FP32, v9's split layout), then the
      // part that arrives last sums every part of the tile, in block order.
      const bool run_start = sg.tm == plan.at[b].tm && sg.tn == plan.at[b].tn;
      const int64_t u0 = unit_of(plan, sg.tm, sg.tn, 0);
      const TileParts parts = tile_parts(plan, b, u0);
      float* const mine = partials + int64_t(2 * b + (run_start ? 0 : 1)) * kTileFloats;
#pragma unroll
      for (int j = 0; j < kBT / 2; j += 2) {
        const int token = 8 * (j / 4) + 2 * t, channel = c_off + 8 * ((j / 2) % 2);
        if (token < rows)
          *reinterpret_cast<float2*>(mine + channel * kBT + token) =
              make_float2(acc[j], acc[j + 1]);
      }
      __threadfence();  // this part visible device-wide before its arrival is
      ptx::named_barrier_sync(1, kConsumerThreads);
      const int64_t tile = sg.tn * plan.tiles_m + sg.tm;
      // BEGIN SOLUTION: the arrival: thread 0 counts this part in on arrivals[tile]; the part that
      //   brings the count to parts.parts is the last (last_sh), and only it sums the tile.
      if (tid == 0) last_sh = atomicAdd(&arrivals[tile], 1u) == unsigned(parts.parts - 1);
      // STUB: if (tid == 0) last_sh = false;
      // END SOLUTION
      ptx::named_barrier_sync(1, kConsumerThreads);
      if (!last_sh) continue;
      __threadfence();  // the other parts, published before their arrivals, read after
      if (tid == 0) arrivals[tile] = 0;  // re-armed for the next launch
      // Reduce: a thread one (channel, token pair) at a time, the parts summed in block order.
      for (int q = tid; q < kBN * (kBT / 2); q += kConsumerThreads) {
        const int channel = q / (kBT / 2), token = 2 * (q % (kBT / 2));
        if (token >= rows) continue;
        float2 sum = make_float2(0.f, 0.f);
        for (int i = 0; i < parts.parts; ++i) {
          const float2 v = __ldcg(reinterpret_cast<const float2*>(
              partials + int64_t(part_slot(parts, i)) * kTileFloats + channel * kBT + token));
          sum.x += v.x, sum.y += v.y;
        }
        out_sh[token * kOutRow + channel] = __float2bfloat16_rn(sum.x);
        out_sh[(token + 1) * kOutRow + channel] = __float2bfloat16_rn(sum.y);
      }
    }
    // Store: v9's.
    ptx::named_barrier_sync(1, kConsumerThreads);
    store_y_tile<kBT, kConsumerThreads, kOutRow, kBN>(out_sh, y, t0, nb0, m, n, tid);
  }
}

template <int kBT, bool kZeros>
Status launch_v10(const GemmArgs& a, cudaStream_t stream) {
  constexpr int kBytes = Tile<kBT>::kRingBytes + Tile<kBT>::kOutBytes + 1024;
  static int sms = 0;  // the device's, asked once per kernel
  static std::once_flag asked;
  std::call_once(asked, [] {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaFuncSetAttribute(gemm_v10_kernel<kBT, kZeros>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kBytes);
  });
  const int64_t tiles_m = (a.m + kBT - 1) / kBT, tiles_n = (a.n + kBN - 1) / kBN;
  const int64_t k_tiles = (a.k + kBlockK - 1) / kBlockK;
  const StreamKPlan plan = stream_k_plan(tiles_m, tiles_n, k_tiles, sms);
  float* partials = nullptr;
  unsigned* arrivals = nullptr;
  if (plan.blocks > 0) {
    Status s = split_workspace(int64_t(2) * plan.blocks * kBN * kBT, tiles_m * tiles_n, &partials,
                               &arrivals);
    if (!s.ok()) return s;
  }
  const dim3 grid = plan.blocks > 0
                        ? dim3(unsigned(plan.blocks))
                        : dim3(unsigned(std::min<int64_t>(tiles_m, kRaster)), unsigned(tiles_n),
                               unsigned((tiles_m + kRaster - 1) / kRaster));
  WgmmaMaps maps;
  Status s = wgmma_maps(&maps, a, kBT, kBN);
  if (!s.ok()) return s;
  gemm_v10_kernel<kBT, kZeros><<<grid, kThreads10, kBytes, stream>>>(
      maps, plan, a.y, a.m, a.n, int(k_tiles), group_shift_of(a.group, a.k), partials, arrivals);
  return last_launch_status(kW4a16rGemm.name);
}

template <int kBT>
Status launch_v10(const GemmArgs& a, cudaStream_t stream) {
  return a.zeros ? launch_v10<kBT, true>(a, stream) : launch_v10<kBT, false>(a, stream);
}

// v9's tiles: 256 tokens; 128 up to M = 128.
Status gemm_v10(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16rGemm, a);
  if (s.ok()) s = Check().arch_at_least(90).status();  // wgmma, setmaxnreg: sm_90a
  if (!s.ok()) return s;
  return a.m <= 128 ? launch_v10<128>(a, stream) : launch_v10<256>(a, stream);
}

const Register kRegistered{[] {
  Version v = gemm_version(
      kW4a16rGemm, "v10_stream_k",
      "v9 persistent: equal runs of the tiles' stages, a cut tile summed by its last part",
      gemm_v10,
      {{"gemm_v10_kernel",
        {"sm_90a"},
        {"HGMMA", "UTMALDG", "LOP3", "USETMAXREG"},
        {"HMMA", "I2F", "I2FP", "LDGSTS"},
        true,
        "the run planned on the host: no divide (no int-to-float convert) in the kernel"}},
      Kind::kVersion);
  v.min_arch = 90;
  return v;
}()};

}  // namespace
}  // namespace lkw::w4a16
