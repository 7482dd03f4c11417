// Chapter 05 — elementwise: the small kernels a decoder layer runs between its GEMMs.
//
// ops (reference/lkw/elementwise.py is the contract; it says where each value is rounded):
//   silu_and_mul, gelu_and_mul,     x [T, 2d] BF16 → y [T, d] = bf16(act(gate) · up), gate = the
//   gelu_tanh_and_mul               first half (act_first, the default) or the second; optional
//                                   clamp (param limit > 0): gate ≤ limit, |up| ≤ limit
//   silu_and_mul_fp8_per_token      → q E4M3 [T, d], scales [T, 1]      chapter 03's quant rules
//   silu_and_mul_fp8_per_group      → q, scales [d/128, T] (or [T, d/128]) applied to the BF16 y
//   silu_and_mul_fp8_per_tensor     x, scale [1] → q                    that never reaches memory
//   rope                            positions [T], q [T, Hq, D], k [T, Hk, D], cos_sin [P, rot] →
//                                   q_out, k_out: the first rot_dim elements of each head rotated
//                                   (NEOX halves or GPT-J pairs, param is_neox; param inverse)
//   qk_norm_rope                    + q_weight, k_weight [D]: per-head RMSNorm, then the rotation
//   reshape_and_cache(_fp8)         key, value [T, Hk, D], slot_mapping [T] (, k_scale, v_scale)
//                                   → the KV caches, updated in place (param layout: 0 paged,
//                                   1 NHD, 2 HND); slot −1 is padding: nothing read or written
// q_out, k_out may be q, k exactly (in place, vLLM's signature): then a partial rotation leaves
// the other D − rot_dim elements untouched; out of place they are copied.
//
// Bytes per element (every op is a handful of FP32 operations per byte: all of them are judged
// by bytes against the copy ceiling):
//   act_and_mul 6 B (gate, up read; y written)   fused FP8 quant 5 B (vs 9 B: y out and back in)
//   rope 4 B over rot_dim                        qk_norm_rope 4 B (vs 8 B: a norm pass, a rope pass)
//   reshape_and_cache 4 + 2·(cache bytes) per element of key and value: 8 B BF16, 6 B FP8
//
// versions: v0_act_scalar → v1_act_vec16 → v2_act_fused_fp8 (the three quant ops);
// v3_rope_scalar → v4_rope_vec16 → v5_qk_norm_rope; v6_cache_scalar → v7_cache_vec16.
// peers: chain_unfused (the kernels the fused versions replace); mutants.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "03_dynamic_quant/quant_math.cuh"
#include "04_rmsnorm/rmsnorm.cuh"
#include "lkw/registry.h"

namespace lkw::elementwise {

constexpr const char* kChapter = "05_elementwise";
constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();  // rows and tokens on blockIdx.x

// BF16 vectors and their element access, the block reductions: chapter 04's.
using rmsnorm::Bf16Vec;
using rmsnorm::get;
using rmsnorm::put;

// Byte models: lkw::io_bytes (each input read once, each output written once), except RoPE's
// (rope_bytes) and reshape_and_cache's, which counts every token as valid (the bench's caches
// have no padding) and its caches by what one launch writes, not their size (cache_bytes).

// A tensor's bytes, for the overlap checks; `updates`: the input an output may be exactly (in
// place, vLLM's signature for RoPE).
struct Span {
  const void* p;
  int64_t bytes;
  const char* name;
  const void* updates = nullptr;
};

// Outputs must not overlap the inputs or each other, except an output that IS the input it
// updates. Null pointers (tensors an op does not have) are skipped.
inline Status check_apart(std::initializer_list<Span> outputs, std::initializer_list<Span> inputs) {
  Check c;
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (!o->p) continue;
    auto apart = [&](const Span& other) {
      if (other.p && !(o->updates && o->p == other.p && other.p == o->updates))
        c.disjoint(o->p, o->bytes, other.p, other.bytes,
                   (std::string(o->name) + " and " + other.name).c_str());
    };
    for (const Span& in : inputs) apart(in);
    for (auto other = outputs.begin(); other != o; ++other) apart(*other);
  }
  return c.arch_at_least(80).status();
}

// =============================================================================================
// 1. Gated activations (v0, v1, v2)

enum class Act { kSilu, kGelu, kGeluTanh };
enum class Quant { kNone, kPerToken, kPerGroup, kPerTensor };

struct ActOp {
  const char* name;
  Act act;
  Quant quant;  // kNone: y BF16; else the FP8 codes q (and the scales, unless per tensor)
};
constexpr ActOp kSiluAndMul{"silu_and_mul", Act::kSilu, Quant::kNone};
constexpr ActOp kGeluAndMul{"gelu_and_mul", Act::kGelu, Quant::kNone};
constexpr ActOp kGeluTanhAndMul{"gelu_tanh_and_mul", Act::kGeluTanh, Quant::kNone};
constexpr ActOp kSiluFp8PerToken{"silu_and_mul_fp8_per_token", Act::kSilu, Quant::kPerToken};
constexpr ActOp kSiluFp8PerGroup{"silu_and_mul_fp8_per_group", Act::kSilu, Quant::kPerGroup};
constexpr ActOp kSiluFp8PerTensor{"silu_and_mul_fp8_per_tensor", Act::kSilu, Quant::kPerTensor};
constexpr int kGroup = 128;  // per-group FP8: 1 × 128 groups along d (chapter 08's A operand)

struct ActArgs {
  const __nv_bfloat16* x;  // [T, 2d]
  __nv_bfloat16* y;        // [T, d]  (Quant::kNone)
  uint8_t* q;              // E4M3 [T, d]
  float* scales;           // [T, 1] per token; [d/128, T] per group ([T, d/128] row major)
  const float* scale;      // [1] per tensor: a calibrated input
  int64_t t, d;
  bool act_first = true;  // gate = x[:, :d] (vLLM's silu_and_mul); false: gate = x[:, d:]
  float limit = 0.0f;     // > 0: gate = min(gate, limit), up = clamp(up, −limit, limit)
  float scale_ub = 0.0f;  // per token: > 0 clamps the absmax (chapter 03)
  bool scales_row_major = false;
};

using ActLaunch = Status (*)(const ActArgs& a, cudaStream_t stream);

// `vec`: the BF16 elements per access this launcher uses for this d (x, y aligned to 2·vec
// bytes, q to vec); `max_d`: what its registers allow.
inline Status validate_act(const ActOp& op, const ActArgs& a, int vec, int64_t max_d) {
  const bool quant = op.quant != Quant::kNone;
  Status s = Check()
                 .not_null(a.x, "x")
                 .that(quant || a.y, "y is a null pointer")
                 .that(!quant || a.q, "q is a null pointer")
                 .that(op.quant != Quant::kPerToken && op.quant != Quant::kPerGroup || a.scales,
                       "scales is a null pointer")
                 .that(op.quant != Quant::kPerTensor || a.scale, "scale is a null pointer")
                 .positive(a.t, "T")
                 .positive(a.d, "d")
                 .that(a.t <= kMaxRows, "T must be below 2^31")
                 .that(double(a.t) * double(a.d) <= 0x1p38, "T · d must be below 2^38")
                 .that(a.d <= max_d, "d = " + std::to_string(a.d) + " exceeds this version's " +
                                         std::to_string(max_d))
                 .that(op.quant != Quant::kPerGroup || a.d % kGroup == 0,
                       "per-group quant needs d % 128 == 0, d = " + std::to_string(a.d))
                 .that(std::isfinite(a.limit) && a.limit >= 0.0f, "limit must be finite and >= 0")
                 .that(std::isfinite(a.scale_ub) && a.scale_ub >= 0.0f,
                       "scale_ub must be finite and >= 0")
                 .aligned(a.x, 2 * vec, "x")
                 .aligned(a.y, 2 * vec, "y")
                 .aligned(a.q, vec, "q")
                 .aligned(a.scales, 4, "scales")
                 .aligned(a.scale, 4, "scale")
                 .status();
  if (!s.ok()) return s;
  const int64_t n = a.t * a.d;
  const int64_t scale_count = op.quant == Quant::kPerToken   ? a.t
                              : op.quant == Quant::kPerGroup ? a.t * (a.d / kGroup)
                                                             : 0;
  return check_apart({{a.y, 2 * n, "y"}, {a.q, n, "q"}, {a.scales, 4 * scale_count, "scales"}},
                     {{a.x, 4 * n, "x"}, {a.scale, 4, "scale"}});
}

// Generic Args → ActArgs: the op's tensors (x [, scale] → y | q [, scales]) and params.
inline Status act_args(const ActOp& op, const Args& a, ActArgs* out) {
  const bool quant = op.quant != Quant::kNone, per_tensor = op.quant == Quant::kPerTensor;
  const size_t n_in = per_tensor ? 2 : 1, n_out = quant && !per_tensor ? 2 : 1;
  Status s = Check()
                 .that(a.inputs.size() == n_in && a.outputs.size() == n_out,
                       std::string(op.name) + " takes " + std::to_string(n_in) + " inputs and " +
                           std::to_string(n_out) + " outputs")
                 .status();
  if (!s.ok()) return s;
  const TensorRef& x = a.inputs[0];
  const TensorRef& first = a.outputs[0];
  const DType first_dtype = quant ? DType::kE4M3 : DType::kBF16;
  s = Check()
          .that(x.dtype == DType::kBF16 && x.shape.size() == 2, "x is BF16 [T, 2d]")
          .that(x.shape.size() != 2 || x.dim(1) % 2 == 0, "x's last dim must be even (gate, up)")
          .that(first.dtype == first_dtype && first.shape.size() == 2,
                std::string(quant ? "q" : "y") + " must be " + dtype_name(first_dtype) + " [T, d]")
          .status();
  if (!s.ok()) return s;
  ActArgs r{};
  r.t = x.dim(0);
  r.d = x.dim(1) / 2;
  s = Check()
          .that(first.dim(0) == r.t && first.dim(1) == r.d, "the output must be [T, d] of x [T, 2d]")
          .that(!quant || (a.param("act_first", 1) != 0 && a.param("limit", 0) == 0),
                std::string(op.name) + " is SiLU of the first half, unclamped: it takes no "
                                       "act_first or limit")
          .status();
  if (!s.ok()) return s;
  r.scales_row_major = a.param("scales_row_major", 0) != 0;
  if (op.quant == Quant::kPerToken || op.quant == Quant::kPerGroup) {
    const TensorRef& sc = a.outputs[1];
    const int64_t groups = r.d / kGroup;
    const bool shape_ok =
        op.quant == Quant::kPerToken
            ? sc.shape == std::vector<int64_t>{r.t, 1}
            : sc.shape == (r.scales_row_major ? std::vector<int64_t>{r.t, groups}
                                              : std::vector<int64_t>{groups, r.t});
    s = Check()
            .that(sc.dtype == DType::kF32, "scales are float32")
            .that(shape_ok, op.quant == Quant::kPerToken ? "scales must be [T, 1]"
                            : r.scales_row_major         ? "scales must be [T, d/128]"
                                                         : "scales must be [d/128, T]")
            .status();
    if (!s.ok()) return s;
    r.scales = static_cast<float*>(sc.data);
  }
  if (per_tensor) {
    const TensorRef& sc = a.inputs[1];
    s = Check().that(sc.dtype == DType::kF32 && sc.numel() == 1, "scale is float32 [1]").status();
    if (!s.ok()) return s;
    r.scale = static_cast<const float*>(sc.data);
  }
  r.x = static_cast<const __nv_bfloat16*>(x.data);
  if (quant) {
    r.q = static_cast<uint8_t*>(first.data);
  } else {
    r.y = static_cast<__nv_bfloat16*>(first.data);
  }
  r.act_first = a.param("act_first", 1) != 0;
  r.limit = float(a.param("limit", 0));
  r.scale_ub = float(a.param("scale_ub", 0));
  *out = r;
  return {};
}

inline Version act_version(const ActOp& op, const char* id, const char* summary, ActLaunch launch,
                           std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    ActArgs aa;
    Status s = act_args(op, a, &aa);
    return s.ok() ? launch(aa, stream) : s;
  };
  v.bytes = io_bytes;
  // act ~8 (exp or erf or tanh counted as 4, add, divide, multiply), ×up, the clamp; the quant 2.
  v.flops = [op](const Args& a) {
    const double per = 10.0 + (op.quant != Quant::kNone ? 2.0 : 0.0);
    return per * double(a.outputs.at(0).numel());
  };
  return v;
}

// ---------------------------------------------------------------------------------------------
// The activation arithmetic, shared by every version: FP32 with the accurate library functions,
// the product rounded once to BF16 (the reference rounds once from FP64; silu lands within one
// BF16 ulp, gelu within act_tolerance). The constants are FP32 roundings of sqrt(1/2),
// sqrt(2/π) and 0.044715, as vLLM and FlashInfer spell them.

template <Act kAct>
__device__ __forceinline__ float activation(float g) {
  if constexpr (kAct == Act::kSilu) {
    // Below −80, exp(−g) would overflow while the result, g·e^g, is still a normal FP32 number:
    // there 1 + e^g is 1 and the product is the whole formula.
    return g < -80.0f ? __fmul_rn(g, expf(g)) : __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  } else if constexpr (kAct == Act::kGelu) {
    return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
  } else {
    const float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
    return 0.5f * g * (1.0f + tanhf(inner));
  }
}

// act(gate) · up in FP32, after the optional clamp (limit > 0).
template <Act kAct>
__device__ __forceinline__ float act_and_mul(float gate, float up, float limit) {
  if (limit > 0.0f) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
  }
  return __fmul_rn(activation<kAct>(gate), up);
}

// =============================================================================================
// 2. RoPE and QK-norm + RoPE (v3, v4, v5)

struct RopeOp {
  const char* name;
  bool norm;  // qk_norm_rope: per-head RMSNorm before the rotation
};
constexpr RopeOp kRope{"rope", false};
constexpr RopeOp kQkNormRope{"qk_norm_rope", true};

struct RopeArgs {
  const int64_t* positions;                        // [T]
  const __nv_bfloat16* q;                          // [T, Hq, D]
  const __nv_bfloat16* k;                          // [T, Hk, D]
  __nv_bfloat16* q_out;                            // [T, Hq, D]; == q in place
  __nv_bfloat16* k_out;                            // [T, Hk, D]; == k in place
  const __nv_bfloat16* q_weight;                   // [D] (qk_norm_rope)
  const __nv_bfloat16* k_weight;                   // [D]
  const float* cos_sin;                            // [max_pos, rot_dim]: cos of the angles, then sin
  int64_t t, hq, hk, d, rot_dim, max_pos;
  bool is_neox = true;   // pairs (j, j + rot_dim/2); false: GPT-J's (2j, 2j + 1)
  bool inverse = false;  // rotate by −angle (sin negated)
  float eps = 0.0f;

  __host__ __device__ bool in_place() const { return q_out == q; }
  __host__ __device__ int64_t heads() const { return hq + hk; }
};

using RopeLaunch = Status (*)(const RopeArgs& a, cudaStream_t stream);

// `vec`: BF16 elements per access (q, k, outputs, weights aligned to 2·vec bytes, the cache to
// 4·vec); `max_d`: the head size this launcher's registers hold.
inline Status validate_rope(const RopeOp& op, const RopeArgs& a, int vec, int64_t max_d) {
  Status s = Check()
                 .not_null(a.positions, "positions")
                 .not_null(a.q, "q")
                 .not_null(a.k, "k")
                 .not_null(a.q_out, "q_out")
                 .not_null(a.k_out, "k_out")
                 .not_null(a.cos_sin, "cos_sin_cache")
                 .that(!op.norm || (a.q_weight && a.k_weight), "q_weight or k_weight is null")
                 .positive(a.t, "T")
                 .positive(a.hq, "Hq")
                 .positive(a.hk, "Hk")
                 .positive(a.d, "D")
                 .positive(a.max_pos, "max_pos")
                 .that(a.t <= kMaxRows, "T must be below 2^31")
                 .that(a.rot_dim > 0 && a.rot_dim % 2 == 0 && a.rot_dim <= a.d,
                       "rot_dim = " + std::to_string(a.rot_dim) + " must be even, > 0 and <= D")
                 .that(a.d <= max_d, "D = " + std::to_string(a.d) + " exceeds this version's " +
                                         std::to_string(max_d))
                 .that(a.heads() <= 1024, "Hq + Hk must be <= 1024")
                 .that((a.q_out == a.q) == (a.k_out == a.k),
                       "q and k are both rotated in place or both out of place")
                 .that(!op.norm || (std::isfinite(a.eps) && a.eps >= 0.0f),
                       "eps must be finite and >= 0")
                 .aligned(a.positions, 8, "positions")
                 .aligned(a.q, 2 * vec, "q")
                 .aligned(a.k, 2 * vec, "k")
                 .aligned(a.q_out, 2 * vec, "q_out")
                 .aligned(a.k_out, 2 * vec, "k_out")
                 .aligned(a.q_weight, 2 * vec, "q_weight")
                 .aligned(a.k_weight, 2 * vec, "k_weight")
                 .aligned(a.cos_sin, 4 * vec, "cos_sin_cache")
                 .status();
  if (!s.ok()) return s;
  const int64_t qb = 2 * a.t * a.hq * a.d, kb = 2 * a.t * a.hk * a.d;
  return check_apart({{a.q_out, qb, "q_out", a.q}, {a.k_out, kb, "k_out", a.k}},
                     {{a.positions, 8 * a.t, "positions"},
                      {a.q, qb, "q"},
                      {a.k, kb, "k"},
                      {a.q_weight, 2 * a.d, "q_weight"},
                      {a.k_weight, 2 * a.d, "k_weight"},
                      {a.cos_sin, 4 * a.max_pos * a.rot_dim, "cos_sin_cache"}});
}

inline Status rope_args(const RopeOp& op, const Args& a, RopeArgs* out) {
  const size_t n_in = op.norm ? 6 : 4;
  Status s = Check()
                 .that(a.inputs.size() == n_in && a.outputs.size() == 2,
                       std::string(op.name) + " takes " + std::to_string(n_in) +
                           " inputs and 2 outputs")
                 .that(!op.norm || a.params.count("eps") == 1, "qk_norm_rope needs the param eps")
                 .that(!op.norm || a.param("inverse", 0) == 0, "qk_norm_rope has no inverse")
                 .status();
  if (!s.ok()) return s;
  const TensorRef& pos = a.inputs[0];
  const TensorRef& q = a.inputs[1];
  const TensorRef& k = a.inputs[2];
  const TensorRef& cache = a.inputs.back();
  const TensorRef& q_out = a.outputs[0];
  const TensorRef& k_out = a.outputs[1];
  auto heads = [](const TensorRef& h) { return h.dtype == DType::kBF16 && h.shape.size() == 3; };
  s = Check()
          .that(pos.dtype == DType::kI64 && pos.shape.size() == 1, "positions are int64 [T]")
          .that(heads(q) && heads(k) && heads(q_out) && heads(k_out),
                "q, k, q_out and k_out are BF16 [T, H, D]")
          .that(cache.dtype == DType::kF32 && cache.shape.size() == 2,
                "cos_sin_cache is float32 [max_pos, rot_dim]")
          .status();
  if (!s.ok()) return s;
  RopeArgs r{};
  r.t = q.dim(0);
  r.hq = q.dim(1);
  r.hk = k.dim(1);
  r.d = q.dim(2);
  r.max_pos = cache.dim(0);
  r.rot_dim = cache.dim(1);
  s = Check()
          .that(pos.dim(0) == r.t && k.dim(0) == r.t && k.dim(2) == r.d,
                "positions, q and k must share T (and q, k the head size D)")
          .that(q_out.shape == q.shape && k_out.shape == k.shape,
                "q_out and k_out must have the shapes of q and k")
          .status();
  if (!s.ok()) return s;
  if (op.norm) {
    const TensorRef& qw = a.inputs[3];
    const TensorRef& kw = a.inputs[4];
    s = Check()
            .that(qw.dtype == DType::kBF16 && kw.dtype == DType::kBF16 &&
                      qw.shape == std::vector<int64_t>{r.d} && kw.shape == qw.shape,
                  "q_weight and k_weight are BF16 [D]")
            .status();
    if (!s.ok()) return s;
    r.q_weight = static_cast<const __nv_bfloat16*>(qw.data);
    r.k_weight = static_cast<const __nv_bfloat16*>(kw.data);
    r.eps = float(a.params.at("eps"));
  }
  r.positions = static_cast<const int64_t*>(pos.data);
  r.q = static_cast<const __nv_bfloat16*>(q.data);
  r.k = static_cast<const __nv_bfloat16*>(k.data);
  r.q_out = static_cast<__nv_bfloat16*>(q_out.data);
  r.k_out = static_cast<__nv_bfloat16*>(k_out.data);
  r.cos_sin = static_cast<const float*>(cache.data);
  r.is_neox = a.param("is_neox", 1) != 0;
  r.inverse = a.param("inverse", 0) != 0;
  *out = r;
  return {};
}

// The rotated elements and whatever else a launch moves: whole heads for the norm (and for the
// tail copy out of place), the positions, one cache row per token. The registry's Args do not
// say whether the outputs alias the inputs, so the model is the out-of-place one.
inline double rope_bytes(const RopeOp& op, const Args& a) {
  const TensorRef& q = a.inputs[1];
  const TensorRef& k = a.inputs[2];
  const TensorRef& cache = a.inputs.back();
  const double t = double(q.dim(0)), heads = double(q.dim(1) + k.dim(1)), d = double(q.dim(2));
  double b = 4.0 * t * heads * d + 8.0 * t + 4.0 * t * double(cache.dim(1));
  if (op.norm) b += 4.0 * d;  // the two weights
  return b;
}

inline Version rope_version(const RopeOp& op, const char* id, const char* summary,
                            RopeLaunch launch, std::vector<SassFact> sass = {},
                            Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    RopeArgs ra;
    Status s = rope_args(op, a, &ra);
    return s.ok() ? launch(ra, stream) : s;
  };
  v.bytes = [op](const Args& a) { return rope_bytes(op, a); };
  // 3 per rotated element (two products, one sum); the norm 4 per element (chapter 04's count).
  v.flops = [op](const Args& a) {
    const TensorRef& q = a.inputs[1];
    const TensorRef& k = a.inputs[2];
    return (op.norm ? 7.0 : 3.0) * double(q.dim(0) * (q.dim(1) + k.dim(1)) * q.dim(2));
  };
  return v;
}

// ---------------------------------------------------------------------------------------------
// The rotation of one pair, shared by every version: x' = x c − y s, y' = y c + x s in FP32
// (one product rounded, the other fused into the FMA), each rounded once to BF16 by the caller.
// c, s: this pair's column of the token's cache row; `inverse` negates s.
__device__ __forceinline__ float2 rotate_pair(float x, float y, float c, float s) {
  return make_float2(__fmaf_rn(x, c, -__fmul_rn(y, s)), __fmaf_rn(y, c, __fmul_rn(x, s)));
}

// =============================================================================================
// 3. reshape_and_cache (v6, v7)

enum class Layout { kPaged, kNhd, kHnd };

struct CacheOp {
  const char* name;
  bool fp8;  // E4M3 caches with per-tensor k_scale, v_scale (inputs)
};
constexpr CacheOp kCacheBf16{"reshape_and_cache", false};
constexpr CacheOp kCacheFp8{"reshape_and_cache_fp8", true};
constexpr int kCacheVectorBytes = 16;  // the paged key layout's x: 16 bytes of a head in a row

struct CacheArgs {
  const __nv_bfloat16* key;    // [T, Hk, D]
  const __nv_bfloat16* value;  // [T, Hk, D]
  const int64_t* slots;        // [T]: block · block_size + offset, or −1 (padding)
  const float* k_scale;        // [1] (FP8)
  const float* v_scale;        // [1]
  void* key_cache;             // the layout's shapes (cache_shapes in elementwise.py)
  void* value_cache;
  int64_t t, hk, d, num_blocks, block_size;
  Layout layout = Layout::kPaged;
  bool fp8 = false;

  __host__ __device__ int64_t elem_bytes() const { return fp8 ? 1 : 2; }
  __host__ __device__ int64_t x() const { return kCacheVectorBytes / elem_bytes(); }  // paged key: 8 BF16 or 16 FP8
  __host__ __device__ int64_t cache_elems() const { return num_blocks * block_size * hk * d; }
};

using CacheLaunch = Status (*)(const CacheArgs& a, cudaStream_t stream);

// `vec`: BF16 elements per access of key and value (the caches aligned to vec elements).
inline Status validate_cache(const CacheOp& op, const CacheArgs& a, int vec) {
  Status s = Check()
                 .not_null(a.key, "key")
                 .not_null(a.value, "value")
                 .not_null(a.slots, "slot_mapping")
                 .not_null(a.key_cache, "key_cache")
                 .not_null(a.value_cache, "value_cache")
                 .that(!op.fp8 || (a.k_scale && a.v_scale), "k_scale or v_scale is null")
                 .positive(a.t, "T")
                 .positive(a.hk, "Hk")
                 .positive(a.d, "D")
                 .positive(a.num_blocks, "num_blocks")
                 .positive(a.block_size, "block_size")
                 .that(a.t <= kMaxRows, "T must be below 2^31")
                 .that(a.hk * a.d <= (int64_t(1) << 20), "Hk · D must be <= 2^20")
                 .that(double(a.num_blocks) * double(a.block_size) < 0x1p31,
                       "the cache must hold fewer than 2^31 slots")
                 .that(a.layout != Layout::kPaged || a.d % a.x() == 0,
                       "the paged key layout needs D % " + std::to_string(a.x()) + " == 0")
                 .aligned(a.key, 2 * vec, "key")
                 .aligned(a.value, 2 * vec, "value")
                 .aligned(a.slots, 8, "slot_mapping")
                 .aligned(a.k_scale, 4, "k_scale")
                 .aligned(a.v_scale, 4, "v_scale")
                 .aligned(a.key_cache, int(a.elem_bytes()) * vec, "key_cache")
                 .aligned(a.value_cache, int(a.elem_bytes()) * vec, "value_cache")
                 .status();
  if (!s.ok()) return s;
  const int64_t kv = 2 * a.t * a.hk * a.d, cache = a.cache_elems() * a.elem_bytes();
  return check_apart({{a.key_cache, cache, "key_cache"}, {a.value_cache, cache, "value_cache"}},
                     {{a.key, kv, "key"},
                      {a.value, kv, "value"},
                      {a.slots, 8 * a.t, "slot_mapping"},
                      {a.k_scale, 4, "k_scale"},
                      {a.v_scale, 4, "v_scale"}});
}

inline Status cache_args(const CacheOp& op, const Args& a, CacheArgs* out) {
  const size_t n_in = op.fp8 ? 5 : 3;
  const double layout = a.param("layout", -1);
  Status s = Check()
                 .that(a.inputs.size() == n_in && a.outputs.size() == 2,
                       std::string(op.name) + " takes " + std::to_string(n_in) +
                           " inputs and 2 outputs")
                 .that(layout == 0 || layout == 1 || layout == 2,
                       "the param layout must be 0 (paged), 1 (NHD) or 2 (HND)")
                 .status();
  if (!s.ok()) return s;
  const TensorRef& key = a.inputs[0];
  const TensorRef& value = a.inputs[1];
  const TensorRef& slots = a.inputs[2];
  const TensorRef& kc = a.outputs[0];
  const TensorRef& vc = a.outputs[1];
  const DType cache_dtype = op.fp8 ? DType::kE4M3 : DType::kBF16;
  s = Check()
          .that(key.dtype == DType::kBF16 && key.shape.size() == 3 && value.shape == key.shape &&
                    value.dtype == DType::kBF16,
                "key and value are BF16 [T, Hk, D] of one shape")
          .that(slots.dtype == DType::kI64 && slots.shape.size() == 1,
                "slot_mapping is int64 [T]")
          .that(kc.dtype == cache_dtype && vc.dtype == cache_dtype,
                std::string("the caches are ") + dtype_name(cache_dtype))
          .that(!op.fp8 || (a.inputs[3].dtype == DType::kF32 && a.inputs[3].numel() == 1 &&
                            a.inputs[4].dtype == DType::kF32 && a.inputs[4].numel() == 1),
                "k_scale and v_scale are float32 [1]")
          .status();
  if (!s.ok()) return s;
  CacheArgs r{};
  r.t = key.dim(0);
  r.hk = key.dim(1);
  r.d = key.dim(2);
  r.fp8 = op.fp8;
  r.layout = static_cast<Layout>(int(layout));
  const int64_t x = r.x();
  std::vector<int64_t> want_k, want_v;
  if (kc.shape.size() >= 4) {
    r.num_blocks = kc.dim(0);
    r.block_size = kc.dim(r.layout == Layout::kPaged ? 3 : r.layout == Layout::kNhd ? 1 : 2);
  }
  switch (r.layout) {
    case Layout::kPaged:
      want_k = {r.num_blocks, r.hk, r.d / x, r.block_size, x};
      want_v = {r.num_blocks, r.hk, r.d, r.block_size};
      break;
    case Layout::kNhd: want_k = want_v = {r.num_blocks, r.block_size, r.hk, r.d}; break;
    case Layout::kHnd: want_k = want_v = {r.num_blocks, r.hk, r.block_size, r.d}; break;
  }
  s = Check()
          .that(slots.dim(0) == r.t, "slot_mapping must have T entries")
          .that(r.layout != Layout::kPaged || r.d % x == 0,
                "the paged key layout needs D % " + std::to_string(x) + " == 0")
          .that(kc.shape == want_k && vc.shape == want_v,
                "the caches' shapes do not match the layout for these Hk and D")
          .status();
  if (!s.ok()) return s;
  r.key = static_cast<const __nv_bfloat16*>(key.data);
  r.value = static_cast<const __nv_bfloat16*>(value.data);
  r.slots = static_cast<const int64_t*>(slots.data);
  if (op.fp8) {
    r.k_scale = static_cast<const float*>(a.inputs[3].data);
    r.v_scale = static_cast<const float*>(a.inputs[4].data);
  }
  r.key_cache = kc.data;
  r.value_cache = vc.data;
  *out = r;
  return {};
}

// What one launch moves when every token is valid: key and value read, the same elements
// written in the cache's dtype, the slots (and the two scales). Not the caches' whole size.
inline double cache_bytes(const CacheOp& op, const Args& a) {
  const TensorRef& key = a.inputs[0];
  const double elems = double(key.numel());
  return 2.0 * elems * (2.0 + (op.fp8 ? 1.0 : 2.0)) + 8.0 * double(key.dim(0)) +
         (op.fp8 ? 8.0 : 0.0);
}

inline Version cache_version(const CacheOp& op, const char* id, const char* summary,
                             CacheLaunch launch, std::vector<SassFact> sass = {},
                             Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    CacheArgs ca;
    Status s = cache_args(op, a, &ca);
    return s.ok() ? launch(ca, stream) : s;
  };
  v.bytes = [op](const Args& a) { return cache_bytes(op, a); };
  v.flops = [op](const Args& a) { return op.fp8 ? 2.0 * double(a.inputs[0].numel()) : 0.0; };
  return v;
}

// Where element i of head h of the token at (block b, offset o) lives in each cache: the
// layouts of elementwise.py's cache_index. x: the paged key layout's vector (8 BF16 or 16 FP8).
template <Layout kLayout>
__device__ __forceinline__ int64_t key_offset(int64_t b, int64_t o, int64_t h, int64_t i,
                                              int64_t hk, int64_t d, int64_t bs, int64_t x) {
  if constexpr (kLayout == Layout::kPaged) {
    return (((b * hk + h) * (d / x) + i / x) * bs + o) * x + i % x;  // [B, Hk, D/x, bs, x]
  } else if constexpr (kLayout == Layout::kNhd) {
    return ((b * bs + o) * hk + h) * d + i;  // [B, bs, Hk, D]
  } else {
    return ((b * hk + h) * bs + o) * d + i;  // [B, Hk, bs, D]
  }
}

template <Layout kLayout>
__device__ __forceinline__ int64_t value_offset(int64_t b, int64_t o, int64_t h, int64_t i,
                                                int64_t hk, int64_t d, int64_t bs) {
  if constexpr (kLayout == Layout::kPaged) {
    return ((b * hk + h) * d + i) * bs + o;  // [B, Hk, D, bs]: a token's head is a column
  } else {
    return key_offset<kLayout>(b, o, h, i, hk, d, bs, 1);
  }
}

// An FP8 cache element: e4m3_satfinite(fp32(v · inv)), inv = fp32(1 / scale) (chapter 03's
// rule; vLLM divides, which now and then differs in the last FP32 bit, so in one E4M3 code).
__device__ __forceinline__ uint8_t kv_fp8(float v, float inv) {
  return uint8_t(quant::quantize_e4m3x2(v, 0.0f, inv) & 0xff);
}

// A unit of kVec elements as the cache stores it (v7, v8): the BF16 bits (16 bytes for 8), or the
// E4M3 codes (8 bytes for 8, one byte for one).
template <bool kFp8, int kVec>
using CacheUnit = std::conditional_t<kFp8, std::conditional_t<kVec == 8, uint2, uint8_t>, Bf16Vec<kVec>>;

template <bool kFp8, int kVec>
__device__ __forceinline__ CacheUnit<kFp8, kVec> to_cache_unit(const Bf16Vec<kVec>& v, float inv) {
  if constexpr (!kFp8) {
    return v;
  } else if constexpr (kVec == 8) {
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      w[h] = quant::quantize_e4m3x2(get(v, 4 * h), get(v, 4 * h + 1), inv) |
             uint32_t(quant::quantize_e4m3x2(get(v, 4 * h + 2), get(v, 4 * h + 3), inv)) << 16;
    return make_uint2(w[0], w[1]);
  } else {
    return kv_fp8(get(v, 0), inv);
  }
}

}  // namespace lkw::elementwise
