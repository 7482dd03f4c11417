// v12_grouped_wgmma — v7 on Hopper's warpgroup tensor core: the expert's weights by TMA, the
// gathered x rows by cp.async, wgmma reading both from shared memory.
//
// Since v7: at prefill v7's mma.sync from a cp.async ring reaches about a third of the BF16 peak
// (chapter 07's v5 → v6 story). v12 is chapter 07's v6 pipeline with BF16 weights: a warpgroup
// multiplies 64 output channels (wgmma's M) by the tile's BT gathered rows (its N: 16, 32 or 64,
// experts.cuh's row_tiles_for), both operands K-major in the 128-byte swizzle, read by the tensor
// core through descriptors: no ldmatrix, no fragments in registers. The weights, contiguous rows
// of w seen as [E·N, K], are one TMA box a stage (256 rows × 64 k, zeros past the tensor), counted
// on the slot's mbarrier. x's rows are not contiguous (a gather through sorted_token_ids), which a
// Hopper TMA cannot do: every thread copies at most one 16-byte piece with cp.async, to where the
// swizzle puts it; those writes come through the generic proxy, so each thread fences them to
// the async proxy before the block barrier that starts the stage's wgmmas.
// Expect: prefill near chapter 07's v6 rate (most of cuBLAS's); decode as v7 (few rows, small N).
// SASS: HGMMA, UTMALDG, LDGSTS, no HMMA, no local memory.
#include "experts.cuh"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"

namespace lkw::moe {
namespace {

constexpr int kGroups = 4;  // warpgroups, 64 output channels each
constexpr int kThreads = kGroups * 128;
constexpr int kBlockN = kGroups * 64;
constexpr int kBlockK = 64;  // k per stage: one 128-byte row of the swizzle
constexpr int kKSteps = kBlockK / 16;
constexpr int kStages = 4;
constexpr int kWBytes = kBlockN * kBlockK * 2;  // the weights' box: 256 rows of 128 bytes
constexpr int kOutRow = kBlockN + 8;            // out tile row in shared memory, padded

template <int kBT>
struct Tile {
  static constexpr int kXBytes = kBT * kBlockK * 2;  // kBT rows of 128 bytes: 8-row atoms
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static_assert(kXBytes % 1024 == 0 && kWBytes % 1024 == 0, "swizzle atoms 1024-aligned");
  static_assert(kBT * 8 <= kThreads, "x: one 16-byte piece per thread at most");
  static_assert(kBT * kOutRow * 2 <= kRingBytes, "the out tile reuses the ring");
};

template <int kBT>
__global__ void __launch_bounds__(kThreads)
    grouped_v12_kernel(const __grid_constant__ CUtensorMap w_map, const __nv_bfloat16* __restrict__ x,
                       const int32_t* __restrict__ sorted_ids,
                       const int32_t* __restrict__ expert_ids, __nv_bfloat16* __restrict__ out,
                       int slots, int64_t n, int64_t k, int num_experts, Divisor topk,
                       Divisor block_m) {
  using T = Tile<kBT>;
  extern __shared__ unsigned char smem_raw[];
  // The swizzle atoms must be 1024-aligned in the shared window (chapter 07's v6).
  unsigned char* const smem =
      smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ int slot_sh[kBT], token_sh[kBT];
  __shared__ uint64_t full_sh[kStages];  // a slot's weights landed (one arrival and the bytes)
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kBT;
  const int64_t n0 = int64_t(blockIdx.y) * kBlockN;

  // Stage rows (v7's): which expert, which slots, which tokens.
  const int expert = expert_ids[divide(row0, block_m)];  // (rows / BLOCK_M)
  if (expert < 0 || expert >= num_experts) return;
  int slot = -1;
  if (threadIdx.x < kBT) {
    slot = sorted_ids[row0 + threadIdx.x];  // (rows)
    slot = slot >= 0 && slot < slots ? slot : -1;
    slot_sh[threadIdx.x] = slot;
    token_sh[threadIdx.x] = slot >= 0 ? divide(slot, topk) : -1;
  }
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(&full_sh[s], 1);
  if (!__syncthreads_or(slot >= 0)) return;

  const int k_tiles = int((k + kBlockK - 1) / kBlockK);
  const int w_row = int(int64_t(expert) * n + n0);  // channel n0 of the expert in w as [E·N, K]
  auto w_stage = [&](int s) { return smem + s * T::kStageBytes; };
  auto x_stage = [&](int s) { return w_stage(s) + kWBytes; };
  // Load stage kt into slot kt % kStages: the weights' box by TMA (thread 0), and piece c of
  // gathered row r at chunk c ^ (r % 8) of the row (the 128-byte swizzle), zeros for a sentinel
  // row or past K. Every thread commits a group, empty or not: the wait count stays uniform.
  auto load_stage = [&](int kt) {
    if (kt < k_tiles) {
      const int s = kt % kStages;
      if (threadIdx.x == 0) {
        ptx::mbarrier_arrive_expect_tx(&full_sh[s], kWBytes);
        ptx::tma_load_2d(w_stage(s), &w_map, kt * kBlockK, w_row, &full_sh[s]);
      }
      // BEGIN SOLUTION: thread r·8 + c copies row r's 16-byte piece c (k = 64·kt + 8c..) of x's
      //   row token_sh[r] to byte 128·r + 16·(c ^ (r % 8)) of the stage's x tile
      if (threadIdx.x < kBT * 8) {
        const int r = threadIdx.x / 8, c = threadIdx.x % 8;
        const int token = token_sh[r];
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
  for (int s = 0; s < kStages - 1; ++s) load_stage(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    // Wait: this thread's x pieces of stage kt, handed to the async proxy; the barrier then covers
    // every thread's, and every warpgroup is past stage kt − 1, whose slot is refilled next.
    ptx::cp_async_wait<kStages - 2>();
    ptx::fence_proxy_async_shared();
    __syncthreads();
    load_stage(kt + kStages - 1);
    ptx::mbarrier_wait(&full_sh[kt % kStages], (kt / kStages) & 1);
    // Compute: warpgroup `group` takes rows 64·group.. of the weights' box (its 64 channels);
    // k-step ks is 32 bytes further along both tiles' rows (2 in the descriptors' 16-byte units).
    const uint64_t desc_w = ptx::wgmma_desc_k_major_sw128(w_stage(kt % kStages) + group * 64 * 128);
    const uint64_t desc_x = ptx::wgmma_desc_k_major_sw128(x_stage(kt % kStages));
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) ptx::wgmma_bf16_ss<kBT>(acc, desc_w + 2 * ks, desc_x + 2 * ks);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();  // the slot is read when the next stage's barrier lets it be refilled
  }
  ptx::wgmma_fence_operands(acc);
  ptx::cp_async_wait<0>();
  __syncthreads();  // every stage is consumed: the ring becomes the out tile

  // Store: accumulator j is channel 64·group + 16·warp + g (+ 8 for j % 4 ≥ 2) of row
  // 8·(j / 4) + 2t (+ 1 for odd j); through shared memory [row][channel], then each live row to
  // its slot's row of out, 16 bytes at a time (N is a multiple of 8: a piece is in or out).
  __nv_bfloat16* const out_sh = reinterpret_cast<__nv_bfloat16*>(smem);
#pragma unroll
  for (int j = 0; j < kBT / 2; ++j) {
    const int row = 8 * (j / 4) + 2 * t + j % 2,
              channel = group * 64 + 16 * warp + g + 8 * ((j / 2) % 2);
    out_sh[row * kOutRow + channel] = __float2bfloat16_rn(acc[j]);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < kBT * (kBlockN / 8); c += kThreads) {
    const int row = c / (kBlockN / 8), col = 8 * (c % (kBlockN / 8));
    const int s = slot_sh[row];
    if (s >= 0 && n0 + col < n)
      *reinterpret_cast<uint4*>(out + int64_t(s) * n + n0 + col) =  // (T·topk, N)
          *reinterpret_cast<const uint4*>(out_sh + row * kOutRow + col);
  }
}

template <int kBT>
Status launch(const GroupedArgs& a, cudaStream_t stream) {
  CUtensorMap w_map;
  Status s = tensor_map_bf16_sw128(&w_map, a.w, int64_t(a.num_experts) * a.n, a.k, kBlockN);
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.rows / kBT), unsigned(ceil_div(a.n, kBlockN)));
  return launch_with_smem(grouped_v12_kernel<kBT>, grid, kThreads, Tile<kBT>::kRingBytes + 1024,
                          stream, kGroupedOp, w_map, a.x, a.sorted_ids, a.expert_ids, a.out,
                          int(a.t * a.topk), a.n, a.k, a.num_experts, divisor_of(a.topk),
                          divisor_of(a.block_m));
}

Status grouped_v12(const GroupedArgs& a, cudaStream_t stream) {
  Status s = validate_grouped(a);
  if (s.ok())
    s = Check()
            .that(int64_t(a.num_experts) * a.n < (int64_t(1) << 31),
                  "E·N must be below 2^31 (TMA row coordinates)")
            .that(a.topk <= (1 << 20) && a.block_m <= (1 << 20), "topk and block_m within a Divisor's range")
            .arch_at_least(90)  // wgmma: sm_90a
            .status();
  if (!s.ok()) return s;
  switch (row_tiles_for(a)) {
    case 1: return launch<16>(a, stream);
    case 2: return launch<32>(a, stream);
    default: return launch<64>(a, stream);
  }
}

Version v12_version() {
  Version v = grouped_version(
      false, "v12_grouped_wgmma", "wgmma from shared memory: weights by TMA, gathered x by cp.async",
      grouped_v12,
      {{"grouped_v12_kernel",
        {"sm_90a"},
        {"HGMMA", "UTMALDG", "LDGSTS"},
        {"HMMA", "I2F"},
        true,
        "TMA weights and gathered x feed HGMMA from shared memory; no mma.sync, nothing spilled"}});
  v.min_arch = 90;
  return v;
}
const Register kRegistered{v12_version()};

}  // namespace
}  // namespace lkw::moe
