// v6_topk_vec16_lanes — as few lanes per token as the row needs, each loading 16-byte vectors.
//
// Since v5: lane l of a token's kLanes lanes holds kVpt CONSECUTIVE experts (l·kVpt ..), so its
// share of the row is whole 16-byte vectors (4 FP32 or 8 BF16 logits a load) when E fits them;
// and a small E takes fewer lanes: E = 8 FP32 is 2 lanes a token, 16 tokens a warp, where v5
// left 24 lanes of each warp idle. kLanes and kVpt are compile-time (one kernel per E range), so
// the row stays in registers and the butterflies stop at the token's own lanes (offsets below
// kLanes). Picks are kept by lane r % kLanes in slot r / kLanes, so k may exceed kLanes.
// The DeepSeek router uses 32 lanes (lane g holds group g's score, as v5) with vector loads.
// A row whose vectors would be misaligned (E·bytes not a multiple of 16) takes a scalar path
// with the same register layout. Expect: full warps and 16-byte loads at every E; SASS:
// LDG.E.128 and SHFL.BFLY, no local memory.
#include "router.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 256;

template <int kLanes>
__device__ __forceinline__ void row_best(float& score, int& id) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, score, offset);
    const int other_id = __shfl_xor_sync(0xffffffffu, id, offset);
    if (ranks_before(other, other_id, score, id)) {
      score = other;
      id = other_id;
    }
  }
}

// Stage load: this lane's kVpt logits (−inf past E or past the last token).
template <class In, int kVpt, bool kVec>
__device__ __forceinline__ void load_share(const In* x, int first, int e, bool live,
                                           float (&v)[kVpt]) {
  constexpr int kUnit = 16 / sizeof(In);  // values per 16-byte vector
  // BEGIN SOLUTION: kVec: uint4 loads of kUnit values each (a whole vector is in the row or
  //   past it); else one guarded load per value
  if constexpr (kVec) {
    static_assert(kVpt % kUnit == 0, "whole vectors");
#pragma unroll
    for (int q = 0; q < kVpt / kUnit; ++q) {
      uint4 raw = make_uint4(0, 0, 0, 0);
      const bool in_row = live && first + q * kUnit < e;
      if (in_row) raw = *reinterpret_cast<const uint4*>(x + first + q * kUnit);  // (T, E) 16 B
      const In* vals = reinterpret_cast<const In*>(&raw);
#pragma unroll
      for (int j = 0; j < kUnit; ++j) v[q * kUnit + j] = in_row ? load_logit(vals, j) : -INFINITY;
    }
  } else {
#pragma unroll
    for (int u = 0; u < kVpt; ++u)
      v[u] = live && first + u < e ? load_logit(x, first + u) : -INFINITY;
  }
  // END SOLUTION
}

// Stage select + store: k picks over the token's lanes; pick r kept by lane r % kLanes.
template <int kLanes, int kVpt>
__device__ __forceinline__ void select_and_store(float (&score)[kVpt], const float (&weight)[kVpt],
                                                 int first, int k, bool renormalize, float scaling,
                                                 bool live, float* w_row, int32_t* id_row) {
  constexpr int kSlots = 32 / kLanes;
  const int l = threadIdx.x % kLanes;
  float my_w[kSlots], picked = 0.0f;
  int my_id[kSlots];
  for (int r = 0; r < k; ++r) {
    float best = -INFINITY, mine = 0.0f;
    int best_id = kMaxExperts;
#pragma unroll
    for (int u = 0; u < kVpt; ++u)
      if (ranks_before(score[u], first + u, best, best_id)) {
        best = score[u];
        best_id = first + u;
      }
    row_best<kLanes>(best, best_id);
#pragma unroll
    for (int u = 0; u < kVpt; ++u)
      if (first + u == best_id) {
        mine = weight[u];
        score[u] = -INFINITY;
      }
    const int owner = (threadIdx.x % 32) / kLanes * kLanes + best_id / kVpt;
    const float w = __shfl_sync(0xffffffffu, mine, owner);
    picked += w;
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot)
      if (slot * kLanes + l == r) {
        my_w[slot] = w;
        my_id[slot] = best_id;
      }
  }
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) {
    const int r = slot * kLanes + l;
    if (live && r < k) {
      w_row[r] =
          renormalize ? my_w[slot] * fast_reciprocal(picked) * scaling : my_w[slot] * scaling;
      id_row[r] = my_id[slot];  // (T, k)
    }
  }
}

template <class In, int kLanes, int kVpt, bool kVec>
__global__ void __launch_bounds__(kThreads)
    topk_v6_softmax_kernel(const In* __restrict__ logits, float* __restrict__ weights,
                           int32_t* __restrict__ ids, int64_t t, int e, int k, bool renormalize) {
  const int64_t token = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / kLanes;
  const bool live = token < t;  // a dead token's lanes still take part in the shuffles
  const int first = threadIdx.x % kLanes * kVpt;
  float p[kVpt];
  load_share<In, kVpt, kVec>(logits + token * e, first, e, live, p);  // (T, E)
  float max = -INFINITY, sum = 0.0f;
#pragma unroll
  for (int u = 0; u < kVpt; ++u) max = fmaxf(max, p[u]);
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
  if (!live) max = 0.0f;  // no −inf − −inf
#pragma unroll
  for (int u = 0; u < kVpt; ++u) {
    p[u] = expf(p[u] - max);
    sum += p[u];
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
#pragma unroll
  for (int u = 0; u < kVpt; ++u)
    p[u] = live && first + u < e ? p[u] * fast_reciprocal(sum) : -INFINITY;
  select_and_store<kLanes, kVpt>(p, p, first, k, renormalize, 1.0f, live, weights + token * k,
                                 ids + token * k);
}

template <int kVpt, bool kVec>
__global__ void __launch_bounds__(kThreads)
    topk_v6_deepseek_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                            float* __restrict__ weights, int32_t* __restrict__ ids, int64_t t,
                            int e, int k, bool renormalize, int n_group, int topk_group,
                            float scaling) {
  const int64_t token = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / 32;
  const bool live = token < t;
  const int lane_idx = threadIdx.x % 32, first = lane_idx * kVpt, per_group = e / n_group;
  float c[kVpt], s[kVpt], b[kVpt];
  load_share<float, kVpt, kVec>(logits + token * e, first, e, live, c);  // (T, E)
  load_share<float, kVpt, kVec>(bias, first, e, true, b);                // (E)
#pragma unroll
  for (int u = 0; u < kVpt; ++u) {
    s[u] = first + u < e ? sigmoid(c[u]) : 0.0f;
    c[u] = first + u < e ? s[u] + b[u] : -INFINITY;
  }
  // Stage groups: as v5 (lane g keeps group g's score), over consecutive experts.
  float my_group = -INFINITY;
  for (int g = 0; g < n_group; ++g) {
    float first_c = -INFINITY, second_c = -INFINITY;
#pragma unroll
    for (int u = 0; u < kVpt; ++u)
      if ((first + u) / per_group == g && first + u < e) {
        second_c = fmaxf(second_c, fminf(first_c, c[u]));
        first_c = fmaxf(first_c, c[u]);
      }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const float o1 = __shfl_xor_sync(0xffffffffu, first_c, offset);
      const float o2 = __shfl_xor_sync(0xffffffffu, second_c, offset);
      second_c = fmaxf(fminf(first_c, o1), fmaxf(second_c, o2));
      first_c = fmaxf(first_c, o1);
    }
    if (lane_idx == g) my_group = first_c + second_c;
  }
  uint32_t kept = 0;
  for (int r = 0; r < topk_group; ++r) {
    float best = my_group;
    int best_g = lane_idx;
    row_best<32>(best, best_g);
    kept |= 1u << best_g;
    if (lane_idx == best_g) my_group = -INFINITY;
  }
#pragma unroll
  for (int u = 0; u < kVpt; ++u)
    if (first + u >= e || !(kept >> ((first + u) / per_group) & 1u)) c[u] = -INFINITY;
  select_and_store<32, kVpt>(c, s, first, k, renormalize, scaling, live, weights + token * k,
                             ids + token * k);
}

// One kernel per (kLanes, kVpt): the fewest lanes of kUnit values that hold the row, up to 32.
template <const RouterOp& kOp, int kLanes, int kVpt>
void launch(const RouterArgs& a, cudaStream_t stream) {
  using In = std::conditional_t<kOp.logits == DType::kBF16, __nv_bfloat16, float>;
  constexpr int kUnit = 16 / sizeof(In);
  const bool vec =
      a.e % kUnit == 0 && reinterpret_cast<uintptr_t>(a.logits) % 16 == 0 &&
      (kOp.router != Router::kDeepseek || reinterpret_cast<uintptr_t>(a.bias) % 16 == 0);
  const unsigned blocks = unsigned(ceil_div(a.t * kLanes, kThreads));
  if constexpr (kOp.router == Router::kDeepseek) {
    static_assert(kLanes == 32, "lane g holds group g");
    auto kernel = vec ? topk_v6_deepseek_kernel<kVpt, true> : topk_v6_deepseek_kernel<kVpt, false>;
    kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(a.logits), a.bias, a.weights,
                                            a.ids, a.t, a.e, a.k, a.renormalize, a.n_group,
                                            a.topk_group, a.scaling);
  } else {
    auto kernel = vec ? topk_v6_softmax_kernel<In, kLanes, kVpt, true>
                      : topk_v6_softmax_kernel<In, kLanes, kVpt, false>;
    kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const In*>(a.logits), a.weights, a.ids, a.t,
                                            a.e, a.k, a.renormalize);
  }
}

constexpr int kMaxE = 512;

template <const RouterOp& kOp>
Status topk_v6_vec16_lanes(const RouterArgs& a, cudaStream_t stream) {
  Status s = validate_router(kOp, a, kMaxE, 0);
  if (!s.ok()) return s;
  constexpr int kUnit = kOp.logits == DType::kBF16 ? 8 : 4;
  if constexpr (kOp.router != Router::kDeepseek) {  // DeepSeek keeps 32 lanes: lane g, group g
    if (a.e <= 8 * kUnit) {
      if (a.e <= 2 * kUnit)
        launch<kOp, 2, kUnit>(a, stream);
      else
        launch<kOp, 8, kUnit>(a, stream);
      return last_launch_status(kOp.name);
    }
  }
  if (a.e <= 32 * kUnit)
    launch<kOp, 32, kUnit>(a, stream);
  else if (a.e <= 256)
    launch<kOp, 32, 256 / 32>(a, stream);
  else
    launch<kOp, 32, kMaxE / 32>(a, stream);
  return last_launch_status(kOp.name);
}

constexpr const char* kId = "v6_topk_vec16_lanes";
constexpr const char* kSummary = "E-sized lane groups, 16-byte loads of consecutive experts";
const SassFact kVectors{
    "topk_v6_softmax_kernelIfLi32ELi8ELb1E",      {}, {"LDG.E.128", "SHFL.BFLY"}, {}, true,
    "16-byte loads, butterflies, nothing spilled"};
const SassFact kVectorsBf16{"topk_v6_softmax_kernelI13__nv_bfloat16Li32ELi8ELb1E",
                            {},
                            {"LDG.E.128"},
                            {},
                            true,
                            "16-byte loads of 8 BF16, nothing spilled"};
const SassFact kDeepseekVectors{"topk_v6_deepseek_kernelILi8ELb1E",
                                {},
                                {"LDG.E.128"},
                                {},
                                true,
                                "16-byte loads of logits and bias, nothing spilled"};
const SassFact kEveryKernel{
    "topk_v6_", {},   {"SHFL.BFLY"},
    {},         true, "every (lanes, values, vector) kernel: butterflies, nothing spilled"};
const Register kSoftmax{router_version(
    kTopkSoftmax, kId, kSummary, topk_v6_vec16_lanes<kTopkSoftmax>, {kVectors, kEveryKernel})};
const Register kSoftmaxBf16{router_version(kTopkSoftmaxBf16, kId, kSummary,
                                           topk_v6_vec16_lanes<kTopkSoftmaxBf16>, {kVectorsBf16})};
const Register kDeepseekRouter{
    router_version(kDeepseek, kId, kSummary, topk_v6_vec16_lanes<kDeepseek>, {kDeepseekVectors})};

}  // namespace
}  // namespace lkw::moe
