// Chapter 09 — routing: topk_softmax (FP32 or BF16 logits) and deepseek_router, their arguments,
// registry entries and the device helpers of v4–v6.
#pragma once
#include "moe.cuh"

namespace lkw::moe {

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

}  // namespace lkw::moe
