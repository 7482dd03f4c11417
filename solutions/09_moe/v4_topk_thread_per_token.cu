// v4_topk_thread_per_token — the router read literally: one thread walks one token's row.
//
// The gating kernels (topk_softmax, topk_softmax_bf16, deepseek_router) start here. A thread per
// token keeps no array — a thread's array of E scores would sit in local memory — so it walks
// its row of logits again for each step: the max, the sum of exponentials, then k selection
// passes. Pass r picks the best (score, id) that ranks after pass r − 1's pick in the order
// "larger score first, equal scores → lower id": no "taken" flags needed, and ties fall to the
// lower id by construction. DeepSeek's router first keeps topk_group groups the same way (a
// group's score, the sum of its two largest choice scores, recomputed in each pass).
// Expect: correct, and slow by design: k + 2 passes over each row, neighbouring threads reading
// rows E·4 bytes apart (uncoalesced), a handful of tokens per SM at small T. SASS: no shuffles,
// no local memory.
#include "router.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 128;

// Softmax probability of logit x: exp(x − max) · (1 / sum), the same expression in every pass.
__device__ __forceinline__ float prob(float x, float max, float inv_sum) {
  return expf(x - max) * inv_sum;
}

template <class In>
__global__ void __launch_bounds__(kThreads)
    topk_v4_softmax_kernel(const In* __restrict__ logits, float* __restrict__ weights,
                           int32_t* __restrict__ ids, int64_t t, int e, int k, bool renormalize) {
  const int64_t token = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (token >= t) return;
  const In* x = logits + token * e;  // (T, E)
  // Stage softmax: the row's max and the sum of exp(x − max), its reciprocal.
  float max = -INFINITY, sum = 0.0f;
  for (int j = 0; j < e; ++j) max = fmaxf(max, load_logit(x, j));
  for (int j = 0; j < e; ++j) sum += expf(load_logit(x, j) - max);
  const float inv_sum = fast_reciprocal(sum);
  // Stage select: pass r picks the best (p, j) ranking after (prev_p, prev_id).
  float prev_p = INFINITY, picked = 0.0f;
  int prev_id = -1;
  for (int r = 0; r < k; ++r) {
    float best_p = -INFINITY;
    int best_id = e;
    // BEGIN SOLUTION: over j: p = prob(...); a candidate if (p, j) ranks after (prev_p, prev_id);
    //   keep it if it ranks before (best_p, best_id)
    for (int j = 0; j < e; ++j) {
      const float p = prob(load_logit(x, j), max, inv_sum);
      if (ranks_before(prev_p, prev_id, p, j) && ranks_before(p, j, best_p, best_id)) {
        best_p = p;
        best_id = j;
      }
    }
    // END SOLUTION
    weights[token * k + r] = best_p;  // (T, k)
    ids[token * k + r] = best_id;     // (T, k)
    picked += best_p;
    prev_p = best_p;
    prev_id = best_id;
  }
  if (renormalize)
    for (int r = 0; r < k; ++r) weights[token * k + r] *= fast_reciprocal(picked);
}

// DeepSeek-V3: c = sigmoid(x) + bias chooses; the weights are the sigmoids.
__device__ __forceinline__ float choice(const float* x, const float* bias, int j) {
  return sigmoid(x[j]) + bias[j];
}

// Group g's score: the sum of its two largest choice scores.
__device__ __forceinline__ float group_score(const float* x, const float* bias, int g,
                                             int per_group) {
  float first = -INFINITY, second = -INFINITY;
  for (int j = g * per_group; j < (g + 1) * per_group; ++j) {
    const float c = choice(x, bias, j);
    second = fmaxf(second, fminf(first, c));
    first = fmaxf(first, c);
  }
  return first + second;
}

__global__ void __launch_bounds__(kThreads)
    topk_v4_deepseek_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                            float* __restrict__ weights, int32_t* __restrict__ ids, int64_t t,
                            int e, int k, bool renormalize, int n_group, int topk_group,
                            float scaling) {
  const int64_t token = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (token >= t) return;
  const float* x = logits + token * e;  // (T, E)
  const int per_group = e / n_group;
  // Stage groups: topk_group passes over the group scores, as the select passes below.
  uint32_t kept = 0;  // bit g: group g is kept
  float prev_s = INFINITY;
  int prev_g = -1;
  for (int r = 0; r < topk_group; ++r) {
    float best_s = -INFINITY;
    int best_g = n_group;
    for (int g = 0; g < n_group; ++g) {
      const float s = group_score(x, bias, g, per_group);
      if (ranks_before(prev_s, prev_g, s, g) && ranks_before(s, g, best_s, best_g)) {
        best_s = s;
        best_g = g;
      }
    }
    kept |= 1u << best_g;
    prev_s = best_s;
    prev_g = best_g;
  }
  // Stage select: k passes over the experts of the kept groups; the weight is the sigmoid.
  float prev_c = INFINITY, picked = 0.0f;
  int prev_id = -1;
  for (int r = 0; r < k; ++r) {
    float best_c = -INFINITY;
    int best_id = e;
    // BEGIN SOLUTION: as topk_v4_softmax_kernel's pass, over the experts of the kept groups only
    for (int j = 0; j < e; ++j) {
      if (!(kept >> (j / per_group) & 1u)) continue;
      const float c = choice(x, bias, j);
      if (ranks_before(prev_c, prev_id, c, j) && ranks_before(c, j, best_c, best_id)) {
        best_c = c;
        best_id = j;
      }
    }
    // END SOLUTION
    const float w = sigmoid(x[best_id]);
    weights[token * k + r] = w;  // (T, k)
    ids[token * k + r] = best_id;
    picked += w;
    prev_c = best_c;
    prev_id = best_id;
  }
  const float factor = renormalize ? scaling * fast_reciprocal(picked) : scaling;
  for (int r = 0; r < k; ++r) weights[token * k + r] *= factor;
}

template <const RouterOp& kOp>
Status topk_v4_thread_per_token(const RouterArgs& a, cudaStream_t stream) {
  Status s = validate_router(kOp, a, kMaxExperts, 0);
  if (!s.ok()) return s;
  const unsigned blocks = unsigned(ceil_div(a.t, kThreads));
  if constexpr (kOp.router == Router::kDeepseek) {
    topk_v4_deepseek_kernel<<<blocks, kThreads, 0, stream>>>(
        static_cast<const float*>(a.logits), a.bias, a.weights, a.ids, a.t, a.e, a.k, a.renormalize,
        a.n_group, a.topk_group, a.scaling);
  } else if constexpr (kOp.logits == DType::kBF16) {
    topk_v4_softmax_kernel<<<blocks, kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(a.logits), a.weights, a.ids, a.t, a.e, a.k,
        a.renormalize);
  } else {
    topk_v4_softmax_kernel<<<blocks, kThreads, 0, stream>>>(
        static_cast<const float*>(a.logits), a.weights, a.ids, a.t, a.e, a.k, a.renormalize);
  }
  return last_launch_status(kOp.name);
}

constexpr const char* kId = "v4_topk_thread_per_token";
constexpr const char* kSummary = "a thread per token, k + 2 passes over its row, no arrays";
const SassFact kNoShuffle{"topk_v4_", {}, {}, {"SHFL"}, true, "no shuffles, nothing spilled"};
const Register kSoftmax{router_version(kTopkSoftmax, kId, kSummary,
                                       topk_v4_thread_per_token<kTopkSoftmax>, {kNoShuffle})};
const Register kSoftmaxBf16{
    router_version(kTopkSoftmaxBf16, kId, kSummary, topk_v4_thread_per_token<kTopkSoftmaxBf16>,
                   {kNoShuffle})};
const Register kDeepseekRouter{
    router_version(kDeepseek, kId, kSummary, topk_v4_thread_per_token<kDeepseek>, {kNoShuffle})};

}  // namespace
}  // namespace lkw::moe
