// v12_grouped_wgmma — v7 and v8 on Hopper's warpgroup tensor core: the expert's weights by TMA,
// the gathered x rows by cp.async, wgmma reading both from shared memory.
//
// Since v7: at prefill mma.sync from a cp.async ring reaches about a third of the BF16 peak
// (chapter 07's v5 → v6). Here a warpgroup multiplies 64 output channels (wgmma's M) by the tile's
// BT gathered rows (its N: 16, 32 or 64, row_tiles_for), both operands K-major in the 128-byte
// swizzle, read through descriptors. The weights, rows of w seen as [E·N, K], come by TMA, one
// 256-row box a stage (gate_up: 128 gate rows and the same channels' 128 up rows, v8's pairing);
// the x rows are a gather, which Hopper's TMA cannot do: each thread cp.asyncs one 16-byte piece to
// where the swizzle puts it and fences it to the async proxy before the barrier opening the stage.
// One wgmma group stays in flight while the next stage's barrier passes (loads run two stages
// behind the ring's end). gate_up: the up warpgroups hand their FP32 sums to the gate ones in shared
// memory, which store silu(g)·u rounded once (v8); moe_grouped_gemm_sum: each weighted FP32 row is
// added into its token's by a 16-byte atomic.
// Expect: prefill near chapter 07's v6; decode as this chapter's v7.
#include "experts.cuh"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"
#include "lkw/workspace.h"

namespace lkw::moe {
namespace {

constexpr int kGroups = 4;  // warpgroups, 64 weight rows each
constexpr int kThreads = kGroups * 128;
constexpr int kBoxRows = kGroups * 64;  // weight rows a stage
constexpr int kBlockK = 64;             // k per stage: one 128-byte row of the swizzle
constexpr int kKSteps = kBlockK / 16;
constexpr int kStages = 5;
constexpr int kAhead = kStages - 2;  // stages loaded ahead: one slot is still read by wgmma
constexpr int kWBytes = kBoxRows * kBlockK * 2;  // 256 rows of 128 bytes

// What the epilogue does with the FP32 sums: store them (moe_grouped_gemm), silu(gate)·up
// (moe_grouped_gemm_silu), or weight and add them into the token's row (moe_grouped_gemm_sum).
enum class Epi { kStore, kSilu, kSum };

// A block's output channels: all 256 weight rows' (store, sum), or 128 (silu: rows 0..127 of a
// stage are gate rows c0.., rows 128..255 the up rows N/2 + c0.. of the same channels).
template <Epi kEpi>
constexpr int out_channels() { return kEpi == Epi::kSilu ? kBoxRows / 2 : kBoxRows; }

template <int kBT, Epi kEpi>
struct Tile {
  static constexpr int kXBytes = kBT * kBlockK * 2;  // kBT rows of 128 bytes: 8-row atoms
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kOutRow = out_channels<kEpi>() + 8;  // out tile row, padded
  static constexpr int kOutBytes = kBT * kOutRow * (kEpi == Epi::kSum ? 4 : 2);  // FP32 for sum
  static constexpr int kUpBytes = kEpi == Epi::kSilu ? kBT / 2 * 256 * 4 : 0;  // the up sums
  static_assert(kXBytes % 1024 == 0 && kWBytes % 1024 == 0, "swizzle atoms 1024-aligned");
  static_assert(kBT * 8 <= kThreads, "x: one 16-byte piece per thread at most");
  static_assert(kOutBytes + kUpBytes <= kRingBytes, "the epilogue's tiles reuse the ring");
};

template <int kBT, Epi kEpi>
__global__ void __launch_bounds__(kThreads)
    grouped_v12_kernel(const __grid_constant__ CUtensorMap w_map, const __nv_bfloat16* __restrict__ x,
                       const int32_t* __restrict__ sorted_ids,
                       const int32_t* __restrict__ expert_ids, __nv_bfloat16* __restrict__ out,
                       const float* __restrict__ weights, float* __restrict__ acc32, int slots,
                       int64_t n, int64_t k, int num_experts, Divisor topk, Divisor block_m) {
  using T = Tile<kBT, kEpi>;
  constexpr bool kSilu = kEpi == Epi::kSilu, kSum = kEpi == Epi::kSum;
  constexpr int kOutN = out_channels<kEpi>();
  extern __shared__ unsigned char smem_raw[];
  // The swizzle atoms must be 1024-aligned in the shared window (chapter 07's v6).
  unsigned char* const smem =
      smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ int slot_sh[kBT], token_sh[kBT];  // sum: x's row is the slot, out's the token
  __shared__ float weight_sh[kSum ? kBT : 1];
  __shared__ uint64_t full_sh[kStages];  // a slot's weights landed (one arrival and the bytes)
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kBT;
  const int64_t n0 = int64_t(blockIdx.y) * kOutN;       // first output channel
  const int64_t n_out = kSilu ? n / 2 : n;              // out's row length

  // Stage rows (v7's): which expert, which slots, which tokens.
  const int expert = expert_ids[divide(row0, block_m)];  // (rows / BLOCK_M)
  if (expert < 0 || expert >= num_experts) return;
  int slot = -1;
  if (threadIdx.x < kBT) {
    slot = sorted_ids[row0 + threadIdx.x];  // (rows)
    slot = slot >= 0 && slot < slots ? slot : -1;
    slot_sh[threadIdx.x] = slot;
    token_sh[threadIdx.x] = slot >= 0 ? divide(slot, topk) : -1;
    if constexpr (kSum) weight_sh[threadIdx.x] = slot >= 0 ? weights[slot] : 0.f;  // (T·topk)
  }
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(&full_sh[s], 1);
  if (!__syncthreads_or(slot >= 0)) return;

  const int k_tiles = int((k + kBlockK - 1) / kBlockK);
  const int w_row = int(int64_t(expert) * n + n0);  // channel n0 of the expert in w as [E·N, K]
  auto w_stage = [&](int s) { return smem + s * T::kStageBytes; };
  auto x_stage = [&](int s) { return w_stage(s) + kWBytes; };
  // Load stage kt into slot kt % kStages: the weights by TMA (thread 0; gate_up: the gate box and
  // the up box N/2 rows further), and piece c of gathered row r at chunk c ^ (r % 8) of the row
  // (the 128-byte swizzle), zeros for a sentinel row or past K. Every thread commits a group,
  // empty or not: the wait count stays uniform.
  auto load_stage = [&](int kt) {
    if (kt < k_tiles) {
      const int s = kt % kStages;
      if (threadIdx.x == 0) {
        ptx::mbarrier_arrive_expect_tx(&full_sh[s], kWBytes);
        ptx::tma_load_2d(w_stage(s), &w_map, kt * kBlockK, w_row, &full_sh[s]);
        if constexpr (kSilu)
          ptx::tma_load_2d(w_stage(s) + kWBytes / 2, &w_map, kt * kBlockK, int(w_row + n / 2),
                           &full_sh[s]);
      }
      // BEGIN SOLUTION: thread r·8 + c copies row r's 16-byte piece c (k = 64·kt + 8c..) of x's
      //   row token_sh[r] to byte 128·r + 16·(c ^ (r % 8)) of the stage's x tile
      if (threadIdx.x < kBT * 8) {
        const int r = threadIdx.x / 8, c = threadIdx.x % 8;
        const int token = kSum ? slot_sh[r] : token_sh[r];  // x's row
        const int64_t gk = int64_t(kt) * kBlockK + 8 * c;
        const bool valid = token >= 0 && gk < k;
        ptx::cp_async_16(x_stage(s) + r * 128 + 16 * (c ^ (r % 8)),
                         valid ? x + int64_t(token) * k + gk : x, valid);  // (T, K)
      }
      // END SOLUTION
    }
    ptx::cp_async_commit();
  };

  float acc[kBT / 2] = {};
  ptx::wgmma_fence_operands(acc);
#pragma unroll
  for (int s = 0; s < kAhead; ++s) load_stage(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    // Wait: this thread's x pieces of stage kt, handed to the async proxy; the barrier then covers
    // every thread's, and every warpgroup's wgmma of stage kt − 2 is done (each waited for all but
    // its last group), so that stage's slot is the one refilled next.
    ptx::cp_async_wait<kAhead - 1>();
    ptx::fence_proxy_async_shared();
    __syncthreads();
    load_stage(kt + kAhead);
    ptx::mbarrier_wait(&full_sh[kt % kStages], (kt / kStages) & 1);
    // Compute: warpgroup `group` takes rows 64·group.. of the weights' box (its 64 channels);
    // k-step ks is 32 bytes further along both tiles' rows (2 in the descriptors' 16-byte units).
    const uint64_t desc_w = ptx::wgmma_desc_k_major_sw128(w_stage(kt % kStages) + group * 64 * 128);
    const uint64_t desc_x = ptx::wgmma_desc_k_major_sw128(x_stage(kt % kStages));
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) ptx::wgmma_bf16_ss<kBT>(acc, desc_w + 2 * ks, desc_x + 2 * ks);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // this stage's products may run on while the next stage is waited for
    ptx::wgmma_fence_operands(acc);
  }
  ptx::wgmma_wait<0>();
  ptx::wgmma_fence_operands(acc);
  ptx::cp_async_wait<0>();
  __syncthreads();  // every stage is consumed: the ring becomes the epilogue's tiles

  // Reduce and store: accumulator j is weight row 64·group + 16·warp + g (+ 8 for j % 4 ≥ 2) of
  // the box, for row 8·(j / 4) + 2t (+ 1 for odd j); through shared memory [row][channel], then
  // each live row to its slot's row of out, 16 bytes at a time (a piece is in or out); sum: the
  // FP32 row, weighted, added 16 bytes at a time into its token's FP32 row.
  __nv_bfloat16* const out_sh = reinterpret_cast<__nv_bfloat16*>(smem);
  float* const sum_sh = reinterpret_cast<float*>(smem);
  auto channel_of = [&](int j) { return 64 * group + 16 * warp + g + 8 * ((j / 2) % 2); };
  if constexpr (kSilu) {
    // Warpgroup 2 + i holds the up sums of the channels warpgroup i holds the gate sums of, in the
    // same registers of the same lane: thread p ( = threadIdx.x mod 256) of each pair meets there.
    float* const up_sh = reinterpret_cast<float*>(smem + T::kOutBytes);
    const int p = threadIdx.x % 256;
    if (group >= 2)
#pragma unroll
      for (int j = 0; j < kBT / 2; ++j) up_sh[j * 256 + p] = acc[j];
    __syncthreads();
    if (group < 2)
#pragma unroll
      for (int j = 0; j < kBT / 2; ++j) {
        const float gate = acc[j], up = up_sh[j * 256 + p];
        out_sh[(8 * (j / 4) + 2 * t + j % 2) * T::kOutRow + channel_of(j)] =
            __float2bfloat16_rn(gate * sigmoid(gate) * up);  // v8's order: one rounding
      }
  } else if constexpr (kSum) {
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j) sum_sh[(8 * (j / 4) + 2 * t + j % 2) * T::kOutRow + channel_of(j)] = acc[j];
  } else {
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j)
      out_sh[(8 * (j / 4) + 2 * t + j % 2) * T::kOutRow + channel_of(j)] = __float2bfloat16_rn(acc[j]);
  }
  __syncthreads();
  if constexpr (kSum) {
    // BEGIN SOLUTION: each live row's four channels at a time, times the slot's weight, added into
    //   acc32[token][channel] with one 16-byte atomic (sm_90's float4 atomicAdd)
    for (int c = threadIdx.x; c < kBT * (kOutN / 4); c += kThreads) {
      const int row = c / (kOutN / 4), col = 4 * (c % (kOutN / 4));
      const int token = token_sh[row];
      if (token >= 0 && n0 + col < n_out) {
        const float wt = weight_sh[row];
        const float4 v = *reinterpret_cast<const float4*>(sum_sh + row * T::kOutRow + col);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float4*>(acc32 + int64_t(token) * n_out + n0 + col),  // (T, N)
                  make_float4(wt * v.x, wt * v.y, wt * v.z, wt * v.w));
#endif
      }
    }
    // END SOLUTION
  } else {
    for (int c = threadIdx.x; c < kBT * (kOutN / 8); c += kThreads) {
      const int row = c / (kOutN / 8), col = 8 * (c % (kOutN / 8));
      const int s = slot_sh[row];
      if (s >= 0 && n0 + col < n_out)
        *reinterpret_cast<uint4*>(out + int64_t(s) * n_out + n0 + col) =  // (T·topk, N or N/2)
            *reinterpret_cast<const uint4*>(out_sh + row * T::kOutRow + col);
    }
  }
}

template <int kBT, Epi kEpi>
Status launch(const GroupedArgs& a, float* acc32, cudaStream_t stream) {
  constexpr bool kSilu = kEpi == Epi::kSilu;
  CUtensorMap w_map;
  Status s = tensor_map_bf16_sw128(&w_map, a.w, int64_t(a.num_experts) * a.n, a.k,
                                   kSilu ? kBoxRows / 2 : kBoxRows);
  if (!s.ok()) return s;
  const int64_t n_out = kSilu ? a.n / 2 : a.n;
  const dim3 grid(unsigned(a.rows / kBT), unsigned(ceil_div(n_out, out_channels<kEpi>())));
  const char* op = kSilu ? kGroupedSiluOp : kEpi == Epi::kSum ? kGroupedSumOp : kGroupedOp;
  return launch_with_smem(grouped_v12_kernel<kBT, kEpi>, grid, kThreads,
                          Tile<kBT, kEpi>::kRingBytes + 1024, stream, op, w_map, a.x,
                          a.sorted_ids, a.expert_ids, a.out, a.weights, acc32,
                          int(a.t * a.topk), a.n, a.k, a.num_experts, divisor_of(a.topk),
                          divisor_of(a.block_m));
}

template <Epi kEpi>
Status launch_rows(const GroupedArgs& a, float* acc32, cudaStream_t stream) {
  switch (row_tiles_for(a)) {
    case 1: return launch<16, kEpi>(a, acc32, stream);
    case 2: return launch<32, kEpi>(a, acc32, stream);
    default: return launch<64, kEpi>(a, acc32, stream);
  }
}

Status check_v12(const GroupedArgs& a) {
  return Check()
      .that(int64_t(a.num_experts) * a.n < (int64_t(1) << 31), "E·N must be below 2^31 (TMA row coordinates)")
      .that(a.topk <= (1 << 20) && a.block_m <= (1 << 20), "topk and block_m within a Divisor's range")
      .arch_at_least(90)  // wgmma: sm_90a
      .status();
}

Status grouped_v12(const GroupedArgs& a, cudaStream_t stream) {
  Status s = validate_grouped(a);
  if (s.ok()) s = check_v12(a);
  if (!s.ok()) return s;
  return a.silu ? launch_rows<Epi::kSilu>(a, nullptr, stream) : launch_rows<Epi::kStore>(a, nullptr, stream);
}

// The down GEMM with moe_sum in its epilogue: the FP32 accumulator [T, N] (a workspace) zeroed,
// every slot's weighted row added into its token's by the GEMM's blocks, in whatever order they
// finish, then rounded once by chapter 01's cast (f32_to_bf16, found in the registry).
Status grouped_v12_sum(const GroupedArgs& a, cudaStream_t stream) {
  static Workspace accumulator("moe_grouped_gemm_sum's FP32 accumulator");
  const Version* round = nullptr;
  Status s = validate_grouped_sum(a);
  if (s.ok()) s = check_v12(a);
  if (s.ok()) s = Registry::get().require("01_formats/f32_to_bf16/v2_vec16", kGroupedSumOp, &round);
  if (!s.ok()) return s;
  void* acc32 = nullptr;
  const int64_t elems = a.t * a.n;
  s = accumulator.get(4 * elems, &acc32);
  if (!s.ok()) return s;
  if (cudaMemsetAsync(acc32, 0, size_t(4 * elems), stream) != cudaSuccess)
    return last_launch_status(kGroupedSumOp);
  s = launch_rows<Epi::kSum>(a, static_cast<float*>(acc32), stream);
  if (!s.ok()) return s;
  Args rounding;
  rounding.inputs = {{acc32, DType::kF32, {a.t, a.n}}};
  rounding.outputs = {{a.out, DType::kBF16, {a.t, a.n}}};
  s = round->launch(rounding, stream);
  if (!s.ok()) s.message = std::string(kGroupedSumOp) + ", rounding: " + s.message;
  return s;
}

Version v12_version(bool silu) {
  Version v = grouped_version(
      silu, "v12_grouped_wgmma",
      silu ? "wgmma, TMA weights, gathered x; gate and up warpgroups meet in shared memory"
           : "wgmma from shared memory: weights by TMA, gathered x by cp.async",
      grouped_v12,
      {{silu ? "grouped_v12_kernel*EpiE1E" : "grouped_v12_kernel*EpiE0E",  // the epilogue's value
        {"sm_90a"},
        {"HGMMA", "UTMALDG", "LDGSTS"},
        {"HMMA", "I2F"},
        true,
        "TMA weights and gathered x feed HGMMA from shared memory; no mma.sync, nothing spilled"}});
  v.min_arch = 90;
  return v;
}
const Register kRegistered{v12_version(false)};
const Register kRegisteredSilu{v12_version(true)};
const Register kRegisteredSum{[] {
  Version v = grouped_sum_version(
      "v12_grouped_wgmma", "v12's GEMM; the epilogue weights each row and adds it into its token's",
      grouped_v12_sum,
      {{"grouped_v12_kernel*EpiE2E", {"sm_90a"}, {"HGMMA", "UTMALDG", "REDG"}, {"HMMA"}, true,
        "the weighted rows reach the tokens' FP32 rows by vector atomics (RED), nothing spilled"}});
  v.min_arch = 90;
  v.kernels_per_launch = 2;  // the GEMM and chapter 01's cast (the memset is no kernel)
  return v;
}()};

}  // namespace
}  // namespace lkw::moe
