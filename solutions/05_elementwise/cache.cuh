// Chapter 05 — reshape_and_cache's contract (v6, v7, v8): the layouts, the arguments and their
// checks, where an element of a head lives in each cache, and a unit as the cache stores it.
#pragma once
#include "elementwise.cuh"

namespace lkw::elementwise {

// =============================================================================================
// 3. reshape_and_cache (v6, v7, v8)

enum class Layout { kPaged, kNhd, kHnd };

struct CacheOp {
  const char* name;
  bool fp8;  // E4M3 caches with per-tensor k_scale, v_scale (inputs)
};
constexpr CacheOp kCacheBf16{"reshape_and_cache", false};
constexpr CacheOp kCacheFp8{"reshape_and_cache_fp8", true};
constexpr int kCacheVectorBytes = 16;  // the paged key layout's x: 16 bytes of a head in a row

struct CacheArgs {
  const __nv_bfloat16* key;    // [T, Hk, D]
  const __nv_bfloat16* value;  // [T, Hk, D]
  const int64_t* slots;        // [T]: block · block_size + offset, or −1 (padding)
  const float* k_scale;        // [1] (FP8)
  const float* v_scale;        // [1]
  void* key_cache;             // the layout's shapes (cache_shapes in elementwise.py)
  void* value_cache;
  int64_t t, hk, d, num_blocks, block_size;
  Layout layout = Layout::kPaged;
  bool fp8 = false;

  __host__ __device__ int64_t elem_bytes() const { return fp8 ? 1 : 2; }
  __host__ __device__ int64_t x() const { return kCacheVectorBytes / elem_bytes(); }  // paged key: 8 BF16 or 16 FP8
  __host__ __device__ int64_t cache_elems() const { return num_blocks * block_size * hk * d; }
};

using CacheLaunch = Status (*)(const CacheArgs& a, cudaStream_t stream);

// A layout's key and value cache shapes (elementwise.py's cache_shapes; x: the paged key's
// vector), and the axis of its key cache that holds a block's offsets.
struct CacheShapes {
  std::vector<int64_t> key, value;
};
inline CacheShapes cache_shapes(Layout layout, int64_t blocks, int64_t bs, int64_t hk, int64_t d,
                                int64_t x) {
  switch (layout) {
    case Layout::kPaged: return {{blocks, hk, d / x, bs, x}, {blocks, hk, d, bs}};
    case Layout::kNhd: return {{blocks, bs, hk, d}, {blocks, bs, hk, d}};
    case Layout::kHnd: break;
  }
  return {{blocks, hk, bs, d}, {blocks, hk, bs, d}};
}
inline int block_axis(Layout layout) {
  return layout == Layout::kPaged ? 3 : layout == Layout::kNhd ? 1 : 2;
}

// `vec`: BF16 elements per access of key and value (the caches aligned to vec elements).
inline Status validate_cache(const CacheOp& op, const CacheArgs& a, int vec) {
  Status s = Check()
                 .not_null(a.key, "key")
                 .not_null(a.value, "value")
                 .not_null(a.slots, "slot_mapping")
                 .not_null(a.key_cache, "key_cache")
                 .not_null(a.value_cache, "value_cache")
                 .that(!op.fp8 || (a.k_scale && a.v_scale), "k_scale or v_scale is null")
                 .positive(a.t, "T")
                 .positive(a.hk, "Hk")
                 .positive(a.d, "D")
                 .positive(a.num_blocks, "num_blocks")
                 .positive(a.block_size, "block_size")
                 .that(a.t <= kMaxRows, "T must be below 2^31")
                 .that(a.hk * a.d <= (int64_t(1) << 20), "Hk · D must be <= 2^20")
                 .that(double(a.num_blocks) * double(a.block_size) < 0x1p31,
                       "the cache must hold fewer than 2^31 slots")
                 .that(a.layout != Layout::kPaged || a.d % a.x() == 0,
                       "the paged key layout needs D % " + std::to_string(a.x()) + " == 0")
                 .aligned(a.key, 2 * vec, "key")
                 .aligned(a.value, 2 * vec, "value")
                 .aligned(a.slots, 8, "slot_mapping")
                 .aligned(a.k_scale, 4, "k_scale")
                 .aligned(a.v_scale, 4, "v_scale")
                 .aligned(a.key_cache, int(a.elem_bytes()) * vec, "key_cache")
                 .aligned(a.value_cache, int(a.elem_bytes()) * vec, "value_cache")
                 .status();
  if (!s.ok()) return s;
  const int64_t kv = 2 * a.t * a.hk * a.d, cache = a.cache_elems() * a.elem_bytes();
  return check_apart({{a.key_cache, cache, "key_cache"}, {a.value_cache, cache, "value_cache"}},
                     {{a.key, kv, "key"},
                      {a.value, kv, "value"},
                      {a.slots, 8 * a.t, "slot_mapping"},
                      {a.k_scale, 4, "k_scale"},
                      {a.v_scale, 4, "v_scale"}});
}

inline Status cache_args(const CacheOp& op, const Args& a, CacheArgs* out) {
  const size_t n_in = op.fp8 ? 5 : 3;
  const double layout = a.param("layout", -1);
  Status s = Check()
                 .that(a.inputs.size() == n_in && a.outputs.size() == 2,
                       std::string(op.name) + " takes " + std::to_string(n_in) +
                           " inputs and 2 outputs")
                 .that(layout == 0 || layout == 1 || layout == 2,
                       "the param layout must be 0 (paged), 1 (NHD) or 2 (HND)")
                 .status();
  if (!s.ok()) return s;
  const TensorRef& key = a.inputs[0];
  const TensorRef& value = a.inputs[1];
  const TensorRef& slots = a.inputs[2];
  const TensorRef& kc = a.outputs[0];
  const TensorRef& vc = a.outputs[1];
  const DType cache_dtype = op.fp8 ? DType::kE4M3 : DType::kBF16;
  s = Check()
          .that(key.dtype == DType::kBF16 && key.shape.size() == 3 && value.shape == key.shape &&
                    value.dtype == DType::kBF16,
                "key and value are BF16 [T, Hk, D] of one shape")
          .that(slots.dtype == DType::kI64 && slots.shape.size() == 1,
                "slot_mapping is int64 [T]")
          .that(kc.dtype == cache_dtype && vc.dtype == cache_dtype,
                std::string("the caches are ") + dtype_name(cache_dtype))
          .that(!op.fp8 || (a.inputs[3].dtype == DType::kF32 && a.inputs[3].numel() == 1 &&
                            a.inputs[4].dtype == DType::kF32 && a.inputs[4].numel() == 1),
                "k_scale and v_scale are float32 [1]")
          .status();
  if (!s.ok()) return s;
  CacheArgs r{};
  r.t = key.dim(0);
  r.hk = key.dim(1);
  r.d = key.dim(2);
  r.fp8 = op.fp8;
  r.layout = static_cast<Layout>(int(layout));
  const int64_t x = r.x();
  if (kc.shape.size() >= 4) {
    r.num_blocks = kc.dim(0);
    r.block_size = kc.dim(block_axis(r.layout));
  }
  const CacheShapes want = cache_shapes(r.layout, r.num_blocks, r.block_size, r.hk, r.d, x);
  s = Check()
          .that(slots.dim(0) == r.t, "slot_mapping must have T entries")
          .that(r.layout != Layout::kPaged || r.d % x == 0,
                "the paged key layout needs D % " + std::to_string(x) + " == 0")
          .that(kc.shape == want.key && vc.shape == want.value,
                "the caches' shapes do not match the layout for these Hk and D")
          .status();
  if (!s.ok()) return s;
  r.key = static_cast<const __nv_bfloat16*>(key.data);
  r.value = static_cast<const __nv_bfloat16*>(value.data);
  r.slots = static_cast<const int64_t*>(slots.data);
  if (op.fp8) {
    r.k_scale = static_cast<const float*>(a.inputs[3].data);
    r.v_scale = static_cast<const float*>(a.inputs[4].data);
  }
  r.key_cache = kc.data;
  r.value_cache = vc.data;
  *out = r;
  return {};
}

// What one launch moves when every token is valid: key and value read, the same elements
// written in the cache's dtype, the slots (and the two scales). Not the caches' whole size.
inline double cache_bytes(const CacheOp& op, const Args& a) {
  const TensorRef& key = a.inputs[0];
  const double elems = double(key.numel());
  return 2.0 * elems * (2.0 + (op.fp8 ? 1.0 : 2.0)) + 8.0 * double(key.dim(0)) +
         (op.fp8 ? 8.0 : 0.0);
}

inline Version cache_version(const CacheOp& op, const char* id, const char* summary,
                             CacheLaunch launch, std::vector<SassFact> sass = {},
                             Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    CacheArgs ca;
    Status s = cache_args(op, a, &ca);
    return s.ok() ? launch(ca, stream) : s;
  };
  v.bytes = [op](const Args& a) { return cache_bytes(op, a); };
  v.flops = [op](const Args& a) { return op.fp8 ? 2.0 * double(a.inputs[0].numel()) : 0.0; };
  return v;
}

// Where element i of head h of the token at (block b, offset o) lives in each cache: the
// layouts of elementwise.py's cache_index. x: the paged key layout's vector (8 BF16 or 16 FP8).
template <Layout kLayout>
__device__ __forceinline__ int64_t key_offset(int64_t b, int64_t o, int64_t h, int64_t i,
                                              int64_t hk, int64_t d, int64_t bs, int64_t x) {
  if constexpr (kLayout == Layout::kPaged) {
    return (((b * hk + h) * (d / x) + i / x) * bs + o) * x + i % x;  // [B, Hk, D/x, bs, x]
  } else if constexpr (kLayout == Layout::kNhd) {
    return ((b * bs + o) * hk + h) * d + i;  // [B, bs, Hk, D]
  } else {
    return ((b * hk + h) * bs + o) * d + i;  // [B, Hk, bs, D]
  }
}

template <Layout kLayout>
__device__ __forceinline__ int64_t value_offset(int64_t b, int64_t o, int64_t h, int64_t i,
                                                int64_t hk, int64_t d, int64_t bs) {
  if constexpr (kLayout == Layout::kPaged) {
    return ((b * hk + h) * d + i) * bs + o;  // [B, Hk, D, bs]: a token's head is a column
  } else {
    return key_offset<kLayout>(b, o, h, i, hk, d, bs, 1);
  }
}

// An FP8 cache element: e4m3_satfinite(fp32(v · inv)), inv = fp32(1 / scale) (chapter 03's
// rule; vLLM divides, which now and then differs in the last FP32 bit, so in one E4M3 code).
__device__ __forceinline__ uint8_t kv_fp8(float v, float inv) {
  return uint8_t(quant::quantize_e4m3x2(v, 0.0f, inv) & 0xff);
}

// A unit of kVec elements as the cache stores it (v7, v8): the BF16 bits (16 bytes for 8), or the
// E4M3 codes (8 bytes for 8, one byte for one).
template <bool kFp8, int kVec>
using CacheUnit = std::conditional_t<kFp8, std::conditional_t<kVec == 8, uint2, uint8_t>, Bf16Vec<kVec>>;

template <bool kFp8, int kVec>
__device__ __forceinline__ CacheUnit<kFp8, kVec> to_cache_unit(const Bf16Vec<kVec>& v, float inv) {
  if constexpr (!kFp8) {
    return v;
  } else if constexpr (kVec == 8) {
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      w[h] = quant::quantize_e4m3x2(get(v, 4 * h), get(v, 4 * h + 1), inv) |
             uint32_t(quant::quantize_e4m3x2(get(v, 4 * h + 2), get(v, 4 * h + 3), inv)) << 16;
    return make_uint2(w[0], w[1]);
  } else {
    return kv_fp8(get(v, 0), inv);
  }
}

// =============================================================================================
// 4. qkv_rope_cache (v9): RoPE and reshape_and_cache fused on a QKV projection's output

// qkv [T, Hq + 2·Hk, D] is one GEMM's output rows: Hq query heads, then Hk key heads, then Hk
// value heads. The query heads are rotated into q_out [T, Hq, D] (attention's input), the key
// heads rotated straight into the key cache and the value heads copied into the value cache
// (BF16 caches, the layouts above). Hk is the caches' (their shapes say it), Hq = H − 2·Hk.
// A token whose position lies outside the cos/sin cache is skipped whole (nothing written); a
// padding slot (−1) writes q_out only.
constexpr const char* kQkvRopeCache = "qkv_rope_cache";

struct QkvArgs {
  const int64_t* positions;    // [T]
  const __nv_bfloat16* qkv;    // [T, Hq + 2·Hk, D]
  const float* cos_sin;        // [max_pos, rot_dim]
  const int64_t* slots;        // [T]
  __nv_bfloat16* key_cache;    // the layout's shapes
  __nv_bfloat16* value_cache;
  __nv_bfloat16* q_out;        // [T, Hq, D]
  int64_t t, hq, hk, d, rot_dim, max_pos, num_blocks, block_size;
  Layout layout = Layout::kPaged;
  bool is_neox = true;

  __host__ __device__ int64_t heads() const { return hq + 2 * hk; }
};

inline Status qkv_args(const Args& a, QkvArgs* out) {
  const double layout = a.param("layout", -1);
  Status s = Check()
                 .that(a.inputs.size() == 4 && a.outputs.size() == 3,
                       "qkv_rope_cache takes 4 inputs (positions, qkv, cos_sin_cache, "
                       "slot_mapping) and 3 outputs (key_cache, value_cache, q_out)")
                 .that(layout == 0 || layout == 1 || layout == 2,
                       "the param layout must be 0 (paged), 1 (NHD) or 2 (HND)")
                 .that(a.param("inverse", 0) == 0, "qkv_rope_cache has no inverse")
                 .status();
  if (!s.ok()) return s;
  const TensorRef& pos = a.inputs[0];
  const TensorRef& qkv = a.inputs[1];
  const TensorRef& cs = a.inputs[2];
  const TensorRef& slots = a.inputs[3];
  const TensorRef& kc = a.outputs[0];
  const TensorRef& vc = a.outputs[1];
  const TensorRef& q = a.outputs[2];
  const auto bf16 = [](const TensorRef& x, size_t dims) {
    return x.dtype == DType::kBF16 && x.shape.size() == dims;
  };
  s = Check()
          .that(pos.dtype == DType::kI64 && pos.shape.size() == 1, "positions are int64 [T]")
          .that(bf16(qkv, 3) && bf16(q, 3), "qkv and q_out are BF16 [T, H, D]")
          .that(cs.dtype == DType::kF32 && cs.shape.size() == 2,
                "cos_sin_cache is float32 [max_pos, rot_dim]")
          .that(slots.dtype == DType::kI64 && slots.shape.size() == 1, "slot_mapping is int64 [T]")
          .that(kc.dtype == DType::kBF16 && vc.dtype == DType::kBF16 && kc.shape.size() >= 4,
                "the caches are BF16 in the layout's shapes")
          .status();
  if (!s.ok()) return s;
  QkvArgs r{};
  r.layout = static_cast<Layout>(int(layout));
  r.t = qkv.dim(0);
  r.d = qkv.dim(2);
  r.hk = kc.dim(r.layout == Layout::kNhd ? 2 : 1);
  r.hq = qkv.dim(1) - 2 * r.hk;
  r.num_blocks = kc.dim(0);
  r.block_size = kc.dim(block_axis(r.layout));
  r.max_pos = cs.dim(0);
  r.rot_dim = cs.dim(1);
  constexpr int64_t x = kCacheVectorBytes / 2;
  const CacheShapes want = cache_shapes(r.layout, r.num_blocks, r.block_size, r.hk, r.d, x);
  s = Check()
          .that(r.hk > 0 && r.hq > 0,
                "qkv's heads must be Hq + 2·Hk with Hq > 0 (Hk: the caches')")
          .that(q.shape == std::vector<int64_t>{r.t, r.hq, r.d}, "q_out must be [T, Hq, D]")
          .that(pos.dim(0) == r.t && slots.dim(0) == r.t,
                "positions and slot_mapping need T entries")
          .that(r.layout != Layout::kPaged || r.d % x == 0, "the paged key layout needs D % 8 == 0")
          .that(kc.shape == want.key && vc.shape == want.value,
                "the caches' shapes do not match the layout for these Hk and D")
          .status();
  if (!s.ok()) return s;
  r.positions = static_cast<const int64_t*>(pos.data);
  r.qkv = static_cast<const __nv_bfloat16*>(qkv.data);
  r.cos_sin = static_cast<const float*>(cs.data);
  r.slots = static_cast<const int64_t*>(slots.data);
  r.key_cache = static_cast<__nv_bfloat16*>(kc.data);
  r.value_cache = static_cast<__nv_bfloat16*>(vc.data);
  r.q_out = static_cast<__nv_bfloat16*>(q.data);
  r.is_neox = a.param("is_neox", 1) != 0;
  *out = r;
  return {};
}

// `vec`: BF16 elements per access (the tensors aligned to 2·vec bytes, the cos/sin cache to
// 4·vec).
inline Status validate_qkv(const QkvArgs& a, int vec) {
  Status s = Check()
                 .not_null(a.positions, "positions")
                 .not_null(a.qkv, "qkv")
                 .not_null(a.cos_sin, "cos_sin_cache")
                 .not_null(a.slots, "slot_mapping")
                 .not_null(a.key_cache, "key_cache")
                 .not_null(a.value_cache, "value_cache")
                 .not_null(a.q_out, "q_out")
                 .positive(a.t, "T")
                 .positive(a.d, "D")
                 .positive(a.max_pos, "max_pos")
                 .positive(a.num_blocks, "num_blocks")
                 .positive(a.block_size, "block_size")
                 .that(a.t <= kMaxRows, "T must be below 2^31")
                 .that(a.rot_dim > 0 && a.rot_dim % 2 == 0 && a.rot_dim <= a.d,
                       "rot_dim = " + std::to_string(a.rot_dim) + " must be even, > 0 and <= D")
                 .that(a.heads() * a.d <= (int64_t(1) << 20), "(Hq + 2·Hk) · D must be <= 2^20")
                 .that(double(a.num_blocks) * double(a.block_size) < 0x1p31,
                       "the cache must hold fewer than 2^31 slots")
                 .aligned(a.positions, 8, "positions")
                 .aligned(a.slots, 8, "slot_mapping")
                 .aligned(a.qkv, 2 * vec, "qkv")
                 .aligned(a.q_out, 2 * vec, "q_out")
                 .aligned(a.key_cache, 2 * vec, "key_cache")
                 .aligned(a.value_cache, 2 * vec, "value_cache")
                 .aligned(a.cos_sin, 4 * vec, "cos_sin_cache")
                 .status();
  if (!s.ok()) return s;
  const int64_t cache = 2 * a.num_blocks * a.block_size * a.hk * a.d;
  return check_apart({{a.key_cache, cache, "key_cache"},
                      {a.value_cache, cache, "value_cache"},
                      {a.q_out, 2 * a.t * a.hq * a.d, "q_out"}},
                     {{a.positions, 8 * a.t, "positions"},
                      {a.qkv, 2 * a.t * a.heads() * a.d, "qkv"},
                      {a.cos_sin, 4 * a.max_pos * a.rot_dim, "cos_sin_cache"},
                      {a.slots, 8 * a.t, "slot_mapping"}});
}

// 3 FLOPs per rotated element of q and k (rope's count).
inline double qkv_flops(const Args& a) {
  const TensorRef& q = a.outputs.at(2);
  const double hk = double(a.inputs.at(1).dim(1) - q.dim(1)) / 2.0;
  return 3.0 * double(q.dim(0)) * (double(q.dim(1)) + hk) * double(a.inputs.at(2).dim(1));
}

// Every token valid: qkv read once, q_out and the two cache heads written once (4 B per element
// of qkv), the positions and slots, one cos/sin row a token. The unfused chain it replaces in a
// layer moves more than twice that (book 05).
inline double qkv_bytes(const Args& a) {
  const TensorRef& qkv = a.inputs[1];
  const double t = double(qkv.dim(0));
  return 4.0 * double(qkv.numel()) + 16.0 * t + 4.0 * t * double(a.inputs[2].dim(1));
}

}  // namespace lkw::elementwise
