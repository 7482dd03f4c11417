// Chapter 05 — RoPE and QK-norm + RoPE: their contract (every rope version: the ops, the
// arguments and their checks, the rotation of one pair), then the head routine of v4 (rope), v5
// (qk_norm_rope) and the chain: a group of lanes per head, each lane owning whole rotated pairs,
// so that no lane ever needs another lane's element.
//
// An item is kPairs pairs of one head held in two BF16 vectors A and B:
//   NEOX  (pairs j, j + rot/2)    A = h[kPairs·u, +kPairs), B = h[rot/2 + kPairs·u, +kPairs):
//                                 pair e of the item is (A[e], B[e])
//   GPT-J (pairs 2j, 2j + 1)      A = h[2·kPairs·u, +kPairs), B = the next kPairs elements:
//                                 pair e is (A[2e], A[2e + 1]) for e < kPairs/2, then B's
// kPairs = 8 (16-byte vectors: rot_dim % 16 == 0 and D % 8 == 0) or 1 (any even rot_dim). Both
// styles cost the same bytes; only which elements share an item differs. The cos and sin of an
// item's pairs are columns kPairs·u … of the token's cache row (two 16-byte loads each).
// The elements past rot_dim (the tail) travel as units of kTailVec, only where they must be
// written: out of place (copied), or normalized (v5).
#pragma once
#include "elementwise.cuh"

namespace lkw::elementwise {

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
// The head routine of v4, v5 and the chain (above).

template <int kPairs>
struct RopeTile {
  static_assert(kPairs == 8 || kPairs == 1, "16-byte items or single pairs");
  static constexpr int kMaxItems = kPairs == 8 ? 1 : 4;  // per lane, at 32 lanes a head
  static constexpr int kTailVec = kPairs == 8 ? 8 : 1;
  static constexpr int kMaxTail = kPairs == 8 ? 2 : 8;
  static constexpr int64_t kMaxD = kPairs == 8 ? 512 : 256;  // what those registers hold
};

inline int rope_pairs(int64_t d, int64_t rot_dim) { return d % 8 == 0 && rot_dim % 16 == 0 ? 8 : 1; }
inline int64_t rope_max_d(int64_t d, int64_t rot_dim) {
  return rope_pairs(d, rot_dim) == 8 ? RopeTile<8>::kMaxD : RopeTile<1>::kMaxD;
}

// Lanes per head: a power of two (a group never straddles a warp), as few as give every lane at
// most kMaxItems items and kMaxTail tail units.
inline int rope_lanes(int64_t items, int64_t tail_units) {
  int lanes = 1;
  while (lanes < 32 && (lanes < items || lanes < tail_units)) lanes *= 2;
  return lanes;
}

// Where item u's two vectors start inside a head (elements).
template <bool kNeox, int kPairs>
__device__ __forceinline__ int2 item_offsets(int u, int half) {
  return kNeox ? make_int2(kPairs * u, half + kPairs * u)
               : make_int2(2 * kPairs * u, 2 * kPairs * u + kPairs);
}

template <int kPairs>
struct Item {
  Bf16Vec<kPairs> a, b;
};

// Pair e of an item as (x, y), and its rotated values written back (rounded to BF16).
template <bool kNeox, int kPairs>
__device__ __forceinline__ float2 pair_of(const Item<kPairs>& it, int e) {
  if constexpr (kNeox || kPairs == 1) {
    return make_float2(get(it.a, e), get(it.b, e));
  } else {
    const Bf16Vec<kPairs>& v = e < kPairs / 2 ? it.a : it.b;
    const int j = 2 * (e % (kPairs / 2));
    return make_float2(get(v, j), get(v, j + 1));
  }
}

template <bool kNeox, int kPairs>
__device__ __forceinline__ void set_pair(Item<kPairs>& it, int e, float2 xy) {
  if constexpr (kNeox || kPairs == 1) {
    put(it.a, e, xy.x);
    put(it.b, e, xy.y);
  } else {
    Bf16Vec<kPairs>& v = e < kPairs / 2 ? it.a : it.b;
    const int j = 2 * (e % (kPairs / 2));
    put(v, j, xy.x);
    put(v, j + 1, xy.y);
  }
}

// The cos and sin of item u's pairs (sin negated for the inverse rotation).
template <int kPairs>
struct CosSin {
  float c[kPairs], s[kPairs];
};

template <int kPairs>
__device__ __forceinline__ CosSin<kPairs> cos_sin_of(const float* row, int u, int half,
                                                     bool inverse) {
  CosSin<kPairs> cs;
  if constexpr (kPairs == 8) {
    const float4* c4 = reinterpret_cast<const float4*>(row + kPairs * u);  // (rot/2) cos
    const float4* s4 = reinterpret_cast<const float4*>(row + half + kPairs * u);  // (rot/2) sin
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 c = __ldg(c4 + h), s = __ldg(s4 + h);  // read-only: the whole block shares the row
      cs.c[4 * h] = c.x, cs.c[4 * h + 1] = c.y, cs.c[4 * h + 2] = c.z, cs.c[4 * h + 3] = c.w;
      cs.s[4 * h] = s.x, cs.s[4 * h + 1] = s.y, cs.s[4 * h + 2] = s.z, cs.s[4 * h + 3] = s.w;
    }
  } else {
    cs.c[0] = row[u];
    cs.s[0] = row[half + u];
  }
#pragma unroll
  for (int e = 0; e < kPairs; ++e) cs.s[e] = inverse ? -cs.s[e] : cs.s[e];
  return cs;
}

// Stage: rotate every pair of an item in place.
template <bool kNeox, int kPairs>
__device__ __forceinline__ void rotate_item(Item<kPairs>& it, const CosSin<kPairs>& cs) {
  // BEGIN SOLUTION: v4 — each pair through rotate_pair with its column's cos and sin
#pragma unroll
  for (int e = 0; e < kPairs; ++e) {
    const float2 xy = pair_of<kNeox>(it, e);
    set_pair<kNeox>(it, e, rotate_pair(xy.x, xy.y, cs.c[e], cs.s[e]));
  }
  // END SOLUTION
}

// Head h of token t: the source (q or k) and the destination (q_out or k_out), and the weight.
struct HeadPtrs {
  const __nv_bfloat16* src;
  __nv_bfloat16* dst;
  const __nv_bfloat16* weight;
};
__device__ __forceinline__ HeadPtrs head_ptrs(const RopeArgs& a, int64_t token, int64_t h) {
  const bool is_q = h < a.hq;
  const int64_t at = is_q ? (token * a.hq + h) * a.d : (token * a.hk + h - a.hq) * a.d;  // (T, H, D)
  return {(is_q ? a.q : a.k) + at, (is_q ? a.q_out : a.k_out) + at, is_q ? a.q_weight : a.k_weight};
}

}  // namespace lkw::elementwise
