// v7_cache_vec16 — a block per token, units of 8 elements: 16-byte reads, whole-vector writes.
//
// Since v6: a thread moves a unit of 8 consecutive elements of one head: one 16-byte load. Where
// the layout keeps those 8 elements together — the paged key's x-vector (8 BF16 or half of 16
// FP8), NHD and HND rows — the write is one 16-byte store (8 bytes of FP8 codes). The paged value
// layout stores a head as a column, block_size elements apart: there every element is a narrow
// store into its own 32-byte sector, and the lanes take consecutive elements of the column (v6's
// map), so that a store instruction touches 8 lines, not 32. A block is one token, so the slot is
// read once per block and every offset is 32-bit arithmetic on the unit within the token: v6
// spends four 64-bit divisions per element on its indices, more instructions than the bytes allow
// at the copy ceiling. A D that is not a multiple of 8 (NHD, HND) takes units of one element.
// Expect: ≥ 85% of the copy ceiling at T = 8192 for NHD and HND; the paged value column, a
// sector per element, about v6's time (v8 writes it whole).
// SASS: LDG.E.128, STG.E.128 (BF16) or STG.E.64 (FP8).
#include "cache.cuh"

namespace lkw::elementwise {
namespace {

constexpr int kMaxThreads = 256;

template <Layout kLayout, bool kFp8, int kVec>
__global__ void __launch_bounds__(kMaxThreads) cache_v7_kernel(CacheArgs a) {
  using Elem = std::conditional_t<kFp8, uint8_t, uint16_t>;
  constexpr int kX = kCacheVectorBytes / sizeof(Elem);  // the paged key's vector (a.x())
  using Unit = CacheUnit<kFp8, kVec>;
  auto* key_cache = static_cast<Elem*>(a.key_cache);
  auto* value_cache = static_cast<Elem*>(a.value_cache);
  const int64_t token = blockIdx.x;
  const int64_t slot = a.slots[token];  // (T)
  if (slot < 0 || slot >= a.num_blocks * a.block_size) return;  // padding, or not in this cache
  const int b = int(slot) / int(a.block_size), o = int(slot) % int(a.block_size);
  const int d = int(a.d), units = int(a.hk) * d / kVec;
  const auto* key_vec = reinterpret_cast<const Bf16Vec<kVec>*>(a.key) + token * units;  // (Hk·D/kVec)
  const auto* value_vec = reinterpret_cast<const Bf16Vec<kVec>*>(a.value) + token * units;
  const float k_inv = kFp8 ? quant::fp8_inverse(*a.k_scale) : 0.0f;
  const float v_inv = kFp8 ? quant::fp8_inverse(*a.v_scale) : 0.0f;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    // Stage: load the unit of key (and of value, but for the paged column below).
    const Bf16Vec<kVec> k = key_vec[u];
    const int h = u * kVec / d, i = u * kVec % d;
    // Stage: convert and store each where its layout puts it.
    // BEGIN SOLUTION: v7 — one store of the whole unit where the layout keeps it together
    const Unit ks = to_cache_unit<kFp8>(k, k_inv);
    *reinterpret_cast<Unit*>(key_cache + key_offset<kLayout>(b, o, h, i, a.hk, a.d, a.block_size,
                                                             kX)) = ks;
    if constexpr (kLayout != Layout::kPaged) {
      const Unit vs = to_cache_unit<kFp8>(value_vec[u], v_inv);
      *reinterpret_cast<Unit*>(value_cache + value_offset<kLayout>(b, o, h, i, a.hk, a.d,
                                                                   a.block_size)) = vs;
    }
    // END SOLUTION
  }
  if constexpr (kLayout == Layout::kPaged) {
    // The paged value column: element i of a head lies block_size elements from i + 1, so each
    // element is a narrow store into a sector of its own. Lanes on consecutive i put one store
    // instruction's 32 elements into 1 KB (8 lines of 128 bytes); a unit of 8 a lane would spread
    // them over 8 KB (32 lines), four times the L2 requests for the same bytes.
    const __nv_bfloat16* const value_row = a.value + token * a.hk * a.d;  // (Hk·D)
    // BEGIN SOLUTION: v7 — the column, a lane per element, consecutive along D
    for (int h = 0; h < int(a.hk); ++h)
      for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const __nv_bfloat16 v = value_row[h * d + i];
        Elem stored;
        if constexpr (kFp8) stored = kv_fp8(__bfloat162float(v), v_inv);
        else stored = __bfloat16_as_ushort(v);
        value_cache[value_offset<kLayout>(b, o, h, i, a.hk, a.d, a.block_size)] = stored;
      }
    // END SOLUTION
  }
}

template <bool kFp8, int kVec>
void launch(const CacheArgs& a, cudaStream_t stream) {
  const int64_t units = a.hk * a.d / kVec;
  const unsigned threads = unsigned(std::min<int64_t>((units + 31) / 32 * 32, kMaxThreads));
  switch (a.layout) {
    case Layout::kPaged: cache_v7_kernel<Layout::kPaged, kFp8, kVec><<<unsigned(a.t), threads, 0, stream>>>(a); break;
    case Layout::kNhd: cache_v7_kernel<Layout::kNhd, kFp8, kVec><<<unsigned(a.t), threads, 0, stream>>>(a); break;
    case Layout::kHnd: cache_v7_kernel<Layout::kHnd, kFp8, kVec><<<unsigned(a.t), threads, 0, stream>>>(a); break;
  }
}

template <const CacheOp& kOp>
Status cache_v7(const CacheArgs& a, cudaStream_t stream) {
  const int vec = a.d % 8 == 0 ? 8 : 1;
  Status s = validate_cache(kOp, a, vec);
  if (!s.ok()) return s;
  if (vec == 8) {
    kOp.fp8 ? launch<true, 8>(a, stream) : launch<false, 8>(a, stream);
  } else {
    kOp.fp8 ? launch<true, 1>(a, stream) : launch<false, 1>(a, stream);
  }
  return last_launch_status(kOp.name);
}

constexpr const char* kSummary = "a block per token, units of 8: 16-byte loads, whole-vector stores";
const Register kBf16{cache_version(
    kCacheBf16, "v7_cache_vec16", kSummary, cache_v7<kCacheBf16>,
    {{"cache_v7_kernelILNS0_6LayoutE1ELb0ELi8E", {}, {"LDG.E.128", "STG.E.128"}, {}, true,
      "NHD: 16-byte loads and stores"}})};
const Register kFp8{cache_version(
    kCacheFp8, "v7_cache_vec16", kSummary, cache_v7<kCacheFp8>,
    {{"cache_v7_kernelILNS0_6LayoutE1ELb1ELi8E", {}, {"LDG.E.128", "STG.E.64"}, {}, true,
      "NHD FP8: 16-byte loads, 8-byte code stores"}})};

}  // namespace
}  // namespace lkw::elementwise
