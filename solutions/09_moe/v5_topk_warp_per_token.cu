// v5_topk_warp_per_token — a warp per token: the row in registers, reductions by shuffles.
//
// Since v4: lane l holds experts l, l + 32, l + 64, ... (kPer = ceil(E/32) registers, a
// compile-time count so the array stays in registers), so each warp-wide load is one coalesced
// row segment and the row is read once. The max and the sum are butterflies of __shfl_xor_sync;
// each of the k picks is a warp argmax — every lane offers its best (score, id), five shuffle
// steps keep the better of two by the same order as v4 (larger, then lower id) — after which the
// owner of the winner marks it taken (score −inf). Lane r keeps pick r, and lanes 0..k−1 store
// the k results together. DeepSeek's group scores are a warp reduction of (first, second) pairs
// per group; lane g keeps group g's score for the topk_group picks over the groups.
// Expect: every lane busy at E ≥ 32, one read of the logits, k·5 shuffle rounds per token; at
// E = 8 three quarters of the warp idle (v6). SASS: SHFL.BFLY, no local memory.
#include "router.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The warp's best (score, id) by ranks_before; every lane gets it.
__device__ __forceinline__ void warp_best(float& score, int& id) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, score, offset);
    const int other_id = __shfl_xor_sync(0xffffffffu, id, offset);
    if (ranks_before(other, other_id, score, id)) {
      score = other;
      id = other_id;
    }
  }
}

// One pick: the best untaken (score, id) of the warp, then marked taken; returns its value of
// `weight` (from the owner lane).
template <int kPer>
__device__ __forceinline__ int pick(float (&score)[kPer], const float (&weight)[kPer], float* w) {
  const int lane_idx = threadIdx.x % 32;
  float best = -INFINITY;
  int best_id = kMaxExperts;
  // BEGIN SOLUTION: this lane's best (score[u], lane + 32u); warp_best; the owner lane marks it
  //   taken (score −inf) and its weight goes to every lane through one shuffle
#pragma unroll
  for (int u = 0; u < kPer; ++u)
    if (ranks_before(score[u], lane_idx + 32 * u, best, best_id)) {
      best = score[u];
      best_id = lane_idx + 32 * u;
    }
  warp_best(best, best_id);
  float mine = 0.0f;
#pragma unroll
  for (int u = 0; u < kPer; ++u)
    if (lane_idx + 32 * u == best_id) {
      mine = weight[u];
      score[u] = -INFINITY;
    }
  *w = __shfl_sync(0xffffffffu, mine, best_id % 32);
  // STUB: *w = 0.0f;
  // END SOLUTION
  return best_id;
}

// Stage select + store: k picks, lane r keeps pick r; lanes < k store (renormalized, scaled).
template <int kPer>
__device__ __forceinline__ void select_and_store(float (&score)[kPer], const float (&weight)[kPer],
                                                 int k, bool renormalize, float scaling,
                                                 float* w_row, int32_t* id_row) {
  const int lane_idx = threadIdx.x % 32;
  float my_w = 0.0f, picked = 0.0f;
  int my_id = 0;
  for (int r = 0; r < k; ++r) {
    float w;
    const int id = pick(score, weight, &w);
    picked += w;
    if (lane_idx == r) {
      my_w = w;
      my_id = id;
    }
  }
  if (lane_idx < k) {
    w_row[lane_idx] =
        renormalize ? my_w * fast_reciprocal(picked) * scaling : my_w * scaling;  // (T, k)
    id_row[lane_idx] = my_id;                                                     // (T, k)
  }
}

template <class In, int kPer>
__global__ void __launch_bounds__(kThreads)
    topk_v5_softmax_kernel(const In* __restrict__ logits, float* __restrict__ weights,
                           int32_t* __restrict__ ids, int64_t t, int e, int k, bool renormalize) {
  const int64_t token = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (token >= t) return;  // a whole warp leaves together
  const int lane_idx = threadIdx.x % 32;
  const In* x = logits + token * e;  // (T, E)
  float p[kPer];
  // Stage softmax: load, the warp's max, the warp's sum of exp(x − max), p = exp / sum.
  // BEGIN SOLUTION: p[u] = logit lane + 32u (−inf past E); max and sum by warp butterflies;
  //   p[u] = exp(p[u] − max) · (1 / sum), −inf past E
  float max = -INFINITY, sum = 0.0f;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int j = lane_idx + 32 * u;
    p[u] = j < e ? load_logit(x, j) : -INFINITY;
    max = fmaxf(max, p[u]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    p[u] = expf(p[u] - max);
    sum += p[u];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
#pragma unroll
  for (int u = 0; u < kPer; ++u)
    p[u] = lane_idx + 32 * u < e ? p[u] * fast_reciprocal(sum) : -INFINITY;
  // END SOLUTION
  select_and_store(p, p, k, renormalize, 1.0f, weights + token * k, ids + token * k);
}

// The warp's two largest of (first, second) pairs, in every lane.
__device__ __forceinline__ void warp_top2(float& first, float& second) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float o1 = __shfl_xor_sync(0xffffffffu, first, offset);
    const float o2 = __shfl_xor_sync(0xffffffffu, second, offset);
    second = fmaxf(fminf(first, o1), fmaxf(second, o2));
    first = fmaxf(first, o1);
  }
}

template <int kPer>
__global__ void __launch_bounds__(kThreads)
    topk_v5_deepseek_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                            float* __restrict__ weights, int32_t* __restrict__ ids, int64_t t,
                            int e, int k, bool renormalize, int n_group, int topk_group,
                            float scaling) {
  const int64_t token = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (token >= t) return;
  const int lane_idx = threadIdx.x % 32, per_group = e / n_group;
  const float* x = logits + token * e;  // (T, E)
  float c[kPer], s[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int j = lane_idx + 32 * u;
    s[u] = j < e ? sigmoid(x[j]) : 0.0f;
    c[u] = j < e ? s[u] + bias[j] : -INFINITY;  // (E)
  }
  // Stage groups: lane g holds group g's score; topk_group warp picks over them.
  float my_group = -INFINITY;
  for (int g = 0; g < n_group; ++g) {
    float first = -INFINITY, second = -INFINITY;
#pragma unroll
    for (int u = 0; u < kPer; ++u)
      if ((lane_idx + 32 * u) / per_group == g && lane_idx + 32 * u < e) {
        second = fmaxf(second, fminf(first, c[u]));
        first = fmaxf(first, c[u]);
      }
    warp_top2(first, second);
    if (lane_idx == g) my_group = first + second;
  }
  uint32_t kept = 0;
  for (int r = 0; r < topk_group; ++r) {
    float best = my_group;
    int best_g = lane_idx;
    warp_best(best, best_g);
    kept |= 1u << best_g;
    if (lane_idx == best_g) my_group = -INFINITY;
  }
  // Stage select: the experts of dropped groups leave the race.
#pragma unroll
  for (int u = 0; u < kPer; ++u)
    if (lane_idx + 32 * u >= e || !(kept >> ((lane_idx + 32 * u) / per_group) & 1u))
      c[u] = -INFINITY;  // (no shift by a group number of 32 or more: undefined)
  select_and_store(c, s, k, renormalize, scaling, weights + token * k, ids + token * k);
}

template <const RouterOp& kOp, int kPer>
void launch(const RouterArgs& a, cudaStream_t stream) {
  const unsigned blocks = unsigned(ceil_div(a.t, kWarps));
  if constexpr (kOp.router == Router::kDeepseek) {
    topk_v5_deepseek_kernel<kPer><<<blocks, kThreads, 0, stream>>>(
        static_cast<const float*>(a.logits), a.bias, a.weights, a.ids, a.t, a.e, a.k, a.renormalize,
        a.n_group, a.topk_group, a.scaling);
  } else {
    using In = std::conditional_t<kOp.logits == DType::kBF16, __nv_bfloat16, float>;
    topk_v5_softmax_kernel<In, kPer><<<blocks, kThreads, 0, stream>>>(
        static_cast<const In*>(a.logits), a.weights, a.ids, a.t, a.e, a.k, a.renormalize);
  }
}

constexpr int kMaxE = 512;  // 16 registers of scores a lane

template <const RouterOp& kOp>
Status topk_v5_warp_per_token(const RouterArgs& a, cudaStream_t stream) {
  Status s = validate_router(kOp, a, kMaxE, 0);
  if (!s.ok()) return s;
  if (a.e <= 32)
    launch<kOp, 1>(a, stream);
  else if (a.e <= 64)
    launch<kOp, 2>(a, stream);
  else if (a.e <= 128)
    launch<kOp, 4>(a, stream);
  else if (a.e <= 256)
    launch<kOp, 8>(a, stream);
  else
    launch<kOp, 16>(a, stream);
  return last_launch_status(kOp.name);
}

constexpr const char* kId = "v5_topk_warp_per_token";
constexpr const char* kSummary = "a warp per token: row in registers, shuffle max/sum/argmax";
const SassFact kShuffles{"topk_v5_", {}, {"SHFL.BFLY"}, {}, true, "butterflies, nothing spilled"};
const Register kSoftmax{
    router_version(kTopkSoftmax, kId, kSummary, topk_v5_warp_per_token<kTopkSoftmax>, {kShuffles})};
const Register kSoftmaxBf16{
    router_version(kTopkSoftmaxBf16, kId, kSummary, topk_v5_warp_per_token<kTopkSoftmaxBf16>,
                   {kShuffles})};
const Register kDeepseekRouter{
    router_version(kDeepseek, kId, kSummary, topk_v5_warp_per_token<kDeepseek>, {kShuffles})};

}  // namespace
}  // namespace lkw::moe
