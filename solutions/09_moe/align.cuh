// Chapter 09 — moe_align_block_size (its contract: moe.cuh): arguments, workspace, registry
// entry and the device helpers of v0–v3 and the mutants.
#pragma once
#include "lkw/workspace.h"
#include "moe.cuh"

namespace lkw::moe {

constexpr const char* kAlignOp = "moe_align_block_size";

// The sorted_token_ids length a caller allocates before the routing is known: every expert
// wastes at most BLOCK_M − 1 rows (lkw.moe.capacity).
inline int64_t align_capacity(int64_t slots, int64_t experts, int64_t block_m) {
  return ceil_div(slots + experts * (block_m - 1), block_m) * block_m;
}



struct AlignArgs {
  const int32_t* topk_ids;  // [T, k], flattened: slot i = t·k + j
  int32_t* sorted_ids;      // [capacity]
  int32_t* expert_ids;      // [capacity / block_m]
  int32_t* num_post;        // [1]
  int64_t slots;            // S = T·k, also the sentinel
  int num_experts, block_m;
  int64_t capacity;
  bool check_ids;
};

using AlignLaunch = Status (*)(const AlignArgs& a, cudaStream_t stream);

inline Status validate_align(const AlignArgs& a) {
  return Check()
      .not_null(a.topk_ids, "topk_ids")
      .not_null(a.sorted_ids, "sorted_token_ids")
      .not_null(a.expert_ids, "expert_ids")
      .not_null(a.num_post, "num_tokens_post_padded")
      .positive(a.slots, "T·k")
      .that(a.num_experts >= 1 && a.num_experts <= kMaxExperts,
            "num_experts must be in 1.." + std::to_string(kMaxExperts) + " (got " +
                std::to_string(a.num_experts) + ")")
      .that(a.block_m >= 1 && a.block_m <= kMaxBlockM, "block_m must be in 1.." +
                                                           std::to_string(kMaxBlockM) + " (got " +
                                                           std::to_string(a.block_m) + ")")
      .that(a.capacity < std::numeric_limits<int32_t>::max(),
            "the capacity must stay below 2^31 (slot indices are int32)")
      .aligned(a.topk_ids, 4, "topk_ids")
      .aligned(a.sorted_ids, 4, "sorted_token_ids")
      .aligned(a.expert_ids, 4, "expert_ids")
      .aligned(a.num_post, 4, "num_tokens_post_padded")
      .disjoint(a.sorted_ids, 4 * a.capacity, a.topk_ids, 4 * a.slots,
                "sorted_token_ids and topk_ids")
      .disjoint(a.expert_ids, 4 * (a.capacity / a.block_m), a.sorted_ids, 4 * a.capacity,
                "expert_ids and sorted_token_ids")
      .disjoint(a.num_post, 4, a.sorted_ids, 4 * a.capacity,
                "num_tokens_post_padded and sorted_token_ids")
      .disjoint(a.num_post, 4, a.expert_ids, 4 * (a.capacity / a.block_m),
                "num_tokens_post_padded and expert_ids")
      .arch_at_least(80)
      .status();
}

// Generic Args → AlignArgs: params num_experts, block_m (and check_ids); the output lengths must
// be the capacity of this routing shape, exactly.
inline Status align_args(const Args& a, AlignArgs* out) {
  Status s = Check()
                 .that(a.inputs.size() == 1 && a.outputs.size() == 3,
                       "moe_align_block_size takes topk_ids and writes sorted_token_ids, "
                       "expert_ids, num_tokens_post_padded")
                 .that(a.params.count("num_experts") == 1 && a.params.count("block_m") == 1,
                       "moe_align_block_size needs the params num_experts and block_m")
                 .status();
  if (!s.ok()) return s;
  const TensorRef &ids = a.inputs[0], &sorted = a.outputs[0], &experts = a.outputs[1],
                  &post = a.outputs[2];
  auto int32_of_rank = [](const TensorRef& t, size_t rank) {
    return t.dtype == DType::kI32 && t.shape.size() == rank;
  };
  s = Check()
          .that(int32_of_rank(ids, 2), "topk_ids is int32 [T, k]")
          .that(int32_of_rank(sorted, 1) && int32_of_rank(experts, 1) && int32_of_rank(post, 1),
                "sorted_token_ids, expert_ids and num_tokens_post_padded are int32 vectors")
          .status();
  if (!s.ok()) return s;
  const double e = a.params.at("num_experts"), m = a.params.at("block_m");
  s = Check()
          .that(e >= 1 && e <= kMaxExperts && e == std::floor(e),
                "num_experts must be an integer in 1..1024")
          .that(m >= 1 && m <= kMaxBlockM && m == std::floor(m),
                "block_m must be an integer in 1..1024")
          .positive(ids.numel(), "T·k")
          .status();
  if (!s.ok()) return s;
  const int64_t slots = ids.numel(), capacity = align_capacity(slots, int64_t(e), int64_t(m));
  s = Check()
          .that(sorted.dim(0) == capacity,
                "sorted_token_ids must hold capacity = " + std::to_string(capacity) +
                    " entries (T·k + E·(block_m − 1), rounded up to block_m), got " +
                    std::to_string(sorted.dim(0)))
          .that(experts.dim(0) == capacity / int64_t(m),
                "expert_ids must hold capacity / block_m = " +
                    std::to_string(capacity / int64_t(m)) + " entries")
          .that(post.dim(0) == 1, "num_tokens_post_padded holds one value")
          .status();
  if (!s.ok()) return s;
  *out = AlignArgs{static_cast<const int32_t*>(ids.data),
                   static_cast<int32_t*>(sorted.data),
                   static_cast<int32_t*>(experts.data),
                   static_cast<int32_t*>(post.data),
                   slots,
                   int(e),
                   int(m),
                   capacity,
                   a.param("check_ids", 1.0) != 0.0};
  return {};
}

// After the kernels: with check_ids, wait for num_tokens_post_padded and report an invalid id.
inline Status finish_align(const AlignArgs& a, cudaStream_t stream, const char* version) {
  Status s = last_launch_status(version);
  if (!s.ok() || !a.check_ids) return s;
  int32_t post = 0;
  cudaError_t e = cudaMemcpyAsync(&post, a.num_post, 4, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return error(Code::kCudaError, std::string(version) + ", reading num_tokens_post_padded: " +
                                       cudaGetErrorString(e) + " (check_ids = 0 inside a graph)");
  }
  if (post < 0)
    return error(Code::kInvalidArgument,
                 "topk_ids holds an expert id outside -1.." + std::to_string(a.num_experts - 1) +
                     ": those slots were skipped and num_tokens_post_padded is -1");
  return {};
}

// Scratch memory of the multi-kernel versions (counts, offsets, CUB's storage): lkw::Workspace,
// one buffer per device, kept for the process.
inline Status align_workspace(int64_t bytes, void** out) {
  static Workspace workspace("align workspace");
  return workspace.get(bytes, out);
}

inline Version align_version(const char* id, const char* summary, AlignLaunch launch,
                             std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion,
                             int kernels = 1) {
  Version v = version_of(kChapter, kAlignOp, id, summary, kind, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    AlignArgs aa;
    Status s = align_args(a, &aa);
    return s.ok() ? launch(aa, stream) : s;
  };
  v.bytes = tensor_bytes;
  v.flops = [](const Args&) { return 0.0; };  // integer bookkeeping only
  v.kernels_per_launch = kernels;
  return v;
}

// Device helpers of the align versions.
__device__ __forceinline__ bool masked_id(int32_t e) { return e == -1; }
__device__ __forceinline__ bool valid_id(int32_t e, int num_experts) {
  return e >= 0 && e < num_experts;
}
__device__ __forceinline__ int padded(int count, int block_m) {
  return (count + block_m - 1) / block_m * block_m;
}

// The scan of v0–v3 and the mutants: a block of kThreads threads, one value each (thread e holds
// expert e's padded count); every thread gets the sum of the values of the threads before it,
// and *total the block's sum. Every thread must call it: it has barriers.
template <int kThreads>
__device__ __forceinline__ int block_exclusive_scan(int value, int* total) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  __shared__ int warp_sum_sh[kThreads / 32];
  const int lane_idx = threadIdx.x % 32, warp_idx = threadIdx.x / 32;
  // BEGIN SOLUTION: an inclusive scan inside each warp (__shfl_up_sync), each warp's sum
  //   through shared memory, then every thread adds the sums of the warps before its own
  int inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane_idx >= offset) inclusive += up;
  }
  if (lane_idx == 31) warp_sum_sh[warp_idx] = inclusive;
  __syncthreads();
  int before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    const int s = warp_sum_sh[w];  // a broadcast: every thread reads the same word
    before += w < warp_idx ? s : 0;
    sum += s;
  }
  __syncthreads();  // the next call may overwrite warp_sum_sh
  *total = sum;
  return before + inclusive - value;
  // STUB: *total = 0;
  // STUB: return 0;
  // END SOLUTION
}

// The expert whose run holds row `row` of sorted_token_ids, from the run starts offset[0..E]
// (offset[E] = num_tokens_post_padded): the last e with offset[e] <= row, −1 past the runs.
// Experts with empty runs share their start with the next one; the last of them is never
// chosen because its successor starts at the same row.
__device__ __forceinline__ int expert_of_row(const int* offset, int num_experts, int row) {
  if (row >= offset[num_experts]) return -1;
  int lo = 0, hi = num_experts - 1;  // offset[lo] <= row < offset[hi + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offset[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace lkw::moe
