// v3_rope_scalar — RoPE with a thread per rotated pair.
//
// The rotation of pair j of a head: (x, y) → (x c − y s, y c + x s), with c, s column j of the
// token's row of the cos/sin cache; NEOX pairs element j with j + rot/2, GPT-J 2j with 2j + 1.
// A thread reads its pair (two 2-byte loads), the token's position and two cache floats, and
// writes two BF16. Threads are numbered over (token, head, pair) of q's heads then k's, so q and
// k are one launch. Out of place, the D − rot_dim elements past the rotation are copied, one
// element a thread; in place they are not touched. A token whose position lies outside the cache
// is skipped whole (its outputs are not written): the kernel cannot report it, and must not read
// past the cache.
// Expect: well below the copy ceiling (2-byte accesses to addresses rot/2 or 1 apart, the cache
// row re-read by every head); SASS: no 128-bit accesses.
#include "rope.cuh"

namespace lkw::elementwise {
namespace {

constexpr int kThreads = 256;

template <bool kNeox>
__global__ void __launch_bounds__(kThreads) rope_v3_kernel(RopeArgs a) {
  const int64_t half = a.rot_dim / 2, heads = a.heads();
  const int64_t pairs = a.t * heads * half;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t p = blockIdx.x * int64_t(kThreads) + threadIdx.x; p < pairs; p += stride) {
    const int64_t token = p / (heads * half), h = p / half % heads, j = p % half;
    const int64_t pos = a.positions[token];  // (T)
    if (pos < 0 || pos >= a.max_pos) continue;
    const int64_t head_at = h < a.hq ? (token * a.hq + h) * a.d : (token * a.hk + h - a.hq) * a.d;
    const __nv_bfloat16* src = (h < a.hq ? a.q : a.k) + head_at;  // (T, H, D)
    __nv_bfloat16* dst = (h < a.hq ? a.q_out : a.k_out) + head_at;
    // BEGIN SOLUTION: v3 — the pair's two elements, its cache column, the rotation, two stores
    const int64_t xi = kNeox ? j : 2 * j, yi = kNeox ? j + half : 2 * j + 1;
    const float c = a.cos_sin[pos * a.rot_dim + j];  // (max_pos, rot_dim)
    const float s = a.cos_sin[pos * a.rot_dim + half + j];
    const float2 r = rotate_pair(__bfloat162float(src[xi]), __bfloat162float(src[yi]), c,
                                 a.inverse ? -s : s);
    dst[xi] = __float2bfloat16_rn(r.x);
    dst[yi] = __float2bfloat16_rn(r.y);
    // END SOLUTION
  }
  if (a.in_place() || a.rot_dim == a.d) return;
  // The tail, out of place: element rot_dim + i of every head copied.
  const int64_t tail = a.d - a.rot_dim, copies = a.t * heads * tail;
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < copies; e += stride) {
    const int64_t token = e / (heads * tail), h = e / tail % heads, i = a.rot_dim + e % tail;
    const int64_t pos = a.positions[token];
    if (pos < 0 || pos >= a.max_pos) continue;
    const int64_t at = (h < a.hq ? (token * a.hq + h) * a.d : (token * a.hk + h - a.hq) * a.d) + i;
    (h < a.hq ? a.q_out : a.k_out)[at] = (h < a.hq ? a.q : a.k)[at];
  }
}

Status rope_v3(const RopeArgs& a, cudaStream_t stream) {
  Status s = validate_rope(kRope, a, 1, int64_t(1) << 20);
  if (!s.ok()) return s;
  const int64_t pairs = a.t * a.heads() * (a.rot_dim / 2);
  const unsigned blocks = unsigned(std::min<int64_t>((pairs + kThreads - 1) / kThreads, 1 << 16));
  if (a.is_neox) {
    rope_v3_kernel<true><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    rope_v3_kernel<false><<<blocks, kThreads, 0, stream>>>(a);
  }
  return last_launch_status(kRope.name);
}

const Register kRegistered{rope_version(
    kRope, "v3_rope_scalar", "a thread per rotated pair, 2-byte accesses", rope_v3,
    {{"rope_v3_kernel", {}, {}, {"LDG.E.128", "STG.E.128"}, true, "2-byte accesses only"}})};

}  // namespace
}  // namespace lkw::elementwise
