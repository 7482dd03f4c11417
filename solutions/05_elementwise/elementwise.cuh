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
//   qkv_rope_cache                  positions, qkv [T, Hq + 2·Hk, D], cos_sin, slot_mapping →
//                                   the BF16 caches (k rotated, v as is), q_out rotated: rope
//                                   and reshape_and_cache in one pass over a QKV GEMM's output
// q_out, k_out may be q, k exactly (in place, vLLM's signature): then a partial rotation leaves
// the other D − rot_dim elements untouched; out of place they are copied.
//
// Bytes per element (every op is a handful of FP32 operations per byte: all of them are judged
// by bytes against the copy ceiling):
//   act_and_mul 6 B (gate, up read; y written)   fused FP8 quant 5 B (vs 9 B: y out and back in)
//   rope 4 B over rot_dim                        qk_norm_rope 4 B (vs 8 B: a norm pass, a rope pass)
//   reshape_and_cache 4 + 2·(cache bytes) per element of key and value: 8 B BF16, 6 B FP8
//   qkv_rope_cache 4 B per element of qkv (vs 8 to 12 B: the layer's copies of its slices)
//
// versions: v0_act_scalar → v1_act_vec16 → v2_act_fused_fp8 (the three quant ops; their contract
// below); v3_rope_scalar → v4_rope_vec16 → v5_qk_norm_rope (rope.cuh); v6_cache_scalar →
// v7_cache_vec16 → v8_cache_staged (cache.cuh); v9_qkv_rope_cache (v4's items and v8's tile in
// one kernel; its contract in cache.cuh).
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

}  // namespace lkw::elementwise
