// v5_qk_norm_rope — Qwen3's per-head RMSNorm of q and k, then RoPE, in one pass over the heads.
//
// Since v4: between load and rotate, a norm stage. A head's lanes already hold all of its
// elements (items and tail units, the tail now always loaded: it is normalized too), so the sum
// of squares is a per-lane sum and a butterfly over the head's lanes (lanes is a power of two, a
// group never straddles a warp) — no shared memory, no second read. Then every element becomes
// n = bf16(bf16(h · rstd) · w) (chapter 04's rounding points; w = q_weight for q's heads,
// k_weight for k's) and the items rotate n. The shuffles need every lane of a warp, so the
// heads are walked in passes that all lanes take together, lanes past the last head idle.
// The unfused chain (chain_unfused: chapter 04's norm over q's and k's heads, then v4) moves
// 8 bytes per element; this moves 4.
// Expect: ≥ 85% of the copy ceiling at T = 8192 (Qwen3-8B: 40 heads of 128); the rstd's summation
// order differs from chapter 04's, so n agrees with the chain within 2 BF16 ulps, not bit for bit.
// SASS: LDG.E.128, STG.E.128, SHFL.BFLY.
#include "rope.cuh"

namespace lkw::elementwise {
namespace {

using rmsnorm::bf16;
using rmsnorm::f32;

template <int kVec>
__device__ __forceinline__ float sum_squares(const Bf16Vec<kVec>& v, float ss) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) ss = __fmaf_rn(get(v, j), get(v, j), ss);
  return ss;
}

// n = bf16(bf16(v · rstd) · w) in place of v.
template <int kVec>
__device__ __forceinline__ void normalize(Bf16Vec<kVec>& v, const Bf16Vec<kVec>& w, float rstd) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) put(v, j, __fmul_rn(f32(bf16(__fmul_rn(get(v, j), rstd))), get(w, j)));
}

template <bool kNeox, int kPairs>
__global__ void __launch_bounds__(1024) qk_norm_rope_v5_kernel(RopeArgs a, int lanes) {
  using Tile = RopeTile<kPairs>;
  constexpr int kTailVec = Tile::kTailVec;
  using Tail = Bf16Vec<kTailVec>;
  const int64_t token = blockIdx.x;
  const int64_t pos = a.positions[token];  // (T)
  if (pos < 0 || pos >= a.max_pos) return;  // the whole block: no lane is left in a shuffle
  const float* row = a.cos_sin + pos * a.rot_dim;  // (max_pos, rot_dim)
  const int half = int(a.rot_dim / 2), items = half / kPairs, lane = threadIdx.x % lanes;
  const int tail_units = int(a.d - a.rot_dim) / kTailVec;
  const int heads_per_pass = blockDim.x / lanes;
  for (int64_t first = 0; first < a.heads(); first += heads_per_pass) {
    const int64_t h = first + threadIdx.x / lanes;
    const bool active = h < a.heads();
    const HeadPtrs p = active ? head_ptrs(a, token, h) : HeadPtrs{};
    Item<kPairs> it[Tile::kMaxItems];
    Tail tail[Tile::kMaxTail];
    // Stage: load the lane's items and tail units, summing their squares.
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < Tile::kMaxItems; ++i) {
      const int u = lane + i * lanes;
      if (!active || u >= items) break;
      const int2 off = item_offsets<kNeox, kPairs>(u, half);
      it[i].a = *reinterpret_cast<const Bf16Vec<kPairs>*>(p.src + off.x);  // (D)
      it[i].b = *reinterpret_cast<const Bf16Vec<kPairs>*>(p.src + off.y);
      ss = sum_squares(it[i].b, sum_squares(it[i].a, ss));
    }
#pragma unroll
    for (int i = 0; i < Tile::kMaxTail; ++i) {
      const int u = lane + i * lanes;
      if (!active || u >= tail_units) break;
      tail[i] = *reinterpret_cast<const Tail*>(p.src + a.rot_dim + int64_t(u) * kTailVec);
      ss = sum_squares(tail[i], ss);
    }
    // Stage: the head's sum over its lanes (every lane of the warp takes part).
    // BEGIN SOLUTION: v5 — butterfly over the group's lanes, then rstd as chapter 04 forms it
    for (int offset = lanes / 2; offset > 0; offset >>= 1)
      ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, offset));
    const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(ss, float(a.d)), a.eps));
    // STUB: const float rstd = 0.0f;
    // END SOLUTION
    if (!active) continue;
    // Stage: normalize, rotate the items, store; normalize and store the tail.
#pragma unroll
    for (int i = 0; i < Tile::kMaxItems; ++i) {
      const int u = lane + i * lanes;
      if (u >= items) break;
      const int2 off = item_offsets<kNeox, kPairs>(u, half);
      const Bf16Vec<kPairs> wa = *reinterpret_cast<const Bf16Vec<kPairs>*>(p.weight + off.x);
      const Bf16Vec<kPairs> wb = *reinterpret_cast<const Bf16Vec<kPairs>*>(p.weight + off.y);
      normalize(it[i].a, wa, rstd);  // (D)
      normalize(it[i].b, wb, rstd);
      rotate_item<kNeox>(it[i], cos_sin_of<kPairs>(row, u, half, a.inverse));
      *reinterpret_cast<Bf16Vec<kPairs>*>(p.dst + off.x) = it[i].a;
      *reinterpret_cast<Bf16Vec<kPairs>*>(p.dst + off.y) = it[i].b;
    }
#pragma unroll
    for (int i = 0; i < Tile::kMaxTail; ++i) {
      const int u = lane + i * lanes;
      if (u >= tail_units) break;
      const int64_t at = a.rot_dim + int64_t(u) * kTailVec;
      const Tail w = *reinterpret_cast<const Tail*>(p.weight + at);
      normalize(tail[i], w, rstd);
      *reinterpret_cast<Tail*>(p.dst + at) = tail[i];
    }
  }
}

template <bool kNeox, int kPairs>
void launch(const RopeArgs& a, cudaStream_t stream) {
  const int64_t items = a.rot_dim / 2 / kPairs;
  const int64_t tail = (a.d - a.rot_dim) / RopeTile<kPairs>::kTailVec;
  const int lanes = rope_lanes(items, tail);
  const int64_t threads = std::min<int64_t>((lanes * a.heads() + 31) / 32 * 32, 1024);
  qk_norm_rope_v5_kernel<kNeox, kPairs><<<unsigned(a.t), unsigned(threads), 0, stream>>>(a, lanes);
}

Status qk_norm_rope_v5(const RopeArgs& a, cudaStream_t stream) {
  const int pairs = rope_pairs(a.d, a.rot_dim);
  Status s = validate_rope(kQkNormRope, a, pairs, rope_max_d(a.d, a.rot_dim));
  if (!s.ok()) return s;
  if (pairs == 8) {
    a.is_neox ? launch<true, 8>(a, stream) : launch<false, 8>(a, stream);
  } else {
    a.is_neox ? launch<true, 1>(a, stream) : launch<false, 1>(a, stream);
  }
  return last_launch_status(kQkNormRope.name);
}

const Register kRegistered{rope_version(
    kQkNormRope, "v5_qk_norm_rope", "per-head RMSNorm in the lane group, then v4's rotation",
    qk_norm_rope_v5,
    {{"qk_norm_rope_v5_kernelILb1ELi8E", {}, {"LDG.E.128", "STG.E.128", "SHFL.BFLY"}, {}, true,
      "16-byte items, the head's sum by butterfly"}})};

}  // namespace
}  // namespace lkw::elementwise
