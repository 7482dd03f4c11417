// v15_grouped_fp8 — v12 with FP8 experts: E4M3 x and w, chapter 08's blockwise scales promoted.
//
// Since v12: the three grouped ops take W8A8 operands (experts_fp8.cuh) as DeepSeek-V3 ships its
// experts: x with 1 × 128 scales per row, w with 128 × 128 block scales. A 128-byte swizzled row
// is 128 FP8 k, one scale block, so a stage is one K block: the four wgmma k32 steps (the e4m3
// form, M = 64 weight rows, N = the 16, 32 or 64 gathered rows) start a fresh sum, and once they
// retire each thread adds sum × x_scale(row) · w_scale(channel, block) into a second FP32
// accumulator (chapter 08's v4 promotion). That wait ends the stage, so every warpgroup is done
// with its slot at the next barrier and the loads run one stage behind the ring's end, not two.
// x's scales ride the stage's cp.async group (4 bytes a row); a thread's two weight rows' scales
// are loaded before the stage's barrier is awaited. Epilogues are v12's (store, SiLU-and-mul,
// weighted FP32 atomics) on the promoted sums. Expect: half v12's bytes per weight, so decode
// near the copy ceiling at half v12's time, prefill on the FP8 tensor core; SASS QGMMA, no HGMMA.
// Run: ctest -R 09_moe, or tools/bench.py --chapter 09_moe (moe_grouped_gemm*_fp8 rows).
#include "experts_fp8.cuh"
#include "lkw/ptx.cuh"
#include "lkw/tma.h"
#include "lkw/workspace.h"

namespace lkw::moe {
namespace {

constexpr int kGroups = 4;  // warpgroups, 64 weight rows each
constexpr int kThreads = kGroups * 128;
constexpr int kBoxRows = kGroups * 64;  // weight rows a stage
constexpr int kBlockK = kFp8Block;      // k per stage: one 128-byte swizzle row, one scale block
constexpr int kKSteps = kBlockK / 32;   // wgmma k32 steps
constexpr int kStages = 5;
constexpr int kAhead = kStages - 1;  // stages loaded ahead: a stage is retired before its barrier
constexpr int kWBytes = kBoxRows * kBlockK;  // 256 rows of 128 bytes

using Epi = Fp8Epilogue;

template <Epi kEpi>
constexpr int out_channels() { return kEpi == Epi::kSilu ? kBoxRows / 2 : kBoxRows; }

template <int kBT, Epi kEpi>
struct Tile {
  static constexpr int kXBytes = kBT * kBlockK;  // kBT rows of 128 bytes: 8-row atoms
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kOutRow = out_channels<kEpi>() + 8;  // out tile row, padded
  static constexpr int kOutBytes = kBT * kOutRow * (kEpi == Epi::kSum ? 4 : 2);  // FP32 for sum
  static constexpr int kUpBytes = kEpi == Epi::kSilu ? kBT / 2 * 256 * 4 : 0;  // the up sums
  static_assert(kXBytes % 1024 == 0 && kWBytes % 1024 == 0, "swizzle atoms 1024-aligned");
  static_assert(kBT * 8 <= kThreads, "x: one 16-byte piece per thread at most");
  static_assert(kOutBytes + kUpBytes <= kRingBytes, "the epilogue's tiles reuse the ring");
};

// The expert row that row r of a stage's weight box is (gate_up: rows 0..127 the gate rows c0..,
// rows 128..255 the up rows N/2 + c0 .. of the same channels, v12's pairing).
template <Epi kEpi>
__device__ __forceinline__ int64_t expert_row(int r, int64_t n0, int64_t n) {
  if constexpr (kEpi == Epi::kSilu)
    return r < kBoxRows / 2 ? n0 + r : n / 2 + n0 + r - kBoxRows / 2;
  return n0 + r;
}

template <int kBT, Epi kEpi>
__global__ void __launch_bounds__(kThreads)
    grouped_v15_kernel(const __grid_constant__ CUtensorMap w_map, const GroupedFp8Args a,
                       float* __restrict__ acc32, Divisor topk, Divisor block_m) {
  using T = Tile<kBT, kEpi>;
  constexpr bool kSilu = kEpi == Epi::kSilu, kSum = kEpi == Epi::kSum;
  constexpr int kOutN = out_channels<kEpi>();
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem =
      smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  __shared__ int slot_sh[kBT], token_sh[kBT];  // sum: x's row is the slot, out's the token
  __shared__ float weight_sh[kSum ? kBT : 1];
  __shared__ float x_scale_sh[kStages][kBT];  // each stage's x scales, zero for a sentinel row
  __shared__ uint64_t full_sh[kStages];
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, group = threadIdx.x / 128;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kBT;
  const int slots = int(a.t * a.topk);
  const int64_t n = a.n, n0 = int64_t(blockIdx.y) * kOutN, n_out = kSilu ? n / 2 : n;
  const int64_t x_rows = kSum ? slots : a.t;

  // Stage rows (v12's): which expert, which slots, which tokens.
  const int expert = a.expert_ids[divide(row0, block_m)];  // (rows / BLOCK_M)
  if (expert < 0 || expert >= a.num_experts) return;
  int slot = -1;
  if (threadIdx.x < kBT) {
    slot = a.sorted_ids[row0 + threadIdx.x];  // (rows)
    slot = slot >= 0 && slot < slots ? slot : -1;
    slot_sh[threadIdx.x] = slot;
    token_sh[threadIdx.x] = slot >= 0 ? divide(slot, topk) : -1;
    if constexpr (kSum) weight_sh[threadIdx.x] = slot >= 0 ? a.weights[slot] : 0.f;  // (T·topk)
  }
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(&full_sh[s], 1);
  if (!__syncthreads_or(slot >= 0)) return;

  const int k_tiles = int(a.k / kBlockK);
  const int w_row = int(int64_t(expert) * n + n0);  // channel n0 of the expert in w as [E·N, K]
  auto w_stage = [&](int s) { return smem + s * T::kStageBytes; };
  auto x_stage = [&](int s) { return w_stage(s) + kWBytes; };
  // Load K block kt into slot kt % kStages: v12's weight boxes and swizzled x gather (a row is
  // 128 bytes of k here too), and each gathered row's x scale of block kt (4 bytes, zero-filled
  // for a sentinel row). Every thread commits a group, empty or not.
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
      if (threadIdx.x < kBT * 8) {
        const int r = threadIdx.x / 8, c = threadIdx.x % 8;
        const int row = kSum ? slot_sh[r] : token_sh[r];  // x's row
        ptx::cp_async_16(x_stage(s) + r * 128 + 16 * (c ^ (r % 8)),
                         row >= 0 ? a.x + int64_t(row) * a.k + kt * kBlockK + 16 * c : a.x,
                         row >= 0);  // (rows of x, K)
        // BEGIN SOLUTION: thread c == 0 of row r copies x_scales[kt][row] (4 bytes, none for a
        //   sentinel row: zero-filled) to x_scale_sh[s][r]
        if (c == 0)
          ptx::cp_async_4(&x_scale_sh[s][r],  // (K/128, rows of x)
                          a.x_scales + int64_t(kt) * x_rows + (row >= 0 ? row : 0),
                          row >= 0 ? 4 : 0);
        // END SOLUTION
      }
    }
    ptx::cp_async_commit();
  };

  // The thread's two weight rows (accumulators j with (j / 2) % 2 == 0, then 1): their scale row
  // in w_scales. Rows past N (the box's tail, never stored) read row N − 1's scales.
  const int64_t nb = fp8_n_blocks(n), kb_count = a.k / kBlockK;
  const float* w_scale_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = expert_row<kEpi>(64 * group + 16 * warp + g + 8 * h, n0, n);
    const int64_t r = row < n ? row : n - 1;
    w_scale_row[h] = a.w_scales + (int64_t(expert) * nb + r / kFp8Block) * kb_count;  // (E, NB, KB)
  }

  float acc[kBT / 2] = {};    // the tensor core's sum of one K block
  float total[kBT / 2] = {};  // the promoted FP32 sum
  ptx::wgmma_fence_operands(acc);
#pragma unroll
  for (int s = 0; s < kAhead; ++s) load_stage(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStages;
    // The weight scales of this block first: their loads fly while the stage is awaited.
    const float w_scale0 = w_scale_row[0][kt], w_scale1 = w_scale_row[1][kt];
    // Wait: this thread's x pieces and scales of block kt, handed to the async proxy; the barrier
    // covers every thread's, and every warpgroup retired block kt − 1 (its wait below), so that
    // block's slot is the one refilled next.
    ptx::cp_async_wait<kAhead - 1>();
    ptx::fence_proxy_async_shared();
    __syncthreads();
    load_stage(kt + kAhead);
    ptx::mbarrier_wait(&full_sh[s], (kt / kStages) & 1);
    // Compute: a fresh sum over the block's four k32 steps (32 bytes apart along both rows).
    const uint64_t desc_w = ptx::wgmma_desc_k_major_sw128(w_stage(s) + group * 64 * 128);
    const uint64_t desc_x = ptx::wgmma_desc_k_major_sw128(x_stage(s));
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
      ptx::wgmma_e4m3_ss<kBT>(acc, desc_w + 2 * ks, desc_x + 2 * ks, ks > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::wgmma_fence_operands(acc);
    // Promote: accumulator j is weight row g + 8·((j / 2) % 2) of the warp's 16 and gathered
    // row 8·(j / 4) + 2t + j % 2 of the tile.
    // BEGIN SOLUTION: total[j] += acc[j] · (x scale of j's row in this stage · w_scale0 or 1)
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j) {
      const float x_scale = x_scale_sh[s][8 * (j / 4) + 2 * t + j % 2];
      total[j] = fmaf(acc[j], x_scale * ((j / 2) % 2 ? w_scale1 : w_scale0), total[j]);
    }
    // END SOLUTION
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // every stage is consumed: the ring becomes the epilogue's tiles

  // Reduce and store: v12's epilogues on the promoted sums.
  __nv_bfloat16* const out_sh = reinterpret_cast<__nv_bfloat16*>(smem);
  float* const sum_sh = reinterpret_cast<float*>(smem);
  auto channel_of = [&](int j) { return 64 * group + 16 * warp + g + 8 * ((j / 2) % 2); };
  auto row_of = [&](int j) { return 8 * (j / 4) + 2 * t + j % 2; };
  if constexpr (kSilu) {
    float* const up_sh = reinterpret_cast<float*>(smem + T::kOutBytes);
    const int p = threadIdx.x % 256;
    if (group >= 2)
#pragma unroll
      for (int j = 0; j < kBT / 2; ++j) up_sh[j * 256 + p] = total[j];
    __syncthreads();
    if (group < 2)
#pragma unroll
      for (int j = 0; j < kBT / 2; ++j) {
        const float gate = total[j], up = up_sh[j * 256 + p];
        out_sh[row_of(j) * T::kOutRow + channel_of(j)] =
            __float2bfloat16_rn(gate * sigmoid(gate) * up);  // one rounding
      }
  } else if constexpr (kSum) {
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j) sum_sh[row_of(j) * T::kOutRow + channel_of(j)] = total[j];
  } else {
#pragma unroll
    for (int j = 0; j < kBT / 2; ++j)
      out_sh[row_of(j) * T::kOutRow + channel_of(j)] = __float2bfloat16_rn(total[j]);
  }
  __syncthreads();
  if constexpr (kSum) {
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
  } else {
    for (int c = threadIdx.x; c < kBT * (kOutN / 8); c += kThreads) {
      const int row = c / (kOutN / 8), col = 8 * (c % (kOutN / 8));
      const int s = slot_sh[row];
      if (s >= 0 && n0 + col < n_out)
        *reinterpret_cast<uint4*>(a.out + int64_t(s) * n_out + n0 + col) =  // (T·topk, N or N/2)
            *reinterpret_cast<const uint4*>(out_sh + row * T::kOutRow + col);
    }
  }
}

template <int kBT, Epi kEpi>
Status launch(const GroupedFp8Args& a, float* acc32, cudaStream_t stream) {
  CUtensorMap w_map;
  Status s = tensor_map_u8_sw128(&w_map, a.w, int64_t(a.num_experts) * a.n, a.k,
                                 kEpi == Epi::kSilu ? kBoxRows / 2 : kBoxRows);
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.rows / kBT), unsigned(ceil_div(fp8_out_n(a), out_channels<kEpi>())));
  return launch_with_smem(grouped_v15_kernel<kBT, kEpi>, grid, kThreads,
                          Tile<kBT, kEpi>::kRingBytes + 1024, stream, fp8_op_name(kEpi), w_map, a,
                          acc32, divisor_of(a.topk), divisor_of(a.block_m));
}

template <Epi kEpi>
Status launch_rows(const GroupedFp8Args& a, float* acc32, cudaStream_t stream) {
  switch (row_tiles_for(a)) {
    case 1: return launch<16, kEpi>(a, acc32, stream);
    case 2: return launch<32, kEpi>(a, acc32, stream);
    default: return launch<64, kEpi>(a, acc32, stream);
  }
}

// The sum: v12's FP32 accumulator (zeroed, added into, rounded by chapter 01's cast).
Status grouped_v15(const GroupedFp8Args& a, cudaStream_t stream) {
  static Workspace accumulator("moe_grouped_gemm_sum_fp8's FP32 accumulator");
  Status s = validate_grouped_fp8(a);
  if (!s.ok()) return s;
  if (a.epilogue == Epi::kStore) return launch_rows<Epi::kStore>(a, nullptr, stream);
  if (a.epilogue == Epi::kSilu) return launch_rows<Epi::kSilu>(a, nullptr, stream);
  const Version* round = nullptr;
  s = Registry::get().require("01_formats/f32_to_bf16/v2_vec16", kGroupedSumFp8Op, &round);
  if (!s.ok()) return s;
  void* acc32 = nullptr;
  const int64_t elems = a.t * a.n;
  s = accumulator.get(4 * elems, &acc32);
  if (!s.ok()) return s;
  if (cudaMemsetAsync(acc32, 0, size_t(4 * elems), stream) != cudaSuccess)
    return last_launch_status(kGroupedSumFp8Op);
  s = launch_rows<Epi::kSum>(a, static_cast<float*>(acc32), stream);
  if (!s.ok()) return s;
  Args rounding;
  rounding.inputs = {{acc32, DType::kF32, {a.t, a.n}}};
  rounding.outputs = {{a.out, DType::kBF16, {a.t, a.n}}};
  s = round->launch(rounding, stream);
  if (!s.ok()) s.message = std::string(kGroupedSumFp8Op) + ", rounding: " + s.message;
  return s;
}

Version v15_version(Epi epi) {
  const char* kernel = epi == Epi::kSilu  ? "grouped_v15_kernel*Fp8EpilogueE1E"
                       : epi == Epi::kSum ? "grouped_v15_kernel*Fp8EpilogueE2E"
                                          : "grouped_v15_kernel*Fp8EpilogueE0E";
  const char* summary = epi == Epi::kSilu
                            ? "v12's gate_up on FP8 experts, blockwise scales promoted"
                        : epi == Epi::kSum
                            ? "v12's down GEMM and weighted sum on FP8 experts, blockwise scales"
                            : "v12 on FP8 experts: e4m3 wgmma, each 128-k block's sum promoted";
  Version v = grouped_fp8_version(
      epi, "v15_grouped_fp8", summary, grouped_v15,
      {{kernel, {"sm_90a"}, {"QGMMA", "UTMALDG", "LDGSTS"}, {"HGMMA", "HMMA"}, true,
        "FP8 wgmma from TMA weights and gathered x; no BF16 tensor-core path, nothing spilled"}});
  if (epi == Epi::kSum) v.kernels_per_launch = 2;  // the GEMM and chapter 01's cast
  return v;
}
const Register kRegistered{v15_version(Epi::kStore)};
const Register kRegisteredSilu{v15_version(Epi::kSilu)};
const Register kRegisteredSum{v15_version(Epi::kSum)};

}  // namespace
}  // namespace lkw::moe
