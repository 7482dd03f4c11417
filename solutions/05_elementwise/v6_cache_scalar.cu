// v6_cache_scalar — reshape_and_cache with a thread per element of key (and of value).
//
// The token's slot names a block b = slot / block_size and an offset o = slot % block_size;
// element (h, i) of its key goes to key_offset<layout>(b, o, h, i) and of its value to
// value_offset (cache.cuh): the paged layout splits a key head into 16-byte x-vectors
// [D/x, block, x] and stores a value head as a column [D, block]; NHD and HND keep a head's D
// elements contiguous. An FP8 cache stores e4m3(v · fp32(1 / scale)), chapter 03's rule.
// Padding (slot −1) is skipped: neither read nor written. A slot outside the cache is skipped
// too — the kernel cannot report it, and must not write outside the cache.
// Expect: far below the copy ceiling (2-byte reads, 2- or 1-byte writes, the paged value
// layout's writes block_size elements apart); SASS: no 128-bit accesses.
#include "cache.cuh"

namespace lkw::elementwise {
namespace {

constexpr int kThreads = 256;

template <Layout kLayout, bool kFp8>
__global__ void __launch_bounds__(kThreads) cache_v6_kernel(CacheArgs a) {
  using Elem = std::conditional_t<kFp8, uint8_t, uint16_t>;
  constexpr int kX = kCacheVectorBytes / sizeof(Elem);  // the paged key's vector (a.x())
  auto* key_cache = static_cast<Elem*>(a.key_cache);
  auto* value_cache = static_cast<Elem*>(a.value_cache);
  const int64_t per_token = a.hk * a.d, n = a.t * per_token;
  const int64_t num_slots = a.num_blocks * a.block_size;
  const float k_inv = kFp8 ? quant::fp8_inverse(*a.k_scale) : 0.0f;
  const float v_inv = kFp8 ? quant::fp8_inverse(*a.v_scale) : 0.0f;
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * kThreads) {
    const int64_t token = e / per_token, h = e / a.d % a.hk, i = e % a.d;
    const int64_t slot = a.slots[token];  // (T)
    if (slot < 0 || slot >= num_slots) continue;  // padding (−1), or not a slot of this cache
    // BEGIN SOLUTION: v6 — block and offset of the slot, one element to each cache
    const int64_t b = slot / a.block_size, o = slot % a.block_size;
    const int64_t k_at = key_offset<kLayout>(b, o, h, i, a.hk, a.d, a.block_size, kX);
    const int64_t v_at = value_offset<kLayout>(b, o, h, i, a.hk, a.d, a.block_size);
    if constexpr (kFp8) {
      key_cache[k_at] = kv_fp8(__bfloat162float(a.key[e]), k_inv);  // (T, Hk, D) → the layout
      value_cache[v_at] = kv_fp8(__bfloat162float(a.value[e]), v_inv);
    } else {
      key_cache[k_at] = __bfloat16_as_ushort(a.key[e]);
      value_cache[v_at] = __bfloat16_as_ushort(a.value[e]);
    }
    // END SOLUTION
  }
}

template <bool kFp8>
void launch(const CacheArgs& a, unsigned blocks, cudaStream_t stream) {
  switch (a.layout) {
    case Layout::kPaged: cache_v6_kernel<Layout::kPaged, kFp8><<<blocks, kThreads, 0, stream>>>(a); break;
    case Layout::kNhd: cache_v6_kernel<Layout::kNhd, kFp8><<<blocks, kThreads, 0, stream>>>(a); break;
    case Layout::kHnd: cache_v6_kernel<Layout::kHnd, kFp8><<<blocks, kThreads, 0, stream>>>(a); break;
  }
}

template <const CacheOp& kOp>
Status cache_v6(const CacheArgs& a, cudaStream_t stream) {
  Status s = validate_cache(kOp, a, 1);
  if (!s.ok()) return s;
  const int64_t n = a.t * a.hk * a.d;
  const unsigned blocks = unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 16));
  kOp.fp8 ? launch<true>(a, blocks, stream) : launch<false>(a, blocks, stream);
  return last_launch_status(kOp.name);
}

constexpr const char* kSummary = "a thread per element, the layout's offsets computed per element";
SassFact facts(const char* kernel) {
  return {kernel, {}, {}, {"LDG.E.128", "STG.E.128"}, true, "2-byte accesses only"};
}
const Register kBf16{cache_version(kCacheBf16, "v6_cache_scalar", kSummary, cache_v6<kCacheBf16>,
                                   {facts("cache_v6_kernel*Lb0E")})};
const Register kFp8{cache_version(kCacheFp8, "v6_cache_scalar", kSummary, cache_v6<kCacheFp8>,
                                  {facts("cache_v6_kernel*Lb1E")})};

}  // namespace
}  // namespace lkw::elementwise
