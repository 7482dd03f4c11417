// Peers of chapter 04: the unfused chains that v4 and v5 replace, measured in the same run.
//   fused_add_rmsnorm/chain_unfused            add kernel (r to memory) → v3 on r:      10 B/elem
//   fused_add_rmsnorm_fp8/chain_unfused        add kernel → v3 to a BF16 scratch y → chapter
//   fused_add_rmsnorm_int8/chain_unfused       03's per-token quant reading y:          13 B/elem
//   fused_add_rmsnorm_fp8_group/chain_unfused  the same with chapter 03's per_group_fp8: 13 B/elem
// The norm and the quant are looked up in the registry when the chain runs, so the chain is
// always the current v3 and chapter 03's v2_vec16 quant kernels. Because v3, v4 and v5
// share one row routine, the chain's y, q and scales are the fused versions' bit for bit; the
// chapter's tests check that (tests/cpp/04_rmsnorm).

#include "lkw/workspace.h"
#include "rmsnorm.cuh"

namespace lkw::rmsnorm {
namespace {

constexpr const char* kNormVersion = "04_rmsnorm/rmsnorm/v3_vec16_registers";
constexpr const char* kFp8Version = "03_dynamic_quant/per_token_fp8/v2_vec16";
constexpr const char* kInt8Version = "03_dynamic_quant/per_token_int8/v2_vec16";
constexpr const char* kFp8GroupVersion = "03_dynamic_quant/per_group_fp8/v2_vec16";

constexpr int kAddThreads = 256;
constexpr int kAddUnits = 4;  // units per thread, strided by the block: whole-line warp accesses

// r = bf16(x + residual) over the whole [T, d] tensor, kVec elements a unit, several units in
// flight per thread (chapter 00's copy). residual_out may be residual_in: same thread, read first.
template <int kVec>
__global__ void __launch_bounds__(kAddThreads)
    residual_add_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* residual_in,
                        __nv_bfloat16* residual_out, int64_t units) {
  const auto* x_vec = reinterpret_cast<const Bf16Vec<kVec>*>(x);  // (T·d/kVec)
  const auto* in_vec = reinterpret_cast<const Bf16Vec<kVec>*>(residual_in);
  auto* out_vec = reinterpret_cast<Bf16Vec<kVec>*>(residual_out);
  const int64_t first = blockIdx.x * int64_t(kAddThreads * kAddUnits) + threadIdx.x;
  Bf16Vec<kVec> a[kAddUnits], b[kAddUnits];
#pragma unroll
  for (int u = 0; u < kAddUnits; ++u) {
    const int64_t i = first + u * kAddThreads;
    if (i < units) {
      a[u] = x_vec[i];
      b[u] = in_vec[i];
    }
  }
#pragma unroll
  for (int u = 0; u < kAddUnits; ++u) {
    const int64_t i = first + u * kAddThreads;
    if (i >= units) break;
#pragma unroll
    for (int j = 0; j < kVec; ++j) put(a[u], j, __fadd_rn(get(a[u], j), get(b[u], j)));
    out_vec[i] = a[u];
  }
}

Status launch_add(const NormArgs& a, cudaStream_t stream) {
  const int64_t units = a.t * a.d / row_vec(a.d);
  const int64_t per_block = int64_t(kAddThreads) * kAddUnits;
  const unsigned blocks = unsigned((units + per_block - 1) / per_block);
  if (row_vec(a.d) == 8) {
    residual_add_kernel<8>
        <<<blocks, kAddThreads, 0, stream>>>(a.x, a.residual_in, a.residual_out, units);
  } else {
    residual_add_kernel<1>
        <<<blocks, kAddThreads, 0, stream>>>(a.x, a.residual_in, a.residual_out, units);
  }
  return last_launch_status("residual_add_kernel");
}

Status find_version(const char* name, const Version** v) {
  return Registry::get().require(name, "the unfused chain", v);
}

Status with_context(const char* step, Status s) {
  if (!s.ok()) s.message = std::string("chain_unfused, ") + step + ": " + s.message;
  return s;
}

// The chain's BF16 y between its norm and its quant kernel. The registry's Args carry only the
// op's outputs, so this baseline keeps its own workspace (lkw::Workspace: one per device, grown
// on demand, kept for the process; no memset: nothing but the chain's own three kernels runs
// inside a launch, which the ncu pass relies on). Two chains running at once on different streams
// would share it: fine for a baseline timed one launch at a time, not an interface to build on.
Status scratch_y(int64_t bytes, void** out) {
  static Workspace workspace("chain_unfused scratch y");
  return workspace.get(bytes, out);
}

Args norm_step_args(const NormArgs& a, const __nv_bfloat16* r, void* y) {
  Args n;
  n.inputs = {{const_cast<__nv_bfloat16*>(r), DType::kBF16, {a.t, a.d}},
              {const_cast<__nv_bfloat16*>(a.weight), DType::kBF16, {a.d}}};
  n.outputs = {{y, DType::kBF16, {a.t, a.d}}};
  n.params = {{"eps", double(a.eps)}};
  return n;
}

Status chain_add_norm(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kFusedAdd, a, row_vec(a.d), row_max_d(a.d));
  const Version* norm = nullptr;
  if (s.ok()) s = find_version(kNormVersion, &norm);
  if (s.ok()) s = with_context("add", launch_add(a, stream));
  if (s.ok())
    s = with_context("norm", norm->launch(norm_step_args(a, a.residual_out, a.y), stream));
  return s;
}

template <const NormOp& kOp>
Status chain_add_norm_quant(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kOp, a, row_vec(a.d), row_max_d(a.d));
  const bool fp8 = kOp.quant == Quant::kFp8;
  const char* quant_step = kOp.group ? kFp8GroupVersion : fp8 ? kFp8Version : kInt8Version;
  const Version *norm = nullptr, *quant = nullptr;
  if (s.ok()) s = find_version(kNormVersion, &norm);
  if (s.ok()) s = find_version(quant_step, &quant);
  void* y = nullptr;
  if (s.ok()) s = scratch_y(2 * a.t * a.d, &y);
  if (s.ok()) s = with_context("add", launch_add(a, stream));
  if (s.ok()) s = with_context("norm", norm->launch(norm_step_args(a, a.residual_out, y), stream));
  if (s.ok()) {
    Args q;
    q.inputs = {{y, DType::kBF16, {a.t, a.d}}};
    q.outputs = {{a.q, fp8 ? DType::kE4M3 : DType::kI8, {a.t, a.d}},
                 {a.scales, DType::kF32, scales_shape(kOp, a.t, a.d)}};
    s = with_context("quant", quant->launch(q, stream));
  }
  return s;
}

std::vector<SassFact> add_facts() {
  return {{"residual_add_kernel*Li8E",
           {},
           {"LDG.E.128", "STG.E.128"},
           {},
           true,
           "the add kernel (first of the chain) moves 16-byte vectors"}};
}

// What the chains really move (the model the ncu bytes are compared with): per element, the add
// reads x and residual and writes r (6 B), the norm reads r and writes y (4 B), the quant reads y
// and writes q (3 B); the weight once, the scales 4 B each.
Version chain(const NormOp& op, const char* summary, NormLaunch launch, int kernels,
              double bytes_per_element) {
  Version v = norm_version(op, "chain_unfused", summary, launch, add_facts(), Kind::kPeer);
  v.kernels_per_launch = kernels;
  v.bytes = [op, bytes_per_element](const Args& a) {
    const TensorRef& x = a.inputs.at(0);
    const double scales = op.quant != Quant::kNone ? a.outputs.at(1).bytes() : 0.0;
    return bytes_per_element * double(x.numel()) + a.inputs.back().bytes() + scales;
  };
  return v;
}

const Register kAddNorm{chain(kFusedAdd, "add kernel, then v3 on r: r makes a round trip (10 B)",
                              chain_add_norm, 2, 10.0)};
// The quant step is chapter 03's per-token or per-group kernel: one kernel per launch.
const Register kAddNormFp8{chain(kFusedAddFp8,
                                 "add, v3 to a BF16 y, chapter 03 per-token FP8: 3 kernels, 13 B",
                                 chain_add_norm_quant<kFusedAddFp8>, 3, 13.0)};
const Register kAddNormFp8Group{
    chain(kFusedAddFp8Group, "add, v3 to a BF16 y, chapter 03 per-group FP8: 3 kernels, 13 B",
          chain_add_norm_quant<kFusedAddFp8Group>, 3, 13.0)};
const Register kAddNormInt8{chain(kFusedAddInt8,
                                  "add, v3 to a BF16 y, chapter 03 per-token INT8: 3 kernels, 13 B",
                                  chain_add_norm_quant<kFusedAddInt8>, 3, 13.0)};

}  // namespace
}  // namespace lkw::rmsnorm
