// Peers of chapter 05: the unfused chains that the fused versions replace, measured in the same run.
//   silu_and_mul_fp8_per_token/chain_unfused   v1 to a BF16 scratch y → chapter 03's per-token
//   silu_and_mul_fp8_per_group/chain_unfused   (or 1 × 128) FP8 kernel reading y: 9 B per element
//   qk_norm_rope/chain_unfused                 chapter 04's RMSNorm over q's heads and over k's
//                                              (two launches: one weight each) to a scratch, then
//                                              v4 rotating the scratch: 8 B per element
//   qkv_rope_cache/chain_unfused               what a layer ran before v9: q and k copied out of
//                                              qkv, v4 out of place, v copied out, v8 writing
//                                              the cache: 8 to 12 B per element, 5 steps
// The steps are looked up in the registry when the chain runs, so a chain is always the current
// v1, v4 and the other chapters' current kernels. The FP8 chains' q and scales equal v2's bit for
// bit (y is elementwise and an absmax is exact in any order); the norm chain's n differs from
// v5's within 2 BF16 ulps (the sum of squares in another order). The chapter's tests check both.
#include "lkw/workspace.h"
#include "cache.cuh"
#include "rope.cuh"

namespace lkw::elementwise {
namespace {

constexpr const char* kSiluVersion = "05_elementwise/silu_and_mul/v1_act_vec16";
constexpr const char* kRopeVersion = "05_elementwise/rope/v4_rope_vec16";
constexpr const char* kNormVersion = "04_rmsnorm/rmsnorm/v3_vec16_registers";
constexpr const char* kPerTokenVersion = "03_dynamic_quant/per_token_fp8/v2_vec16";
constexpr const char* kPerGroupVersion = "03_dynamic_quant/per_group_fp8/v2_vec16";
constexpr const char* kCacheVersion = "05_elementwise/reshape_and_cache/v8_cache_staged";

Status find_version(const char* name, const Version** v) {
  return Registry::get().require(name, "the unfused chain", v);
}

Status with_context(const char* step, Status s) {
  if (!s.ok()) s.message = std::string("chain_unfused, ") + step + ": " + s.message;
  return s;
}

// The chain's intermediate tensor (lkw::Workspace: one per device, grown on demand; a baseline
// timed one launch at a time, not an interface to build on).
Status scratch(int64_t bytes, void** out) {
  static Workspace workspace("chapter 05 chain_unfused scratch");
  return workspace.get(bytes, out);
}

TensorRef ref(const void* p, DType t, std::vector<int64_t> shape) {
  return {const_cast<void*>(p), t, std::move(shape)};
}

template <const ActOp& kOp>
Status chain_silu_quant(const ActArgs& a, cudaStream_t stream) {
  Status s = validate_act(kOp, a, a.d % 8 == 0 ? 8 : 1, std::numeric_limits<int32_t>::max());
  const bool per_token = kOp.quant == Quant::kPerToken;
  const Version *silu = nullptr, *quant = nullptr;
  if (s.ok()) s = find_version(kSiluVersion, &silu);
  if (s.ok()) s = find_version(per_token ? kPerTokenVersion : kPerGroupVersion, &quant);
  void* y = nullptr;
  if (s.ok()) s = scratch(2 * a.t * a.d, &y);
  if (s.ok()) {
    Args step;
    step.inputs = {ref(a.x, DType::kBF16, {a.t, 2 * a.d})};
    step.outputs = {ref(y, DType::kBF16, {a.t, a.d})};
    s = with_context("silu_and_mul", silu->launch(step, stream));
  }
  if (s.ok()) {
    const int64_t groups = a.d / kGroup;
    Args step;
    step.inputs = {ref(y, DType::kBF16, {a.t, a.d})};
    step.outputs = {ref(a.q, DType::kE4M3, {a.t, a.d}),
                    ref(a.scales, DType::kF32,
                        per_token            ? std::vector<int64_t>{a.t, 1}
                        : a.scales_row_major ? std::vector<int64_t>{a.t, groups}
                                             : std::vector<int64_t>{groups, a.t})};
    if (per_token) step.params["scale_ub"] = a.scale_ub;
    if (!per_token) step.params["scales_row_major"] = a.scales_row_major ? 1 : 0;
    s = with_context("quant", quant->launch(step, stream));
  }
  return s;
}

Status chain_qk_norm_rope(const RopeArgs& a, cudaStream_t stream) {
  Status s = validate_rope(kQkNormRope, a, rope_pairs(a.d, a.rot_dim), rope_max_d(a.d, a.rot_dim));
  const Version *norm = nullptr, *rope = nullptr;
  if (s.ok()) s = find_version(kNormVersion, &norm);
  if (s.ok()) s = find_version(kRopeVersion, &rope);
  void* n = nullptr;
  if (s.ok()) s = scratch(2 * a.t * a.heads() * a.d, &n);
  auto* nq = static_cast<__nv_bfloat16*>(n);
  __nv_bfloat16* nk = nq + a.t * a.hq * a.d;
  for (int kv = 0; kv < 2 && s.ok(); ++kv) {
    const int64_t rows = a.t * (kv ? a.hk : a.hq);
    Args step;
    step.inputs = {ref(kv ? a.k : a.q, DType::kBF16, {rows, a.d}),
                   ref(kv ? a.k_weight : a.q_weight, DType::kBF16, {a.d})};
    step.outputs = {ref(kv ? nk : nq, DType::kBF16, {rows, a.d})};
    step.params = {{"eps", double(a.eps)}};
    s = with_context(kv ? "norm of k" : "norm of q", norm->launch(step, stream));
  }
  if (s.ok()) {
    Args step;
    step.inputs = {ref(a.positions, DType::kI64, {a.t}), ref(nq, DType::kBF16, {a.t, a.hq, a.d}),
                   ref(nk, DType::kBF16, {a.t, a.hk, a.d}),
                   ref(a.cos_sin, DType::kF32, {a.max_pos, a.rot_dim})};
    step.outputs = {ref(a.q_out, DType::kBF16, {a.t, a.hq, a.d}),
                    ref(a.k_out, DType::kBF16, {a.t, a.hk, a.d})};
    step.params = {{"is_neox", a.is_neox ? 1.0 : 0.0}};
    s = with_context("rope", rope->launch(step, stream));
  }
  return s;
}

// Heads [h0, h0 + n) of every token of qkv into a dense [T, n, D] scratch (one strided copy).
Status copy_heads(const QkvArgs& a, int64_t h0, int64_t n, void* dst, cudaStream_t stream) {
  const size_t row = size_t(2 * n * a.d), pitch = size_t(2 * a.heads() * a.d);
  const cudaError_t e = cudaMemcpy2DAsync(dst, row, a.qkv + h0 * a.d, pitch, row, size_t(a.t),
                                          cudaMemcpyDeviceToDevice, stream);
  if (e == cudaSuccess) return {};
  return error(Code::kCudaError,
               std::string("chain_unfused, a copy of qkv's heads: ") + cudaGetErrorString(e));
}

Status chain_qkv_rope_cache(const QkvArgs& a, cudaStream_t stream) {
  Status s = validate_qkv(a, 8);
  const Version *rope = nullptr, *cache = nullptr;
  if (s.ok()) s = find_version(kRopeVersion, &rope);
  if (s.ok()) s = find_version(kCacheVersion, &cache);
  void* scratch_all = nullptr;  // q, k, k', v: [T, Hq + 3·Hk, D]
  if (s.ok()) s = scratch(2 * a.t * (a.hq + 3 * a.hk) * a.d, &scratch_all);
  auto* q = static_cast<__nv_bfloat16*>(scratch_all);
  const int64_t kv = a.t * a.hk * a.d;  // elements of one [T, Hk, D] tensor
  __nv_bfloat16 *k = q + a.t * a.hq * a.d, *k_rot = k + kv, *v = k_rot + kv;
  if (s.ok()) s = copy_heads(a, 0, a.hq, q, stream);
  if (s.ok()) s = copy_heads(a, a.hq, a.hk, k, stream);
  if (s.ok()) {
    Args step;
    step.inputs = {ref(a.positions, DType::kI64, {a.t}), ref(q, DType::kBF16, {a.t, a.hq, a.d}),
                   ref(k, DType::kBF16, {a.t, a.hk, a.d}),
                   ref(a.cos_sin, DType::kF32, {a.max_pos, a.rot_dim})};
    step.outputs = {ref(a.q_out, DType::kBF16, {a.t, a.hq, a.d}),
                    ref(k_rot, DType::kBF16, {a.t, a.hk, a.d})};
    step.params = {{"is_neox", a.is_neox ? 1.0 : 0.0}};
    s = with_context("rope", rope->launch(step, stream));
  }
  if (s.ok()) s = copy_heads(a, a.hq + a.hk, a.hk, v, stream);
  if (s.ok()) {
    const CacheShapes shapes =
        cache_shapes(a.layout, a.num_blocks, a.block_size, a.hk, a.d, kCacheVectorBytes / 2);
    Args step;
    step.inputs = {ref(k_rot, DType::kBF16, {a.t, a.hk, a.d}),
                   ref(v, DType::kBF16, {a.t, a.hk, a.d}),
                   ref(a.slots, DType::kI64, {a.t})};
    step.outputs = {ref(a.key_cache, DType::kBF16, shapes.key),
                    ref(a.value_cache, DType::kBF16, shapes.value)};
    step.params = {{"layout", double(int(a.layout))}};
    s = with_context("reshape_and_cache", cache->launch(step, stream));
  }
  return s;
}

// What the chains really move: the FP8 chains 9 B per element (+ scales), the norm chain 8 B
// (norm 4 B, rope 4 B) plus what every rope launch reads.
template <const ActOp& kOp>
Version silu_chain(const char* summary) {
  Version v = act_version(kOp, "chain_unfused", summary, chain_silu_quant<kOp>, {}, Kind::kPeer);
  v.kernels_per_launch = 2;
  v.bytes = [](const Args& a) {
    return 9.0 * double(a.outputs.at(0).numel()) + double(a.outputs.at(1).bytes());
  };
  return v;
}

const Register kPerToken{silu_chain<kSiluFp8PerToken>(
    "v1 to a BF16 y, then chapter 03's per-token FP8 kernel: 2 kernels, 9 B")};
const Register kPerGroup{silu_chain<kSiluFp8PerGroup>(
    "v1 to a BF16 y, then chapter 03's 1 x 128 FP8 kernel: 2 kernels, 9 B")};
const Register kQkvChain{[] {
  Version v = version_of(kChapter, kQkvRopeCache, "chain_unfused",
                         "q, k copied out of qkv, v4, v copied out, v8: 5 steps, 8 to 12 B",
                         Kind::kPeer, {});
  v.launch = [](const Args& args, cudaStream_t stream) -> Status {
    QkvArgs a;
    Status s = qkv_args(args, &a);
    return s.ok() ? chain_qkv_rope_cache(a, stream) : s;
  };
  v.kernels_per_launch = 5;
  v.flops = qkv_flops;
  // 8 B an element of q and v, 12 B of k (every token cached), positions, slots, cos/sin rows.
  v.bytes = [](const Args& args) {
    const TensorRef& q = args.outputs.at(2);
    const double t = double(q.dim(0)), d = double(q.dim(2)), hq = double(q.dim(1));
    const double hk = (double(args.inputs[1].dim(1)) - hq) / 2.0;
    const double rows = 16.0 * t + 4.0 * t * double(args.inputs[2].dim(1));
    return 8.0 * t * hq * d + 20.0 * t * hk * d + rows;
  };
  return v;
}()};
const Register kNormRope{[] {
  Version v = rope_version(kQkNormRope, "chain_unfused",
                           "chapter 04's RMSNorm of q's and k's heads, then v4: 3 kernels, 8 B",
                           chain_qk_norm_rope, {}, Kind::kPeer);
  v.kernels_per_launch = 3;
  v.bytes = [](const Args& a) { return 2.0 * rope_bytes(kQkNormRope, a); };
  return v;
}()};

}  // namespace
}  // namespace lkw::elementwise
