// v4_rope_vec16 — a block per token, a group of lanes per head, 8 pairs a lane in 16-byte vectors.
//
// Since v3: a lane owns an item of 8 whole pairs (rope.cuh): NEOX's x's come in one 16-byte
// load and their y's, rot/2 elements further, in another; GPT-J's 8 pairs are 16 contiguous
// elements, the same two loads. The item's cos and sin are two 16-byte loads each, shared by
// every head of the token (a block is one token, so its heads hit the same cache row in L1), and
// the position is read once per block instead of once per pair. A head takes as few lanes as
// hold its items (a power of two: 8 for D = 128), so a warp rotates 4 heads at once and a token
// of Llama-3-8B (40 heads) is one block of 320 threads. Out of place, the tail past rot_dim is
// copied in 16-byte units by the same lanes; in place it is not touched.
// A rot_dim that is not a multiple of 16 (or D not a multiple of 8) takes the same kernel with
// items of one pair.
// Expect: ≥ 85% of the copy ceiling at T = 8192 (4 B per element, the cache row from L1);
// SASS: LDG.E.128 and STG.E.128.
#include "rope.cuh"

namespace lkw::elementwise {
namespace {

template <bool kNeox, int kPairs>
__global__ void __launch_bounds__(1024) rope_v4_kernel(RopeArgs a, int lanes) {
  using Tile = RopeTile<kPairs>;
  constexpr int kTailVec = Tile::kTailVec;
  const int64_t token = blockIdx.x;
  const int64_t pos = a.positions[token];  // (T)
  if (pos < 0 || pos >= a.max_pos) return;  // outside the cache: the token is not written
  const float* row = a.cos_sin + pos * a.rot_dim;  // (max_pos, rot_dim)
  const int half = int(a.rot_dim / 2), items = half / kPairs, lane = threadIdx.x % lanes;
  const int tail_units = a.in_place() ? 0 : int(a.d - a.rot_dim) / kTailVec;
  const int heads_per_pass = blockDim.x / lanes;
  for (int64_t h = threadIdx.x / lanes; h < a.heads(); h += heads_per_pass) {
    const HeadPtrs p = head_ptrs(a, token, h);
    Item<kPairs> it[Tile::kMaxItems];
    // Stage: load the lane's items.
#pragma unroll
    for (int i = 0; i < Tile::kMaxItems; ++i) {
      const int u = lane + i * lanes;
      if (u >= items) break;
      const int2 off = item_offsets<kNeox, kPairs>(u, half);
      it[i].a = *reinterpret_cast<const Bf16Vec<kPairs>*>(p.src + off.x);  // (D)
      it[i].b = *reinterpret_cast<const Bf16Vec<kPairs>*>(p.src + off.y);
    }
    // Stage: rotate and store.
#pragma unroll
    for (int i = 0; i < Tile::kMaxItems; ++i) {
      const int u = lane + i * lanes;
      if (u >= items) break;
      rotate_item<kNeox>(it[i], cos_sin_of<kPairs>(row, u, half, a.inverse));
      const int2 off = item_offsets<kNeox, kPairs>(u, half);
      *reinterpret_cast<Bf16Vec<kPairs>*>(p.dst + off.x) = it[i].a;
      *reinterpret_cast<Bf16Vec<kPairs>*>(p.dst + off.y) = it[i].b;
    }
    // Stage: the tail, out of place only.
#pragma unroll
    for (int i = 0; i < Tile::kMaxTail; ++i) {
      const int u = lane + i * lanes;
      if (u >= tail_units) break;
      const int64_t at = a.rot_dim + int64_t(u) * kTailVec;
      *reinterpret_cast<Bf16Vec<kTailVec>*>(p.dst + at) =
          *reinterpret_cast<const Bf16Vec<kTailVec>*>(p.src + at);
    }
  }
}

template <bool kNeox, int kPairs>
void launch(const RopeArgs& a, cudaStream_t stream) {
  const int64_t items = a.rot_dim / 2 / kPairs;
  const int64_t tail = a.in_place() ? 0 : (a.d - a.rot_dim) / RopeTile<kPairs>::kTailVec;
  const int lanes = rope_lanes(items, tail);
  const int64_t threads = std::min<int64_t>((lanes * a.heads() + 31) / 32 * 32, 1024);
  rope_v4_kernel<kNeox, kPairs><<<unsigned(a.t), unsigned(threads), 0, stream>>>(a, lanes);
}

Status rope_v4(const RopeArgs& a, cudaStream_t stream) {
  const int pairs = rope_pairs(a.d, a.rot_dim);
  Status s = validate_rope(kRope, a, pairs, rope_max_d(a.d, a.rot_dim));
  if (!s.ok()) return s;
  if (pairs == 8) {
    a.is_neox ? launch<true, 8>(a, stream) : launch<false, 8>(a, stream);
  } else {
    a.is_neox ? launch<true, 1>(a, stream) : launch<false, 1>(a, stream);
  }
  return last_launch_status(kRope.name);
}

const Register kRegistered{rope_version(
    kRope, "v4_rope_vec16", "a block per token, a lane group per head, 8 pairs in 16-byte vectors",
    rope_v4,
    {{"rope_v4_kernelILb1ELi8E", {}, {"LDG.E.128", "STG.E.128"}, {}, true,
      "NEOX items: 16-byte loads and stores"},
     {"rope_v4_kernelILb0ELi8E", {}, {"LDG.E.128", "STG.E.128"}, {}, true,
      "GPT-J items: the same 16-byte accesses"}})};

}  // namespace
}  // namespace lkw::elementwise
