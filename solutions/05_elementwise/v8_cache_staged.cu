// v8_cache_staged — a block per 16 tokens of one head: the paged value column written across tokens.
//
// Since v7: the paged value layout stores a head's D elements as a column [D, block], so the 8
// elements of v7's unit land block_size elements apart, each a 2-byte piece of its own 32-byte
// sector, one sector written by 16 different blocks. What is contiguous in that layout is one
// element of D over the block's consecutive offsets, i.e. over consecutive tokens of a prompt. So
// a block takes kTile tokens of one head: it loads their units as v7 does (the key written at
// once), converts the values into shared memory [token][D], and after one barrier its lanes walk
// that tile across the tokens: lane l writes token l % kTile of element 2w + l / kTile, so where
// the tokens' slots are consecutive (a prefill's prompt) a warp's 32 stores fill 64 bytes in a
// row, two whole sectors; where they are not (decode) each is v7's narrow store. NHD and HND
// keep v7's 16-byte value stores: only the grid changes.
// Expect: the paged layout at prefill near NHD's share of the copy ceiling; decode as v7.
// SASS: LDG.E.128 and STG.E.128 (BF16, NHD) or STG.E.64 (FP8); the column stores STG.E.U16.
#include "cache.cuh"

namespace lkw::elementwise {
namespace {

constexpr int kTile = 16;  // tokens a block: the default block_size, one sector of BF16 offsets
constexpr int kMaxThreads = 256;
constexpr int kMaxTileD = 512;  // a head's elements in the shared tile (16 × 520 × 2 bytes)

// grid (⌈T / kTile⌉, Hk): block (tile, h) moves head h of tokens kTile·tile .. + kTile − 1.
template <Layout kLayout, bool kFp8, int kVec>
__global__ void __launch_bounds__(kMaxThreads) cache_v8_kernel(CacheArgs a) {
  using Elem = std::conditional_t<kFp8, uint8_t, uint16_t>;
  constexpr int kX = kCacheVectorBytes / sizeof(Elem);  // the paged key's vector (a.x())
  using Unit = CacheUnit<kFp8, kVec>;
  // A staged row is D elements and 16 bytes of pad, so that the column reads of 16 tokens fall
  // in 8 banks twice, not in one bank 16 times.
  constexpr int kPad = 16 / sizeof(Elem);
  __shared__ int b_sh[kTile], o_sh[kTile];  // each token's block and offset; b < 0: skipped
  __shared__ alignas(16) Elem v_sh[kLayout == Layout::kPaged ? kTile * (kMaxTileD + kPad) : 1];
  auto* key_cache = static_cast<Elem*>(a.key_cache);
  auto* value_cache = static_cast<Elem*>(a.value_cache);
  const int64_t t0 = int64_t(blockIdx.x) * kTile;
  const int h = blockIdx.y, d = int(a.d), units = d / kVec, row = d + kPad;  // a head's units
  if (threadIdx.x < kTile) {
    const int64_t token = t0 + threadIdx.x;
    const int64_t slot = token < a.t ? a.slots[token] : -1;  // (T)
    const bool live = slot >= 0 && slot < a.num_blocks * a.block_size;  // else padding, skipped
    b_sh[threadIdx.x] = live ? int(slot) / int(a.block_size) : -1;
    o_sh[threadIdx.x] = live ? int(slot) % int(a.block_size) : 0;
  }
  __syncthreads();
  const float k_inv = kFp8 ? quant::fp8_inverse(*a.k_scale) : 0.0f;
  const float v_inv = kFp8 ? quant::fp8_inverse(*a.v_scale) : 0.0f;
  // Load: unit u of the tile is token u / units, element (u % units) · kVec of head h.
  for (int u = threadIdx.x; u < kTile * units; u += blockDim.x) {
    const int tt = u / units, i = u % units * kVec, b = b_sh[tt], o = o_sh[tt];
    if (b < 0) continue;
    const int64_t at = (((t0 + tt) * a.hk + h) * d + i) / kVec;  // (T, Hk, D) in units
    const Bf16Vec<kVec> k = reinterpret_cast<const Bf16Vec<kVec>*>(a.key)[at],
                        v = reinterpret_cast<const Bf16Vec<kVec>*>(a.value)[at];
    const Unit ks = to_cache_unit<kFp8>(k, k_inv), vs = to_cache_unit<kFp8>(v, v_inv);
    *reinterpret_cast<Unit*>(key_cache +
                             key_offset<kLayout>(b, o, h, i, a.hk, a.d, a.block_size, kX)) = ks;
    if constexpr (kLayout == Layout::kPaged)
      *reinterpret_cast<Unit*>(v_sh + tt * row + i) = vs;  // stage: [token][D + pad] as stored
    else
      *reinterpret_cast<Unit*>(value_cache +
                               value_offset<kLayout>(b, o, h, i, a.hk, a.d, a.block_size)) = vs;
  }
  if constexpr (kLayout == Layout::kPaged) {
    __syncthreads();
    // Store: the tile's columns, lanes across the tokens: element e = q / kTile of token q % kTile.
    // BEGIN SOLUTION: v8 — the staged column, lanes over the tile's tokens (skip the dead ones)
    for (int q = threadIdx.x; q < kTile * d; q += blockDim.x) {
      const int tt = q % kTile, e = q / kTile, b = b_sh[tt];
      if (b >= 0)
        value_cache[value_offset<kLayout>(b, o_sh[tt], h, e, a.hk, a.d, a.block_size)] =
            v_sh[tt * row + e];
    }
    // END SOLUTION
  }
}

template <bool kFp8, int kVec>
void launch(const CacheArgs& a, cudaStream_t stream) {
  const int64_t units = kTile * (a.d / kVec);
  const unsigned threads = unsigned(std::min<int64_t>((units + 31) / 32 * 32, kMaxThreads));
  const dim3 grid(unsigned((a.t + kTile - 1) / kTile), unsigned(a.hk));
  switch (a.layout) {
    case Layout::kPaged: cache_v8_kernel<Layout::kPaged, kFp8, kVec><<<grid, threads, 0, stream>>>(a); break;
    case Layout::kNhd: cache_v8_kernel<Layout::kNhd, kFp8, kVec><<<grid, threads, 0, stream>>>(a); break;
    case Layout::kHnd: cache_v8_kernel<Layout::kHnd, kFp8, kVec><<<grid, threads, 0, stream>>>(a); break;
  }
}

template <const CacheOp& kOp>
Status cache_v8(const CacheArgs& a, cudaStream_t stream) {
  const int vec = a.d % 8 == 0 ? 8 : 1;
  // v8's own limits first: validate_cache ends by asking for the device.
  Status s = Check()
                 .that(a.layout != Layout::kPaged || a.d <= kMaxTileD,
                       "the paged layout's staged tile holds D <= " + std::to_string(kMaxTileD))
                 .that(a.hk < 65536, "Hk must be below 65536 (the grid's y)")
                 .status();
  if (s.ok()) s = validate_cache(kOp, a, vec);
  if (!s.ok()) return s;
  if (vec == 8) {
    kOp.fp8 ? launch<true, 8>(a, stream) : launch<false, 8>(a, stream);
  } else {
    kOp.fp8 ? launch<true, 1>(a, stream) : launch<false, 1>(a, stream);
  }
  return last_launch_status(kOp.name);
}

constexpr const char* kSummary =
    "16 tokens of a head a block: the paged value column staged, written across tokens";
const Register kBf16{cache_version(
    kCacheBf16, "v8_cache_staged", kSummary, cache_v8<kCacheBf16>,
    {{"cache_v8_kernelILNS0_6LayoutE0ELb0ELi8E", {}, {"LDG.E.128", "STS.128", "STG.E.U16"}, {},
      true,
      "paged: 16-byte loads, the value tile staged in shared memory, 2-byte column stores"}})};
const Register kFp8{cache_version(
    kCacheFp8, "v8_cache_staged", kSummary, cache_v8<kCacheFp8>,
    {{"cache_v8_kernelILNS0_6LayoutE1ELb1ELi8E", {}, {"LDG.E.128", "STG.E.64"}, {}, true,
      "NHD FP8: 16-byte loads, 8-byte code stores"}})};

}  // namespace
}  // namespace lkw::elementwise
