// v13_topk_redux — v6 with each warp-wide argmax as one reduction instruction and a vote.
//
// Since v6: at E = 256 a token is a whole warp, and each of the k picks was a five-step butterfly
// of two shuffles (score and id), plus the softmax's max: about a hundred shuffles a token, and
// at T = 16384 the SMs' shuffle throughput, not the 16 MB of logits, set the time. Ampere added
// warp reductions of 32-bit integers (redux.sync, __reduce_max_sync): one instruction. A float
// becomes an unsigned key in the same order (negative ones flipped, positive ones above them; 0
// is "taken"), the warp's largest key is one REDUX, the lanes holding it one vote, and the lowest
// such lane (__ffs) holds the lowest id among equal scores, since lane l holds experts l·kVpt...
// So a pick is REDUX + VOTE + two shuffles (the id and the weight) instead of ten; the max of the
// softmax is one REDUX; DeepSeek's group scores (a top-2 per group) two. Lane groups narrower
// than a warp (small E) keep v6's butterflies. Expect: at E = 256 and T = 16384 a few times
// faster than v6, the same picks bit for bit. SASS: REDUX, VOTE, LDG.E.128, no local memory.
#include "router.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 256;

// A float as an unsigned key of the same order: negative floats flipped, non-negative ones with
// the sign bit set (so above them); no float maps to 0 (but a NaN), which stands for "taken".
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned b = __float_as_uint(v);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float key_value(unsigned key) {
  return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

// The warp's best (score, id) of every lane's offer, by ranks_before's order: the largest key in
// one REDUX, the lanes that hold it in one vote, the lowest of them (the lowest id: lanes hold
// consecutive experts) sends its id. Returns that lane; a lane offering nothing offers key 0.
__device__ __forceinline__ int warp_best(float& score, int& id, bool offers) {
  // BEGIN SOLUTION: the top key over the warp (__reduce_max_sync), the ballot of the lanes at it,
  //   the first of them by __ffs; broadcast its score (from the key) and its id
  const unsigned key = offers ? order_key(score) : 0u;
  const unsigned top = __reduce_max_sync(0xffffffffu, key);
  const int owner = __ffs(__ballot_sync(0xffffffffu, key == top)) - 1;
  score = key_value(top);
  id = __shfl_sync(0xffffffffu, id, owner);
  // END SOLUTION
  return owner;
}

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
    int owner;
    if constexpr (kLanes == 32) {
      owner = warp_best(best, best_id, best_id < kMaxExperts);
    } else {
      row_best<kLanes>(best, best_id);
      owner = (threadIdx.x % 32) / kLanes * kLanes + best_id / kVpt;
    }
#pragma unroll
    for (int u = 0; u < kVpt; ++u)
      if (first + u == best_id) {
        mine = weight[u];
        score[u] = -INFINITY;
      }
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
    topk_v13_softmax_kernel(const In* __restrict__ logits, float* __restrict__ weights,
                           int32_t* __restrict__ ids, int64_t t, int e, int k, bool renormalize) {
  const int64_t token = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / kLanes;
  const bool live = token < t;  // a dead token's lanes still take part in the shuffles
  const int first = threadIdx.x % kLanes * kVpt;
  float p[kVpt];
  load_share<In, kVpt, kVec>(logits + token * e, first, e, live, p);  // (T, E)
  float max = -INFINITY, sum = 0.0f;
#pragma unroll
  for (int u = 0; u < kVpt; ++u) max = fmaxf(max, p[u]);
  if constexpr (kLanes == 32) {
    max = key_value(__reduce_max_sync(0xffffffffu, order_key(max)));
  } else {
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
      max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
  }
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
    topk_v13_deepseek_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
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
    // The group's best over the warp, then its second: the best lane offers its own second,
    // every other lane its first (two lanes at the best make the second equal to it).
    const unsigned top = __reduce_max_sync(0xffffffffu, order_key(first_c));
    const int owner = __ffs(__ballot_sync(0xffffffffu, order_key(first_c) == top)) - 1;
    const unsigned next = __reduce_max_sync(0xffffffffu, order_key(lane_idx == owner ? second_c : first_c));
    if (lane_idx == g) my_group = key_value(top) + key_value(next);
  }
  uint32_t kept = 0;
  for (int r = 0; r < topk_group; ++r) {
    float best = my_group;
    int best_g = lane_idx;
    warp_best(best, best_g, lane_idx < n_group && my_group != -INFINITY);
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
    auto kernel = vec ? topk_v13_deepseek_kernel<kVpt, true> : topk_v13_deepseek_kernel<kVpt, false>;
    kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(a.logits), a.bias, a.weights,
                                            a.ids, a.t, a.e, a.k, a.renormalize, a.n_group,
                                            a.topk_group, a.scaling);
  } else {
    auto kernel = vec ? topk_v13_softmax_kernel<In, kLanes, kVpt, true>
                      : topk_v13_softmax_kernel<In, kLanes, kVpt, false>;
    kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const In*>(a.logits), a.weights, a.ids, a.t,
                                            a.e, a.k, a.renormalize);
  }
}

constexpr int kMaxE = 512;

template <const RouterOp& kOp>
Status topk_v13_redux(const RouterArgs& a, cudaStream_t stream) {
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

constexpr const char* kId = "v13_topk_redux";
constexpr const char* kSummary = "v6 with each warp argmax as one REDUX and a vote";
const SassFact kVectors{"topk_v13_softmax_kernelIfLi32ELi8ELb1E",
                       {},
                       {"LDG.E.128", "REDUX", "VOTE"},
                       {},
                       true,
                       "16-byte loads; the argmax a REDUX and a vote; nothing spilled"};
const SassFact kVectorsBf16{"topk_v13_softmax_kernelI13__nv_bfloat16Li32ELi8ELb1E",
                            {},
                            {"LDG.E.128", "REDUX"},
                            {},
                            true,
                            "16-byte loads of 8 BF16, REDUX argmax, nothing spilled"};
const SassFact kDeepseekVectors{"topk_v13_deepseek_kernelILi8ELb1E",
                                {},
                                {"LDG.E.128", "REDUX"},
                                {},
                                true,
                                "group scores and picks by REDUX, nothing spilled"};
const SassFact kEveryKernel{"topk_v13_", {}, {}, {}, true, "every (lanes, values, vector) kernel: nothing spilled"};
const Register kSoftmax{router_version(
    kTopkSoftmax, kId, kSummary, topk_v13_redux<kTopkSoftmax>, {kVectors, kEveryKernel})};
const Register kSoftmaxBf16{router_version(kTopkSoftmaxBf16, kId, kSummary,
                                           topk_v13_redux<kTopkSoftmaxBf16>, {kVectorsBf16})};
const Register kDeepseekRouter{
    router_version(kDeepseek, kId, kSummary, topk_v13_redux<kDeepseek>, {kDeepseekVectors})};

}  // namespace
}  // namespace lkw::moe
