// The head routine of v4 (rope), v5 (qk_norm_rope) and the chain: a group of lanes per head,
// each lane owning whole rotated pairs, so that no lane ever needs another lane's element.
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
