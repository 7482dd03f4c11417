// v14_grouped_w4a16_gemv — the INT4 experts at decode as a GEMV (chapter 07's v7): no tensor cores.
//
// Since v10: at decode an expert holds a row or two of a 16-row mma tile, so v10's tensor cores
// multiply sentinel rows, and each 64-k stage waits on cp.async, an unpack and a barrier: far below
// the copy ceiling (the book has the figures). Chapter 07's v7 answers the same problem for a dense
// GEMM: stream the repacked words through the lop3 unpack into FP32 FMAs (gemv.cuh). v14 runs its
// loop on one expert: a block takes one align block and 64 channels, lists the block's live rows
// first (any order: each row is its own sum) and passes over the expert's words with kRows of them
// at a time (1, 2 or 4, from the rows an expert averages); the row's token is its slot / topk, its
// output row the slot.
// Expect: decode near the copy ceiling on the routed experts' words; from a few rows an expert on,
// v10. SASS: LDG.E.EF.128, LOP3, FFMA, no HMMA, no local memory.
#include "07_w4a16_gemm/gemv.cuh"
#include "experts_w4a16.cuh"

namespace lkw::moe {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
namespace gemv = w4a16::gemv;

template <int kRows>
__global__ void __launch_bounds__(kThreads)
    grouped_v14_kernel(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ w,
                       const __nv_bfloat16* __restrict__ scales,
                       const int32_t* __restrict__ sorted_ids,
                       const int32_t* __restrict__ expert_ids, __nv_bfloat16* __restrict__ out,
                       int slots, int64_t n, int64_t k, int groups, int group_shift,
                       int num_experts, Divisor topk, int block_m) {
  __shared__ int list_sh[kMaxBlockM];  // the align block's live slots, in any order
  __shared__ int count_sh;
  __shared__ float red_sh[kWarps][kRows][64];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, r = lane / 4, c = lane % 4;
  const int expert = expert_ids[blockIdx.x];  // (rows / BLOCK_M)
  if (expert < 0 || expert >= num_experts) return;
  const int nb = blockIdx.y;  // 64-channel block

  // Stage rows: the live slots of the align block (sentinels and bad ids skipped).
  if (threadIdx.x == 0) count_sh = 0;
  __syncthreads();
  // BEGIN SOLUTION: each valid slot of the block's BLOCK_M rows to list_sh, at a position taken
  //   with a shared atomicAdd on count_sh (the order does not matter: each row is its own sum)
  for (int i = threadIdx.x; i < block_m; i += kThreads) {
    const int s = sorted_ids[int64_t(blockIdx.x) * block_m + i];  // (rows)
    if (s >= 0 && s < slots) list_sh[atomicAdd(&count_sh, 1)] = s;
  }
  // END SOLUTION
  __syncthreads();
  const int count = count_sh;

  // This warp's share of the 16-k steps (chapter 07's v7), of expert e's 64-channel row nb.
  const int steps = int(k / 16);
  const int begin = steps * warp / kWarps, end = steps * (warp + 1) / kWarps;
  const uint32_t* words = w + (int64_t(expert) * (n / 64) + nb) * (8 * k) + 4 * lane;  // (E, N/64, 8K)
  const __nv_bfloat16* s_e = scales + int64_t(expert) * groups * n + 64 * nb;          // (E, K/G, N)

  for (int chunk = 0; chunk < count; chunk += kRows) {
    // Load and compute: this pass's rows (tokens of the listed slots) against the warp's share.
    const __nv_bfloat16* xr[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      xr[i] = chunk + i < count ? x + int64_t(divide(list_sh[chunk + i], topk)) * k : nullptr;  // (T, K)
    float acc[kRows][gemv::kChannels] = {};
    gemv::accumulate<kRows>(words, s_e, n, xr, c, r, begin, end, group_shift, acc);

    // Reduce: lanes by shuffles, warps in shared memory in order.
    gemv::reduce_lanes<kRows>(acc, r, c, red_sh[warp]);
    __syncthreads();
    // Store: each listed row's 64 channels at its slot, a thread each.
    gemv::store_rows<kRows, kWarps>(red_sh, count - chunk, [&](int i) {
      return out + int64_t(list_sh[chunk + i]) * n + 64 * nb;  // (T·topk, N)
    });
    __syncthreads();  // red_sh is the next pass's
  }
}

template <int kRows>
Status launch(const GroupedW4a16Args& a, cudaStream_t stream) {
  const dim3 grid(unsigned(a.rows / a.block_m), unsigned(a.n / 64));
  grouped_v14_kernel<kRows><<<grid, kThreads, 0, stream>>>(
      a.x, a.w, a.scales, a.sorted_ids, a.expert_ids, a.out, int(a.t * a.topk), a.n, a.k,
      int(a.k / a.group), w4a16::group_shift_of(a.group, a.k), a.num_experts, divisor_of(a.topk),
      a.block_m);
  return last_launch_status(kGroupedW4a16Op);
}

// Rows a pass carries: the rows an expert averages (T·topk / E), 1, 2 or 4.
Status grouped_v14_w4a16(const GroupedW4a16Args& a, cudaStream_t stream) {
  Status s = validate_grouped_w4a16(a);
  if (s.ok())
    s = Check()
            .that(a.n / 64 <= 65535, "N must be at most 65535·64 (the grid's y)")
            .that(a.topk <= (1 << 20) && a.k / 16 < (1 << 27),
                  "topk within a Divisor's range and K/16 below 2^27 (the steps' int math)")
            .status();
  if (!s.ok()) return s;
  const int64_t per_expert = ceil_div(a.t * a.topk, a.num_experts);
  if (per_expert <= 1) return launch<1>(a, stream);
  if (per_expert <= 2) return launch<2>(a, stream);
  return launch<4>(a, stream);
}

const Register kRegistered{grouped_w4a16_version(
    "v14_grouped_w4a16_gemv", "decode as chapter 07's v7 GEMV, one expert's words a block",
    grouped_v14_w4a16,
    {{"grouped_v14_kernel",
      {},
      {"LDG.E.EF.128", "LOP3", "FFMA"},
      {"HMMA", "I2F"},
      true,
      "streamed 16-byte pieces of words, lop3 unpack, FMAs on the CUDA cores, nothing spilled"}})};

}  // namespace
}  // namespace lkw::moe
