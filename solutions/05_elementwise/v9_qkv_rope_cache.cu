// v9_qkv_rope_cache — RoPE and reshape_and_cache fused: one pass from the QKV GEMM's output.
//
// Since v4 and v8: in a layer, q, k and v are slices of one [T, Hq + 2·Hk, D] GEMM output, and
// the chain v4 → v8 needs them as tensors of their own: q and k copied out (4 B an element), v4
// writing the rotated copies (4 B), v copied (4 B), v8 moving k and v into the cache (4 B):
// 8 B an element of q and v, 12 of k, in five launches. v9 reads each head of qkv once and writes
// it once where it ends: query heads rotated into q_out, key heads rotated straight into the key
// cache, value heads into the value cache: 4 B an element, one launch. The pieces are v4's items
// (a lane owns 8 whole pairs) and v8's tile (kTile tokens of one KV head a block, the paged value
// column staged in shared memory); a block also takes the query heads of its KV head's group
// (g, g + Hk, ...), so that one block's tokens share their positions' cos/sin rows in L1.
// Expect: prefill near the copy ceiling over 4 B an element; decode one launch in place of five,
// its loads asked for before its stores (two trips to memory a step, not four).
// SASS: LDG.E.128 and STG.E.128 (q_out, the key cache); the paged value column STG.E.U16.
#include "cache.cuh"
#include "rope.cuh"

namespace lkw::elementwise {
namespace {

constexpr int kTile = 16;  // tokens a block: v8's (a sector of BF16 offsets of the value column)
constexpr int kThreads = 256;
constexpr int kMaxTileD = 512;  // a head's elements in the staged value tile
constexpr int kVec = 8;         // 16-byte items: rot_dim % 16 == 0, D % 8 == 0

// grid (⌈T / kTile⌉, Hk): block (tile, g) takes tokens kTile·tile .. + kTile − 1 of KV head g.
template <bool kNeox, Layout kLayout>
__global__ void __launch_bounds__(kThreads) qkv_v9_kernel(QkvArgs a) {
  constexpr int kPad = kVec;  // v8's: the column reads of 16 tokens spread over the banks
  __shared__ const float* row_sh[kTile];    // each token's cos/sin row; null: skipped
  __shared__ int b_sh[kTile], o_sh[kTile];  // its cache block and offset; b < 0: not cached
  __shared__ alignas(16) uint16_t v_sh[kLayout == Layout::kPaged ? kTile * (kMaxTileD + kPad) : 1];
  const int64_t t0 = int64_t(blockIdx.x) * kTile;
  const int g = blockIdx.y, d = int(a.d), heads = int(a.heads()), hq = int(a.hq), hk = int(a.hk);
  if (threadIdx.x < kTile) {
    // Position and slot asked for together: at decode each is a trip to memory, and the slot
    // need not wait for the position's check.
    const int64_t token = t0 + threadIdx.x;
    const int64_t pos = token < a.t ? a.positions[token] : -1;   // (T)
    const int64_t slot = token < a.t ? a.slots[token] : -1;      // (T)
    const bool live = pos >= 0 && pos < a.max_pos;
    const bool cached = live && slot >= 0 && slot < a.num_blocks * a.block_size;
    row_sh[threadIdx.x] = live ? a.cos_sin + pos * a.rot_dim : nullptr;  // (max_pos, rot_dim)
    b_sh[threadIdx.x] = cached ? int(slot / a.block_size) : -1;
    o_sh[threadIdx.x] = cached ? int(slot % a.block_size) : 0;
  }
  __syncthreads();
  // Head `head` of a token in qkv (T, H, D).
  auto src = [&](int64_t token, int head) { return a.qkv + (token * heads + head) * d; };
  // Load early: this thread's first 16 bytes of the value head (at D <= 128 its only ones), asked
  // for before the rotations. Their stores come first in the program, and no load moves above a
  // store that may alias it: at decode the value would wait a second trip to memory.
  const int units = d / kVec, row_elems = d + kPad;
  auto v_src = [&](int u) { return src(t0 + u / units, hq + hk + g) + u % units * kVec; };
  Bf16Vec<kVec> v_first{};
  if (threadIdx.x < kTile * units && b_sh[threadIdx.x / units] >= 0)
    v_first = *reinterpret_cast<const Bf16Vec<kVec>*>(v_src(threadIdx.x));

  // Rotate: the group's query heads (g, g + Hk, ...) and its key head, kTile tokens each; a unit
  // is an item of 8 pairs or a 16-byte piece of the tail past rot_dim (copied: both destinations
  // are out of place). Units go token by token (u: token, then head, then item), so a decode
  // step's one token takes the loop's first pass only: each pass ends in stores that the next
  // pass's loads wait behind.
  const int half = int(a.rot_dim / 2), items = half / kVec,
            per_head = items + (d - 2 * half) / kVec;
  const int nq = g < hq ? (hq - g + hk - 1) / hk : 0, per_token = (nq + 1) * per_head;
  for (int u = threadIdx.x; u < kTile * per_token; u += blockDim.x) {
    const int tt = u / per_token, hi = u % per_token / per_head, j = u % per_head;
    const float* const row = row_sh[tt];
    const bool is_k = hi == nq;
    if (!row || (is_k && b_sh[tt] < 0)) continue;
    const int64_t token = t0 + tt;
    const int head = is_k ? hq + g : g + hi * hk;
    const __nv_bfloat16* const h = src(token, head);
    // Where element i (a multiple of 8) of this head goes: its q_out row, or its key cache slot
    // (the paged layout's x is 8 BF16: 8 elements from a multiple of 8 stay contiguous).
    auto dst = [&](int i) {
      return is_k ? a.key_cache +
                        key_offset<kLayout>(b_sh[tt], o_sh[tt], g, i, hk, d, a.block_size, kVec)
                  : a.q_out + (token * hq + head) * d + i;  // (T, Hq, D)
    };
    if (j < items) {
      const int2 off = item_offsets<kNeox, kVec>(j, half);
      Item<kVec> it;
      it.a = *reinterpret_cast<const Bf16Vec<kVec>*>(h + off.x);
      it.b = *reinterpret_cast<const Bf16Vec<kVec>*>(h + off.y);
      rotate_item<kNeox>(it, cos_sin_of<kVec>(row, j, half, false));
      *reinterpret_cast<Bf16Vec<kVec>*>(dst(off.x)) = it.a;
      *reinterpret_cast<Bf16Vec<kVec>*>(dst(off.y)) = it.b;
    } else {
      const int i = 2 * half + (j - items) * kVec;
      *reinterpret_cast<Bf16Vec<kVec>*>(dst(i)) = *reinterpret_cast<const Bf16Vec<kVec>*>(h + i);
    }
  }

  // Copy: the value head, 16 bytes a unit (the first loaded early); the paged layout's column
  // staged as in v8.
  for (int u = threadIdx.x; u < kTile * units; u += blockDim.x) {
    const int tt = u / units, i = u % units * kVec, b = b_sh[tt];
    if (b < 0) continue;
    const Bf16Vec<kVec> v = u == int(threadIdx.x) ? v_first : *reinterpret_cast<const Bf16Vec<kVec>*>(v_src(u));
    if constexpr (kLayout == Layout::kPaged)
      *reinterpret_cast<Bf16Vec<kVec>*>(v_sh + tt * row_elems + i) = v;
    else
      *reinterpret_cast<Bf16Vec<kVec>*>(
          a.value_cache + value_offset<kLayout>(b, o_sh[tt], g, i, hk, d, a.block_size)) = v;
  }
  if constexpr (kLayout == Layout::kPaged) {
    __syncthreads();
    // Store: the tile's columns, lanes across the tokens (v8's walk).
    // BEGIN SOLUTION: v9 — the staged value column, lanes over the tile's tokens (skip the dead)
    uint16_t* const value_cache = reinterpret_cast<uint16_t*>(a.value_cache);
    for (int q = threadIdx.x; q < kTile * d; q += blockDim.x) {
      const int tt = q % kTile, e = q / kTile, b = b_sh[tt];
      if (b >= 0)
        value_cache[value_offset<kLayout>(b, o_sh[tt], g, e, hk, d, a.block_size)] =
            v_sh[tt * row_elems + e];
    }
    // END SOLUTION
  }
}

template <bool kNeox>
void launch(const QkvArgs& a, cudaStream_t stream) {
  const dim3 grid(unsigned((a.t + kTile - 1) / kTile), unsigned(a.hk));
  switch (a.layout) {
    case Layout::kPaged:
      qkv_v9_kernel<kNeox, Layout::kPaged><<<grid, kThreads, 0, stream>>>(a);
      break;
    case Layout::kNhd:
      qkv_v9_kernel<kNeox, Layout::kNhd><<<grid, kThreads, 0, stream>>>(a);
      break;
    case Layout::kHnd:
      qkv_v9_kernel<kNeox, Layout::kHnd><<<grid, kThreads, 0, stream>>>(a);
      break;
  }
}

Status qkv_v9(const QkvArgs& a, cudaStream_t stream) {
  // v9's own limits first: validate_qkv ends by asking for the device.
  Status s = Check()
                 .that(a.rot_dim % (2 * kVec) == 0 && a.d % kVec == 0,
                       "v9 rotates 16-byte items: rot_dim % 16 == 0 and D % 8 == 0")
                 .that(a.layout != Layout::kPaged || a.d <= kMaxTileD,
                       "the paged layout's staged tile holds D <= " + std::to_string(kMaxTileD))
                 .that(a.hk < 65536, "Hk must be below 65536 (the grid's y)")
                 .status();
  if (s.ok()) s = validate_qkv(a, kVec);
  if (!s.ok()) return s;
  a.is_neox ? launch<true>(a, stream) : launch<false>(a, stream);
  return last_launch_status(kQkvRopeCache);
}

Version qkv_version() {
  Version v = version_of(kChapter, kQkvRopeCache, "v9_qkv_rope_cache",
                         "q rotated out, k rotated into the cache, v copied in: one pass over qkv",
                         Kind::kVersion,
                         {{"qkv_v9_kernelILb1ELNS0_6LayoutE0EEE",
                           {},
                           {"LDG.E.128", "STG.E.128", "STS.128", "STG.E.U16"},
                           {},
                           true,
                           "NEOX, paged: 16-byte loads and stores, the value column staged"}});
  v.launch = [](const Args& args, cudaStream_t stream) -> Status {
    QkvArgs a;
    Status s = qkv_args(args, &a);
    return s.ok() ? qkv_v9(a, stream) : s;
  };
  v.bytes = qkv_bytes;
  v.flops = qkv_flops;
  return v;
}

const Register kRegistered{qkv_version()};

}  // namespace
}  // namespace lkw::elementwise
