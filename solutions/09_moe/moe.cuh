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
//   moe_grouped_gemm_w4a16  moe_grouped_gemm with INT4 weights: w uint32 [E, N/64, 8K] (each
//                      expert in chapter 07's repacked layout, lkw.w4a16.repack), scales BF16
//                      [E, K/G, N]: W_hat[e] = s · (q − 8), G ∈ {32, 64, 128} or K
//   moe_grouped_gemm_fp8, _silu_fp8, _sum_fp8  the three with FP8 operands (W8A8): x and w E4M3
//                      with chapter 08's blockwise scales, x_scales FP32 [K/128, rows of x],
//                      w_scales FP32 [E, ceil(N/128), K/128] (experts_fp8.cuh)
//   moe_sum            y BF16 [T, k, d], topk_weights FP32 [T, k] → out BF16 [T, d]:
//                      out[t] = Σ_j w[t, j] · y[t, j] in FP32 in j order, one BF16 rounding
//   moe_block          x BF16 [T, d], router logits FP32 [T, E], w_gate_up BF16 [E, 2·d_ff, d],
//                      w_down BF16 [E, d, d_ff] → y BF16 [T, d]: the layer, chained from the
//                      ops above (block_chain.cu; lkw.moe.moe_layer_reference)
// The align is a counting sort of the S = T·k slots by expert: each expert's run of slot indices
// padded to a multiple of BLOCK_M with the sentinel S, runs in expert order, everything after
// them the sentinel (expert id −1 for those blocks). An id of −1 is a masked slot (expert
// parallelism): it lands in no run. An id outside −1..E−1 cannot be sorted: every version skips
// it, writes num_tokens_post_padded = −1, and the launcher (param check_ids, default 1) waits
// for the result and reports it; check_ids = 0 leaves the launch asynchronous (a CUDA graph).
// Order inside a run is unspecified: the tests compare runs as multisets (golden.h).
//
// The ops' contracts and registry entries: align.cuh, router.cuh, experts.cuh, experts_w4a16.cuh,
// experts_fp8.cuh; this header holds what they share.
// versions (one sequence for the chapter; each file's name says its family):
//   v0_align_sort → v1_align_global_atomics → v2_align_shared_counting → v3_align_multi_block,
//   v4_topk_thread_per_token → v5_topk_warp_per_token → v6_topk_vec16_lanes,
//   v7_grouped_mma → v8_grouped_silu_epilogue, v7 → v10_grouped_w4a16, v7 → v12_grouped_wgmma
//   → v15_grouped_fp8, v10 → v14_grouped_w4a16_gemv,
//   v9_sum_vec16 → v11_sum_thread_per_piece.
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

#include "lkw/registry.h"

namespace lkw::moe {

constexpr const char* kChapter = "09_moe";
constexpr int kMaxExperts = 1024;  // the align's scan holds one expert per thread of a block
constexpr int kMaxBlockM = 1024;   // rows of an align block, the grouped GEMM's schedule unit

// Bytes of every tensor once: the roofline minimum of the ops that touch each byte once.
inline double tensor_bytes(const Args& a) {
  double b = 0;
  for (const TensorRef& t : a.inputs) b += t.bytes();
  for (const TensorRef& t : a.outputs) b += t.bytes();
  return b;
}

// 1/x within 2 ulp: one MUFU.RCP (__fdividef). The IEEE division and __frcp_rn call a slow-path
// subroutine, around which a loop's live registers spill to local memory. (For x beyond 2^126
// it returns 0: a sigmoid below 1e-38, a probability no top-k picks.)
__device__ __forceinline__ float fast_reciprocal(float x) { return __fdividef(1.0f, x); }

__device__ __forceinline__ float sigmoid(float x) { return fast_reciprocal(1.0f + expf(-x)); }

}  // namespace lkw::moe
