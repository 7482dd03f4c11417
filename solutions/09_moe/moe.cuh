// Chapter 09 — moe: the routing half of a MoE layer, gating then the counting sort.
//
// ops (reference/lkw/moe.py is the contract):
//   topk_softmax       logits FP32 [T, E] → weights FP32 [T, k], ids int32 [T, k]: p = softmax,
//   topk_softmax_bf16  the same from BF16 logits; the k largest p, largest first, equal p → the
//                      lower expert id; param renormalize: weights / their sum
//   deepseek_router    logits FP32 [T, E], bias FP32 [E] → weights, ids: s = sigmoid, the choice
//                      on c = s + bias in n_group groups (top-2 sum per group, topk_group groups
//                      kept), weights = s (÷ sum if renormalize) · routed_scaling_factor
//   moe_align_block_size  topk_ids int32 [T, k] → sorted_token_ids int32 [capacity],
//                      expert_ids int32 [capacity / BLOCK_M], num_tokens_post_padded int32 [1]
//   moe_grouped_gemm   x BF16 [T, K], w BF16 [E, N, K], sorted_token_ids, expert_ids (an align's)
//                      → out BF16 [T·k, N]: out[s] = x[s / k] · w[e]^T for each slot s in a run
//                      of expert e; FP32 sums, one BF16 rounding (params topk, block_m)
//   moe_grouped_gemm_silu  the same with w = gate || up ([E, N, K], gate rows first, vLLM's w13)
//                      → out BF16 [T·k, N/2] = silu(gate) · up, gate and up kept in FP32
//   moe_sum            y BF16 [T, k, d], topk_weights FP32 [T, k] → out BF16 [T, d]:
//                      out[t] = Σ_j w[t, j] · y[t, j] in FP32 in j order, one BF16 rounding
// The align is a counting sort of the S = T·k slots by expert: each expert's run of slot indices
// padded to a multiple of BLOCK_M with the sentinel S, runs in expert order, everything after
// them the sentinel (expert id −1 for those blocks). An id of −1 is a masked slot (expert
// parallelism): it lands in no run. An id outside −1..E−1 cannot be sorted: every version skips
// it, writes num_tokens_post_padded = −1, and the launcher (param check_ids, default 1) waits
// for the result and reports it; check_ids = 0 leaves the launch asynchronous (a CUDA graph).
// Order inside a run is unspecified: the tests compare runs as multisets (golden.h).
//
// versions (one sequence for the chapter; each file's name says its op):
//   v0_align_sort → v1_align_global_atomics → v2_align_shared_counting → v3_align_multi_block,
//   v4_topk_thread_per_token → v5_topk_warp_per_token → v6_topk_vec16_lanes,
//   v7_grouped_mma → v8_grouped_silu_epilogue, v9_sum_vec16.
// Bytes are the roofline minimum: ids read once, every output slot written once (the align fills
// its whole capacity); logits read once, weights and ids written once; the grouped GEMM
// reads the weights of the routed experts only (param routed_experts, see grouped_bytes).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lkw/launch.h"
#include "lkw/registry.h"
#include "lkw/workspace.h"

namespace lkw::moe {

constexpr const char* kChapter = "09_moe";
constexpr const char* kAlignOp = "moe_align_block_size";
constexpr int kMaxExperts = 1024;  // the align's scan holds one expert per thread of a block
constexpr int kMaxBlockM = 1024;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The sorted_token_ids length a caller allocates before the routing is known: every expert
// wastes at most BLOCK_M − 1 rows (lkw.moe.capacity).
inline int64_t align_capacity(int64_t slots, int64_t experts, int64_t block_m) {
  return ceil_div(slots + experts * (block_m - 1), block_m) * block_m;
}

// ---------------------------------------------------------------------------------------------
// moe_align_block_size

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

inline double tensor_bytes(const Args& a) {
  double b = 0;
  for (const TensorRef& t : a.inputs) b += t.bytes();
  for (const TensorRef& t : a.outputs) b += t.bytes();
  return b;
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

// ---------------------------------------------------------------------------------------------
// Routing: topk_softmax (FP32 or BF16 logits) and deepseek_router

enum class Router { kSoftmax, kDeepseek };

struct RouterOp {
  const char* name;
  Router router;
  DType logits;
};
constexpr RouterOp kTopkSoftmax{"topk_softmax", Router::kSoftmax, DType::kF32};
constexpr RouterOp kTopkSoftmaxBf16{"topk_softmax_bf16", Router::kSoftmax, DType::kBF16};
constexpr RouterOp kDeepseek{"deepseek_router", Router::kDeepseek, DType::kF32};

struct RouterArgs {
  const void* logits;  // [T, E] FP32 or BF16
  const float* bias;   // [E] (deepseek_router)
  float* weights;      // [T, k]
  int32_t* ids;        // [T, k]
  int64_t t;
  int e, k;
  bool renormalize;
  int n_group, topk_group;  // deepseek_router
  float scaling;            // deepseek_router's routed_scaling_factor
};

using RouterLaunch = Status (*)(const RouterArgs& a, cudaStream_t stream);

inline Status validate_router(const RouterOp& op, const RouterArgs& a, int max_e, int vec_bytes) {
  const bool ds = op.router == Router::kDeepseek;
  const int per_group = ds && a.n_group > 0 && a.e % a.n_group == 0 ? a.e / a.n_group : 0;
  const int elem = op.logits == DType::kBF16 ? 2 : 4;
  return Check()
      .not_null(a.logits, "logits")
      .that(!ds || a.bias, "bias is a null pointer")
      .not_null(a.weights, "weights")
      .not_null(a.ids, "ids")
      .positive(a.t, "T")
      .that(a.t < (int64_t(1) << 31), "T must be below 2^31")
      .that(a.e >= 1 && a.e <= max_e, "E = " + std::to_string(a.e) + " must be in 1.." +
                                          std::to_string(max_e) + " for this version")
      .that(a.k >= 1 && a.k <= a.e && a.k <= 32,
            "k = " + std::to_string(a.k) + " must be in 1..min(E, 32)")
      .that(!ds || (per_group >= 2 && a.topk_group >= 1 && a.topk_group <= a.n_group &&
                    a.n_group <= 32 && a.k <= a.topk_group * per_group),
            "deepseek_router needs E % n_group == 0, >= 2 experts per group, n_group <= 32, "
            "topk_group in 1..n_group and k <= topk_group·E/n_group")
      .that(!ds || std::isfinite(a.scaling), "routed_scaling_factor must be finite")
      .aligned(a.logits, std::max(elem, vec_bytes), "logits")
      .aligned(a.bias, 4, "bias")
      .aligned(a.weights, 4, "weights")
      .aligned(a.ids, 4, "ids")
      .disjoint(a.weights, 4 * a.t * a.k, a.ids, 4 * a.t * a.k, "weights and ids")
      .disjoint(a.weights, 4 * a.t * a.k, a.logits, int64_t(elem) * a.t * a.e, "weights and logits")
      .disjoint(a.ids, 4 * a.t * a.k, a.logits, int64_t(elem) * a.t * a.e, "ids and logits")
      .arch_at_least(80)
      .status();
}

inline Status router_args(const RouterOp& op, const Args& a, RouterArgs* out) {
  const bool ds = op.router == Router::kDeepseek;
  const size_t n_in = ds ? 2 : 1;
  Status s = Check()
                 .that(a.inputs.size() == n_in && a.outputs.size() == 2,
                       std::string(op.name) + " takes " + std::to_string(n_in) +
                           " inputs and writes weights and ids")
                 .that(!ds || (a.params.count("n_group") && a.params.count("topk_group")),
                       "deepseek_router needs the params n_group and topk_group")
                 .status();
  if (!s.ok()) return s;
  const TensorRef &logits = a.inputs[0], &w = a.outputs[0], &ids = a.outputs[1];
  s = Check()
          .that(logits.dtype == op.logits && logits.shape.size() == 2,
                std::string("logits are ") + dtype_name(op.logits) + " [T, E]")
          .that(!ds || (a.inputs[1].dtype == DType::kF32 && a.inputs[1].shape.size() == 1),
                "bias is float32 [E]")
          .that(w.dtype == DType::kF32 && w.shape.size() == 2, "weights are float32 [T, k]")
          .that(ids.dtype == DType::kI32 && ids.shape.size() == 2, "ids are int32 [T, k]")
          .status();
  if (!s.ok()) return s;
  s = Check()
          .that(w.dim(0) == logits.dim(0) && ids.dim(0) == logits.dim(0) && w.dim(1) == ids.dim(1),
                "weights and ids must be [T, k] with the logits' T")
          .that(!ds || a.inputs[1].dim(0) == logits.dim(1), "bias must have E entries")
          .that(logits.dim(1) <= kMaxExperts, "E must be at most 1024")
          .status();
  if (!s.ok()) return s;
  *out = RouterArgs{logits.data,
                    ds ? static_cast<const float*>(a.inputs[1].data) : nullptr,
                    static_cast<float*>(w.data),
                    static_cast<int32_t*>(ids.data),
                    logits.dim(0),
                    int(logits.dim(1)),
                    int(w.dim(1)),
                    a.param("renormalize", ds ? 1.0 : 0.0) != 0.0,
                    int(a.param("n_group", 0)),
                    int(a.param("topk_group", 0)),
                    float(a.param("routed_scaling_factor", 1.0))};
  return {};
}

inline Version router_version(const RouterOp& op, const char* id, const char* summary,
                              RouterLaunch launch, std::vector<SassFact> sass = {},
                              Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    RouterArgs ra;
    Status s = router_args(op, a, &ra);
    return s.ok() ? launch(ra, stream) : s;
  };
  v.bytes = tensor_bytes;
  // Per logit: subtract, exponential (or sigmoid), add to the sum, compare; the k picks and
  // the group scores are not counted.
  v.flops = [](const Args& a) { return 4.0 * double(a.inputs.at(0).numel()); };
  return v;
}

// Device helpers of the routing versions.
__device__ __forceinline__ float load_logit(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_logit(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// The order of the top-k: a larger score first, equal scores → the lower expert id.
__device__ __forceinline__ bool ranks_before(float a, int a_id, float b, int b_id) {
  return a > b || (a == b && a_id < b_id);
}

// 1/x within 2 ulp: one MUFU.RCP (__fdividef). The IEEE division and __frcp_rn call a slow-path
// subroutine, around which a loop's live registers spill to local memory. (For x beyond 2^126
// it returns 0: a sigmoid below 1e-38, a probability no top-k picks.)
__device__ __forceinline__ float fast_reciprocal(float x) { return __fdividef(1.0f, x); }

__device__ __forceinline__ float sigmoid(float x) { return fast_reciprocal(1.0f + expf(-x)); }

// ---------------------------------------------------------------------------------------------
// The expert half: moe_grouped_gemm (plain, or gate_up with SiLU-and-mul) and moe_sum

constexpr const char* kGroupedOp = "moe_grouped_gemm";
constexpr const char* kGroupedSiluOp = "moe_grouped_gemm_silu";
constexpr const char* kSumOp = "moe_sum";

// The grouped GEMM's tiles: rows come in m16 tiles (the mma's M), so an align block is a whole
// number of them; K and N come in 8-element pieces (a 16-byte cp.async of a row, an n8 tile).
constexpr int kGemmRowTile = 16;
constexpr int kGemmPiece = 8;

struct GroupedArgs {
  const __nv_bfloat16* x;     // [T, K]: token t serves slots t·topk .. t·topk + topk − 1
  const __nv_bfloat16* w;     // [E, N, K]
  const int32_t* sorted_ids;  // [rows]: slots, each expert's run padded with the sentinel T·topk
  const int32_t* expert_ids;  // [rows / block_m]: −1 = no expert (the block is skipped)
  __nv_bfloat16* out;         // [T·topk, N], or [T·topk, N/2] with silu
  int64_t t, n, k;
  int num_experts, topk, block_m;
  int64_t rows;
  bool silu;
};

using GroupedLaunch = Status (*)(const GroupedArgs& a, cudaStream_t stream);

// Everything a launcher can check without reading device memory. The ids are data: a sorted id
// outside 0..T·topk − 1 (the sentinel included) is a row the kernels skip, an expert id outside
// 0..E − 1 a block they skip, so no id makes them read or write out of bounds.
inline Status validate_grouped(const GroupedArgs& a) {
  const int64_t n_piece = a.silu ? 2 * kGemmPiece : kGemmPiece;
  const int64_t out_n = a.silu ? a.n / 2 : a.n;
  return Check()
      .not_null(a.x, "x")
      .not_null(a.w, "w")
      .not_null(a.sorted_ids, "sorted_token_ids")
      .not_null(a.expert_ids, "expert_ids")
      .not_null(a.out, "out")
      .positive(a.t, "T")
      .positive(a.n, "N")
      .positive(a.k, "K")
      .that(a.num_experts >= 1, "w must hold at least one expert")
      .that(a.topk >= 1, "topk must be >= 1 (got " + std::to_string(a.topk) + ")")
      .that(a.t * a.topk < (int64_t(1) << 31) && a.k < (int64_t(1) << 31) &&
                a.n <= 65535 * int64_t(128),
            "T·topk and K must fit int32, N at most 65535·128")
      .that(a.n % n_piece == 0,
            "N = " + std::to_string(a.n) + " must be a multiple of " + std::to_string(n_piece) +
                (a.silu ? " (gate and up halves of whole n8 tiles)" : " (whole n8 tiles)"))
      .that(a.k % kGemmPiece == 0,
            "K = " + std::to_string(a.k) + " must be a multiple of 8 (16-byte rows)")
      .that(a.block_m >= kGemmRowTile && a.block_m <= kMaxBlockM && a.block_m % kGemmRowTile == 0,
            "block_m = " + std::to_string(a.block_m) +
                " must be a multiple of 16 (whole m16 tiles) in 16..1024")
      .that(a.rows >= a.block_m && a.rows % a.block_m == 0 && a.rows < (int64_t(1) << 31),
            "sorted_token_ids must hold a positive multiple of block_m entries (below 2^31)")
      .aligned(a.x, 16, "x")
      .aligned(a.w, 16, "w")
      .aligned(a.out, 16, "out")
      .aligned(a.sorted_ids, 4, "sorted_token_ids")
      .aligned(a.expert_ids, 4, "expert_ids")
      .disjoint(a.out, 2 * a.t * a.topk * out_n, a.x, 2 * a.t * a.k, "out and x")
      .disjoint(a.out, 2 * a.t * a.topk * out_n, a.w, 2 * a.num_experts * a.n * a.k, "out and w")
      .disjoint(a.out, 2 * a.t * a.topk * out_n, a.sorted_ids, 4 * a.rows,
                "out and sorted_token_ids")
      .disjoint(a.out, 2 * a.t * a.topk * out_n, a.expert_ids, 4 * (a.rows / a.block_m),
                "out and expert_ids")
      .arch_at_least(80)
      .status();
}

// Generic Args → GroupedArgs: inputs x, w, sorted_token_ids, expert_ids; output out; params
// topk and block_m (the align's).
inline Status grouped_args(const Args& a, bool silu, GroupedArgs* out) {
  const char* name = silu ? kGroupedSiluOp : kGroupedOp;
  Status s = Check()
                 .that(a.inputs.size() == 4 && a.outputs.size() == 1,
                       std::string(name) +
                           " takes x, w, sorted_token_ids, expert_ids and writes out")
                 .that(a.params.count("topk") == 1 && a.params.count("block_m") == 1,
                       std::string(name) + " needs the params topk and block_m")
                 .status();
  if (!s.ok()) return s;
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &sorted = a.inputs[2],
                  &experts = a.inputs[3], &y = a.outputs[0];
  s = Check()
          .that(x.dtype == DType::kBF16 && x.shape.size() == 2, "x is bfloat16 [T, K]")
          .that(w.dtype == DType::kBF16 && w.shape.size() == 3, "w is bfloat16 [E, N, K]")
          .that(sorted.dtype == DType::kI32 && sorted.shape.size() == 1 &&
                    experts.dtype == DType::kI32 && experts.shape.size() == 1,
                "sorted_token_ids and expert_ids are int32 vectors")
          .that(y.dtype == DType::kBF16 && y.shape.size() == 2, "out is bfloat16 [T·topk, N]")
          .status();
  if (!s.ok()) return s;
  const double topk = a.params.at("topk"), m = a.params.at("block_m");
  s = Check()
          .that(topk >= 1 && topk < (1 << 20) && topk == std::floor(topk),
                "topk must be a positive integer")
          .that(m >= 1 && m <= kMaxBlockM && m == std::floor(m), "block_m must be in 1..1024")
          .that(w.dim(2) == x.dim(1), "x [T, K] and w [E, N, K] disagree on K")
          .status();
  if (!s.ok()) return s;
  const int64_t out_n = silu ? w.dim(1) / 2 : w.dim(1);
  s = Check()
          .that(y.dim(0) == x.dim(0) * int64_t(topk) && y.dim(1) == out_n,
                std::string("out must be [T·topk, ") + (silu ? "N/2" : "N") + "] = [" +
                    std::to_string(x.dim(0) * int64_t(topk)) + ", " + std::to_string(out_n) +
                    "]")
          .that(experts.dim(0) * int64_t(m) == sorted.dim(0),
                "expert_ids must hold one id per block_m rows of sorted_token_ids")
          .status();
  if (!s.ok()) return s;
  *out = GroupedArgs{static_cast<const __nv_bfloat16*>(x.data),
                     static_cast<const __nv_bfloat16*>(w.data),
                     static_cast<const int32_t*>(sorted.data),
                     static_cast<const int32_t*>(experts.data),
                     static_cast<__nv_bfloat16*>(y.data),
                     x.dim(0),
                     w.dim(1),
                     x.dim(1),
                     int(w.dim(0)),
                     int(topk),
                     int(m),
                     sorted.dim(0),
                     silu};
  return {};
}

// Bytes of the roofline minimum: x, the ids and out once, and the weights of the ROUTED experts
// only (a decode step touches a few of E). Which experts are routed is data on the device, so
// the caller says how many (param routed_experts: the distinct ids >= 0 in expert_ids,
// lkw.moe.routed_experts); without it, min(E, T·topk), the most a routing can touch.
inline double grouped_bytes(const Args& a) {
  const TensorRef &x = a.inputs.at(0), &w = a.inputs.at(1);
  const double slots = double(x.dim(0)) * a.param("topk", 1.0);
  const double routed = a.param("routed_experts", std::min(double(w.dim(0)), slots));
  return double(x.bytes() + a.inputs.at(2).bytes() + a.inputs.at(3).bytes() +
                a.outputs.at(0).bytes()) +
         routed * 2.0 * double(w.dim(1)) * double(w.dim(2));
}

inline Version grouped_version(bool silu, const char* id, const char* summary,
                               GroupedLaunch launch, std::vector<SassFact> sass = {},
                               Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, silu ? kGroupedSiluOp : kGroupedOp, id, summary, kind,
                         std::move(sass));
  v.launch = [silu, launch](const Args& a, cudaStream_t stream) -> Status {
    GroupedArgs ga;
    Status s = grouped_args(a, silu, &ga);
    return s.ok() ? launch(ga, stream) : s;
  };
  v.bytes = grouped_bytes;
  // 2·N·K per real row (T·topk of them; padding rows are work, not FLOPs); the SiLU and the
  // product of the epilogue are not counted.
  v.flops = [](const Args& a) {
    const TensorRef &x = a.inputs.at(0), &w = a.inputs.at(1);
    return 2.0 * double(x.dim(0)) * a.param("topk", 1.0) * double(w.dim(1)) * double(w.dim(2));
  };
  return v;
}

// ---- moe_sum

struct SumArgs {
  const __nv_bfloat16* y;  // [T, k, d]: row t·k + j is slot (t, j)'s expert output
  const float* weights;    // [T, k]
  __nv_bfloat16* out;      // [T, d]
  int64_t t, d;
  int k;
};

using SumLaunch = Status (*)(const SumArgs& a, cudaStream_t stream);

inline Status validate_sum(const SumArgs& a) {
  return Check()
      .not_null(a.y, "y")
      .not_null(a.weights, "topk_weights")
      .not_null(a.out, "out")
      .positive(a.t, "T")
      .positive(a.d, "d")
      .that(a.k >= 1, "k must be >= 1 (got " + std::to_string(a.k) + ")")
      .that(a.t < (int64_t(1) << 31), "T must be below 2^31")
      .that(a.d % 8 == 0, "d = " + std::to_string(a.d) + " must be a multiple of 8 (16-byte rows)")
      .aligned(a.y, 16, "y")
      .aligned(a.out, 16, "out")
      .aligned(a.weights, 4, "topk_weights")
      .disjoint(a.out, 2 * a.t * a.d, a.y, 2 * a.t * a.k * a.d, "out and y")
      .disjoint(a.out, 2 * a.t * a.d, a.weights, 4 * a.t * a.k, "out and topk_weights")
      .arch_at_least(80)
      .status();
}

inline Version sum_version(const char* id, const char* summary, SumLaunch launch,
                           std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, kSumOp, id, summary, kind, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 2 && a.outputs.size() == 1,
                         "moe_sum takes y and topk_weights and writes out")
                   .status();
    if (!s.ok()) return s;
    const TensorRef &y = a.inputs[0], &w = a.inputs[1], &out = a.outputs[0];
    s = Check()
            .that(y.dtype == DType::kBF16 && y.shape.size() == 3, "y is bfloat16 [T, k, d]")
            .that(w.dtype == DType::kF32 && w.shape.size() == 2, "topk_weights is float32 [T, k]")
            .that(out.dtype == DType::kBF16 && out.shape.size() == 2, "out is bfloat16 [T, d]")
            .status();
    if (!s.ok()) return s;
    s = Check()
            .that(w.dim(0) == y.dim(0) && w.dim(1) == y.dim(1), "topk_weights must be y's [T, k]")
            .that(out.dim(0) == y.dim(0) && out.dim(1) == y.dim(2), "out must be [T, d]")
            .that(y.dim(1) < (1 << 20), "k must be below 2^20")
            .status();
    if (!s.ok()) return s;
    return launch(SumArgs{static_cast<const __nv_bfloat16*>(y.data),
                          static_cast<const float*>(w.data), static_cast<__nv_bfloat16*>(out.data),
                          y.dim(0), y.dim(2), int(y.dim(1))},
                  stream);
  };
  v.bytes = tensor_bytes;
  v.flops = [](const Args& a) { return 2.0 * double(a.inputs.at(0).numel()); };  // an FMA each
  return v;
}

}  // namespace lkw::moe
