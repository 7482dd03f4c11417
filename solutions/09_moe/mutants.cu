// Mutants of chapter 09, each a plausible slip in v2's counting sort that the golden cases must
// catch (moe_align_block_size/mutant_*):
//   mutant_pad_off_by_one   runs padded with (count + BLOCK_M) / BLOCK_M blocks: a whole extra
//                           block for every count that is already a multiple (0 included)
//   mutant_lost_increment   lane 0 of every warp loses its histogram increment, as a plain shared
//                           read-modify-write that lost a race would, but deterministically (so
//                           racecheck stays quiet): runs come out short, and their last slots
//                           land on padding rows or on a neighbour's. (A single lost increment
//                           mostly hides in the padding: the run keeps its block count.)
//   mutant_scan_skips_last  the scan adds up the padded counts of experts 0..E−2 only: the total
//                           misses the last expert's run, which the tail padding then overwrites
//   mutant_sentinel_zero    padding written as 0 (a real slot index) instead of T·k
// Every mutant writes only rows inside the capacity: a slip must show in the values, not as an
// out-of-bounds write.
// And of the expert half:
//   mutant_wrong_expert     moe_grouped_gemm with each block's expert id e read as (e + 1) % E
//                           (v7 run on a remapped copy of expert_ids): the weights of a neighbour
//   mutant_weights_reversed moe_sum applying weight k − 1 − j to row j
//   mutant_next_group_scale moe_grouped_gemm_w4a16 with the scales of group (g + 1) mod K/G
//                           for group g (v10 run on a rotated copy of the scales): a scale row
//                           indexed one group off. With one group (G = K) it changes nothing.
//   mutant_next_k_block_scale  moe_grouped_gemm_fp8 with the weight block scale of K block
//                           (kb + 1) mod K/128 for block kb (v15 run on a rotated copy of
//                           w_scales): the block scale of the wrong K block. With K = 128 it
//                           changes nothing.
#include "align.cuh"
#include "experts_fp8.cuh"
#include "experts_w4a16.cuh"

namespace lkw::moe {
namespace {

enum class Slip { kPadOffByOne, kLostIncrement, kScanSkipsLast, kSentinelZero };

constexpr int kThreads = 1024;

template <Slip kSlip>
__global__ void __launch_bounds__(kThreads)
    align_mutant_kernel(const int32_t* __restrict__ topk_ids, int32_t* __restrict__ sorted_ids,
                        int32_t* __restrict__ expert_ids, int32_t* __restrict__ num_post, int slots,
                        int num_experts, int block_m, int capacity) {
  __shared__ int cursor_sh[kMaxExperts];
  __shared__ int offset_sh[kMaxExperts + 1];
  __shared__ int bad_sh;
  const int e = threadIdx.x;
  if (e < num_experts) cursor_sh[e] = 0;
  if (e == 0) bad_sh = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < slots; i += kThreads) {
    const int32_t id = topk_ids[i];
    const bool lost = kSlip == Slip::kLostIncrement && i % 32 == 0;
    if (valid_id(id, num_experts) && !lost)
      atomicAdd(&cursor_sh[id], 1);
    else if (!masked_id(id) && !lost)
      bad_sh = 1;
  }
  __syncthreads();
  const int count = e < num_experts ? cursor_sh[e] : 0;
  int rows = padded(count, block_m);
  if (kSlip == Slip::kPadOffByOne) rows = (count + block_m) / block_m * block_m;
  if (kSlip == Slip::kScanSkipsLast && e == num_experts - 1) rows = 0;
  int total = 0;
  const int start = block_exclusive_scan<kThreads>(rows, &total);
  if (e < num_experts) offset_sh[e] = cursor_sh[e] = start;
  if (e == 0) offset_sh[num_experts] = min(total, capacity);
  __syncthreads();
  total = offset_sh[num_experts];
  for (int i = threadIdx.x; i < slots; i += kThreads) {
    const int32_t id = topk_ids[i];
    if (!valid_id(id, num_experts)) continue;
    const int row = atomicAdd(&cursor_sh[id], 1);
    if (row < capacity) sorted_ids[row] = i;
  }
  __syncthreads();
  const int sentinel = kSlip == Slip::kSentinelZero ? 0 : slots;
  const int lane_idx = threadIdx.x % 32, warp_idx = threadIdx.x / 32;
  for (int x = warp_idx; x < num_experts; x += kThreads / 32)
    for (int row = cursor_sh[x] + lane_idx; row < min(offset_sh[x + 1], capacity); row += 32)
      sorted_ids[row] = sentinel;
  for (int row = total + threadIdx.x; row < capacity; row += kThreads) sorted_ids[row] = sentinel;
  for (int b = threadIdx.x; b < capacity / block_m; b += kThreads)
    expert_ids[b] = expert_of_row(offset_sh, num_experts, b * block_m);
  if (threadIdx.x == 0) *num_post = bad_sh ? -1 : total;
}

template <Slip kSlip>
Status align_mutant(const AlignArgs& a, cudaStream_t stream) {
  Status s = validate_align(a);
  if (!s.ok()) return s;
  align_mutant_kernel<kSlip><<<1, kThreads, 0, stream>>>(a.topk_ids, a.sorted_ids, a.expert_ids,
                                                         a.num_post, int(a.slots), a.num_experts,
                                                         a.block_m, int(a.capacity));
  return finish_align(a, stream, "align mutant");
}

const Register kPadOffByOne{align_version("mutant_pad_off_by_one",
                                          "(count + BLOCK_M) / BLOCK_M blocks per run",
                                          align_mutant<Slip::kPadOffByOne>, {}, Kind::kMutant)};
const Register kLostIncrement{align_version("mutant_lost_increment",
                                            "lane 0 of each warp loses its histogram increment",
                                            align_mutant<Slip::kLostIncrement>, {}, Kind::kMutant)};
const Register kScanSkipsLast{align_version("mutant_scan_skips_last",
                                            "the scan leaves out the last expert",
                                            align_mutant<Slip::kScanSkipsLast>, {}, Kind::kMutant)};
const Register kSentinelZero{align_version("mutant_sentinel_zero", "padding written as 0",
                                           align_mutant<Slip::kSentinelZero>, {}, Kind::kMutant)};

// ---- the expert half

__global__ void next_expert_kernel(const int32_t* __restrict__ expert_ids,
                                   int32_t* __restrict__ out, int64_t blocks, int num_experts) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b < blocks) {
    const int32_t e = expert_ids[b];
    out[b] = e >= 0 && e < num_experts ? (e + 1) % num_experts : e;
  }
}

Status grouped_wrong_expert(const GroupedArgs& a, cudaStream_t stream) {
  Status s = validate_grouped(a);
  if (!s.ok()) return s;
  const int64_t blocks = a.rows / a.block_m;
  void* remapped = nullptr;
  s = align_workspace(4 * blocks, &remapped);
  if (!s.ok()) return s;
  next_expert_kernel<<<unsigned(ceil_div(blocks, 256)), 256, 0, stream>>>(
      a.expert_ids, static_cast<int32_t*>(remapped), blocks, a.num_experts);
  s = last_launch_status("mutant_wrong_expert");
  if (!s.ok()) return s;
  const Version* v7 = nullptr;
  s = Registry::get().require(std::string(kChapter) + "/" + kGroupedOp + "/v7_grouped_mma",
                              "mutant_wrong_expert", &v7);
  if (!s.ok()) return s;
  Args args;
  args.inputs = {{const_cast<__nv_bfloat16*>(a.x), DType::kBF16, {a.t, a.k}},
                 {const_cast<__nv_bfloat16*>(a.w), DType::kBF16, {a.num_experts, a.n, a.k}},
                 {const_cast<int32_t*>(a.sorted_ids), DType::kI32, {a.rows}},
                 {remapped, DType::kI32, {blocks}}};
  args.outputs = {{a.out, DType::kBF16, {a.t * a.topk, a.n}}};
  args.params = {{"topk", double(a.topk)}, {"block_m", double(a.block_m)}};
  return v7->launch(args, stream);
}

__global__ void sum_reversed_kernel(const __nv_bfloat16* __restrict__ y,
                                    const float* __restrict__ weights,
                                    __nv_bfloat16* __restrict__ out, int64_t t, int64_t d, int k) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // one output element
  if (i >= t * d) return;
  const int64_t token = i / d, c = i % d;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j)
    acc = fmaf(weights[token * k + (k - 1 - j)], __bfloat162float(y[(token * k + j) * d + c]), acc);
  out[i] = __float2bfloat16_rn(acc);
}

Status sum_weights_reversed(const SumArgs& a, cudaStream_t stream) {
  Status s = validate_sum(a);
  if (!s.ok()) return s;
  sum_reversed_kernel<<<unsigned(ceil_div(a.t * a.d, 256)), 256, 0, stream>>>(a.y, a.weights, a.out,
                                                                             a.t, a.d, a.k);
  return last_launch_status("mutant_weights_reversed");
}

__global__ void next_group_kernel(const __nv_bfloat16* __restrict__ scales,
                                  __nv_bfloat16* __restrict__ out, int64_t rows, int64_t groups,
                                  int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // one scale of [E·K/G, N]
  if (i >= rows * n) return;
  const int64_t row = i / n, g = row % groups;
  out[i] = scales[(row - g + (g + 1) % groups) * n + i % n];
}

Status grouped_w4a16_next_group(const GroupedW4a16Args& a, cudaStream_t stream) {
  Status s = validate_grouped_w4a16(a);
  if (!s.ok()) return s;
  const int64_t groups = a.k / a.group, rows = a.num_experts * groups;
  void* rotated = nullptr;
  s = align_workspace(2 * rows * a.n, &rotated);
  if (!s.ok()) return s;
  next_group_kernel<<<unsigned(ceil_div(rows * a.n, 256)), 256, 0, stream>>>(
      a.scales, static_cast<__nv_bfloat16*>(rotated), rows, groups, a.n);
  s = last_launch_status("mutant_next_group_scale");
  if (!s.ok()) return s;
  const Version* v10 = nullptr;
  s = Registry::get().require(std::string(kChapter) + "/" + kGroupedW4a16Op + "/v10_grouped_w4a16",
                              "mutant_next_group_scale", &v10);
  if (!s.ok()) return s;
  Args args;
  args.inputs = {
      {const_cast<__nv_bfloat16*>(a.x), DType::kBF16, {a.t, a.k}},
      {const_cast<uint32_t*>(a.w), DType::kU32, {a.num_experts, a.n / kRepackN, 8 * a.k}},
      {rotated, DType::kBF16, {a.num_experts, groups, a.n}},
      {const_cast<int32_t*>(a.sorted_ids), DType::kI32, {a.rows}},
      {const_cast<int32_t*>(a.expert_ids), DType::kI32, {a.rows / a.block_m}}};
  args.outputs = {{a.out, DType::kBF16, {a.t * a.topk, a.n}}};
  args.params = {{"topk", double(a.topk)}, {"block_m", double(a.block_m)}};
  return v10->launch(args, stream);
}

__global__ void next_k_block_kernel(const float* __restrict__ scales, float* __restrict__ out,
                                    int64_t count, int64_t blocks) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // one scale of [E·NB, KB]
  if (i >= count) return;
  const int64_t kb = i % blocks;
  out[i] = scales[i - kb + (kb + 1) % blocks];
}

Status grouped_fp8_next_k_block(const GroupedFp8Args& a, cudaStream_t stream) {
  Status s = validate_grouped_fp8(a);
  if (!s.ok()) return s;
  const int64_t kb = a.k / kFp8Block, nb = fp8_n_blocks(a.n), count = a.num_experts * nb * kb;
  void* rotated = nullptr;
  s = align_workspace(4 * count, &rotated);
  if (!s.ok()) return s;
  next_k_block_kernel<<<unsigned(ceil_div(count, 256)), 256, 0, stream>>>(
      a.w_scales, static_cast<float*>(rotated), count, kb);
  s = last_launch_status("mutant_next_k_block_scale");
  if (!s.ok()) return s;
  const Version* v15 = nullptr;
  s = Registry::get().require(std::string(kChapter) + "/" + kGroupedFp8Op + "/v15_grouped_fp8",
                              "mutant_next_k_block_scale", &v15);
  if (!s.ok()) return s;
  Args args;
  args.inputs = {{const_cast<uint8_t*>(a.x), DType::kE4M3, {a.t, a.k}},
                 {const_cast<uint8_t*>(a.w), DType::kE4M3, {a.num_experts, a.n, a.k}},
                 {const_cast<float*>(a.x_scales), DType::kF32, {kb, a.t}},
                 {rotated, DType::kF32, {a.num_experts, nb, kb}},
                 {const_cast<int32_t*>(a.sorted_ids), DType::kI32, {a.rows}},
                 {const_cast<int32_t*>(a.expert_ids), DType::kI32, {a.rows / a.block_m}}};
  args.outputs = {{a.out, DType::kBF16, {a.t * a.topk, a.n}}};
  args.params = {{"topk", double(a.topk)}, {"block_m", double(a.block_m)}};
  return v15->launch(args, stream);
}

const Register kWrongExpert{grouped_version(false, "mutant_wrong_expert",
                                            "each block multiplies by the next expert's weights",
                                            grouped_wrong_expert, {}, Kind::kMutant)};
const Register kNextGroupScale{grouped_w4a16_version("mutant_next_group_scale",
                                                     "group g multiplied by group g + 1's scale",
                                                     grouped_w4a16_next_group, {}, Kind::kMutant)};
const Register kWeightsReversed{sum_version("mutant_weights_reversed",
                                            "weight k − 1 − j applied to row j",
                                            sum_weights_reversed, {}, Kind::kMutant)};

const Register kNextKBlockScale{grouped_fp8_version(
    Fp8Epilogue::kStore, "mutant_next_k_block_scale",
    "K block kb multiplied by block kb + 1's weight scale", grouped_fp8_next_k_block, {},
    Kind::kMutant)};

}  // namespace
}  // namespace lkw::moe
