// The whole MoE block as the chapter's kernels chain it (op moe_block): the check the issue asks
// for, that the ops compose into the layer (lkw.moe.moe_layer_reference), and the block's time.
//   top-k softmax (v6) → align (v2 up to kOneBlockSlots slots, v3 above: where each measured
//   fastest) → gate_up with SiLU-and-mul → down (topk 1: row s of h is slot s) → sum (v11); the
//   GEMMs are v12 (wgmma) where the device has it, v8 and v7 below sm_90
// The steps are looked up in the registry when the block runs, so the chain is always the
// current versions. Inputs x BF16 [T, d], router logits FP32 [T, E], w_gate_up BF16
// [E, 2·d_ff, d] (gate rows first), w_down BF16 [E, d, d_ff]; output y BF16 [T, d]; params topk,
// renormalize, block_m (default 64). The align runs with check_ids = 0 (the ids come from the
// top-k, always in range), so the block stays asynchronous and can live in a CUDA graph.
#include "align.cuh"
#include "experts.cuh"
#include "lkw/workspace.h"
#include "router.cuh"

namespace lkw::moe {
namespace {

constexpr const char* kBlockOp = "moe_block";
constexpr int64_t kOneBlockSlots = 2048;

Status find_step(const std::string& op, const char* id, const Version** v) {
  return Registry::get().require(std::string(kChapter) + "/" + op + "/" + id, "moe_block", v);
}

Status step(const char* what, const Version* v, const Args& a, cudaStream_t stream) {
  Status s = v->launch(a, stream);
  if (!s.ok()) s.message = std::string("moe_block, ") + what + ": " + s.message;
  return s;
}

struct Block {
  TensorRef x, logits, w13, w2, y;
  int64_t t, d, d_ff;
  int e, topk, block_m;
  bool renormalize;
};

Status block_args(const Args& a, Block* b) {
  Status s = Check()
                 .that(a.inputs.size() == 4 && a.outputs.size() == 1,
                       "moe_block takes x, router logits, w_gate_up, w_down and writes y")
                 .that(a.params.count("topk") == 1, "moe_block needs the param topk")
                 .status();
  if (!s.ok()) return s;
  const TensorRef &x = a.inputs[0], &z = a.inputs[1], &w13 = a.inputs[2], &w2 = a.inputs[3],
                  &y = a.outputs[0];
  auto of = [](const TensorRef& t, DType d, size_t rank) {
    return t.dtype == d && t.shape.size() == rank;
  };
  s = Check()
          .that(of(x, DType::kBF16, 2) && of(z, DType::kF32, 2) && of(w13, DType::kBF16, 3) &&
                    of(w2, DType::kBF16, 3) && of(y, DType::kBF16, 2),
                "moe_block: x BF16 [T, d], logits FP32 [T, E], w_gate_up BF16 [E, 2·d_ff, d], "
                "w_down BF16 [E, d, d_ff], y BF16 [T, d]")
          .status();
  if (!s.ok()) return s;
  const int64_t t = x.dim(0), d = x.dim(1), e = z.dim(1), d_ff = w2.dim(2);
  const int topk = int(a.param("topk", 0.0)), block_m = int(a.param("block_m", 64.0));
  // Everything the steps will check, checked before the first of them runs: a refused block
  // writes nothing, not even its intermediates.
  s = Check()
          .not_null(x.data, "x")
          .not_null(z.data, "logits")
          .not_null(w13.data, "w_gate_up")
          .not_null(w2.data, "w_down")
          .not_null(y.data, "y")
          .positive(t, "T")
          .positive(d, "d")
          .positive(d_ff, "d_ff")
          .that(z.dim(0) == t && y.dim(0) == t && y.dim(1) == d,
                "logits and y must have x's T rows, y its d columns")
          .that(e >= 1 && e <= 512 && w13.dim(0) == e && w2.dim(0) == e,
                "E (the logits' columns) must be in 1..512 (top-k v6) and the weights hold E experts")
          .that(w13.dim(1) == 2 * d_ff && w13.dim(2) == d && w2.dim(1) == d,
                "w_gate_up must be [E, 2·d_ff, d] and w_down [E, d, d_ff]")
          .that(topk >= 1 && topk <= std::min<int64_t>(e, 32), "topk must be in 1..min(E, 32)")
          .that(block_m >= 16 && block_m <= kMaxBlockM && block_m % 16 == 0,
                "block_m must be a multiple of 16 in 16..1024")
          .that(d % 8 == 0 && d_ff % 8 == 0,
                "d and d_ff must be multiples of 8 (16-byte rows; gate and up halves of whole n8 tiles)")
          .that(t * topk * std::max(d, d_ff) < (int64_t(1) << 31), "T·topk·max(d, d_ff) must fit int32")
          .that(e * std::max(2 * d_ff, d) < (int64_t(1) << 31) && d / 8 <= (1 << 20),
                "E·max(2·d_ff, d) must be below 2^31 (v12's TMA rows) and d at most 2^23 (v11)")
          .aligned(x.data, 16, "x")
          .aligned(z.data, 4, "logits")
          .aligned(w13.data, 16, "w_gate_up")
          .aligned(w2.data, 16, "w_down")
          .aligned(y.data, 16, "y")
          .disjoint(y.data, y.bytes(), x.data, x.bytes(), "y and x")
          .disjoint(y.data, y.bytes(), z.data, z.bytes(), "y and logits")
          .arch_at_least(80)
          .status();
  if (!s.ok()) return s;
  *b = Block{x, z, w13, w2, y, t, d, d_ff, int(e), topk, block_m,
             a.param("renormalize", 0.0) != 0.0};
  return {};
}

// The block's intermediates, one workspace (lkw::Workspace: per device, grown on demand, no
// memset): weights, ids, the align's three arrays, h and the down GEMM's rows.
struct Scratch {
  float* weights;
  int32_t *ids, *sorted, *experts, *post;
  __nv_bfloat16 *h, *down;
};

Status scratch_for(const Block& b, int64_t capacity, Scratch* s) {
  static Workspace workspace("moe_block intermediates");
  const int64_t slots = b.t * b.topk;
  auto up = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t sizes[] = {up(4 * slots),        up(4 * slots),         up(4 * capacity),
                           up(4 * (capacity / b.block_m)), up(4),     up(2 * slots * b.d_ff),
                           up(2 * slots * b.d)};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  void* base = nullptr;
  Status st = workspace.get(total, &base);
  if (!st.ok()) return st;
  char* p = static_cast<char*>(base);
  void* at[7];
  for (int i = 0; i < 7; ++i) at[i] = p, p += sizes[i];
  *s = Scratch{static_cast<float*>(at[0]),   static_cast<int32_t*>(at[1]),
               static_cast<int32_t*>(at[2]), static_cast<int32_t*>(at[3]),
               static_cast<int32_t*>(at[4]), static_cast<__nv_bfloat16*>(at[5]),
               static_cast<__nv_bfloat16*>(at[6])};
  return {};
}

// sum_id: the weighted sum's version (v11; the mutant's slip). kFused: the down GEMM and the sum
// as one step, moe_grouped_gemm_sum (v12's epilogue adds each weighted row into its token's).
template <const char* const* kSumId, bool kFused = false>
Status block_chain(const Args& a, cudaStream_t stream) {
  Block b;
  Status s = block_args(a, &b);
  if (!s.ok()) return s;
  const int64_t slots = b.t * b.topk;
  const Version *topk = nullptr, *align = nullptr, *gate_up = nullptr, *down = nullptr, *sum = nullptr;
  s = find_step(kTopkSoftmax.name, "v6_topk_vec16_lanes", &topk);
  if (s.ok())
    s = find_step("moe_align_block_size",
                  slots <= kOneBlockSlots ? "v2_align_shared_counting" : "v3_align_multi_block", &align);
  const bool wgmma = device_arch() >= 90;
  if (s.ok())
    s = find_step(kGroupedSiluOp, wgmma ? "v12_grouped_wgmma" : "v8_grouped_silu_epilogue", &gate_up);
  if (s.ok() && kFused) s = find_step(kGroupedSumOp, "v12_grouped_wgmma", &down);
  if (s.ok() && !kFused) s = find_step(kGroupedOp, wgmma ? "v12_grouped_wgmma" : "v7_grouped_mma", &down);
  if (s.ok() && !kFused) s = find_step(kSumOp, *kSumId, &sum);
  const int64_t capacity = align_capacity(slots, b.e, b.block_m);
  Scratch w{};
  if (s.ok()) s = scratch_for(b, capacity, &w);
  if (!s.ok()) return s;

  // Route: weights and ids [T, k], then the align's schedule.
  Args route;
  route.inputs = {b.logits};
  route.outputs = {{w.weights, DType::kF32, {b.t, b.topk}}, {w.ids, DType::kI32, {b.t, b.topk}}};
  route.params = {{"k", double(b.topk)}, {"renormalize", b.renormalize ? 1.0 : 0.0}};
  s = step("top-k", topk, route, stream);
  Args sort;
  sort.inputs = {{w.ids, DType::kI32, {b.t, b.topk}}};
  sort.outputs = {{w.sorted, DType::kI32, {capacity}},
                  {w.experts, DType::kI32, {capacity / b.block_m}},
                  {w.post, DType::kI32, {1}}};
  sort.params = {{"num_experts", double(b.e)}, {"block_m", double(b.block_m)}, {"check_ids", 0.0}};
  if (s.ok()) s = step("align", align, sort, stream);

  // Experts: h = silu(gate)·up per slot, then the down rows per slot (x = h, topk 1).
  const TensorRef sorted_ref{w.sorted, DType::kI32, {capacity}},
      experts_ref{w.experts, DType::kI32, {capacity / b.block_m}};
  Args first;
  first.inputs = {b.x, b.w13, sorted_ref, experts_ref};
  first.outputs = {{w.h, DType::kBF16, {slots, b.d_ff}}};
  first.params = {{"topk", double(b.topk)}, {"block_m", double(b.block_m)}};
  if (s.ok()) s = step("gate_up", gate_up, first, stream);
  if (kFused) {  // y[t] = sum_j weights[t, j] · (h[t·k + j] · w_down[e]ᵀ), in the GEMM's epilogue
    Args fused;
    fused.inputs = {{w.h, DType::kBF16, {slots, b.d_ff}}, b.w2, sorted_ref, experts_ref,
                    {w.weights, DType::kF32, {b.t, b.topk}}};
    fused.outputs = {b.y};
    fused.params = {{"block_m", double(b.block_m)}};
    if (s.ok()) s = step("down and sum", down, fused, stream);
    return s;
  }
  Args second;
  second.inputs = {{w.h, DType::kBF16, {slots, b.d_ff}}, b.w2, sorted_ref, experts_ref};
  second.outputs = {{w.down, DType::kBF16, {slots, b.d}}};
  second.params = {{"topk", 1.0}, {"block_m", double(b.block_m)}};
  if (s.ok()) s = step("down", down, second, stream);

  // Combine: y[t] = sum_j weights[t, j] · down[t·k + j].
  Args combine;
  combine.inputs = {{w.down, DType::kBF16, {b.t, b.topk, b.d}}, {w.weights, DType::kF32, {b.t, b.topk}}};
  combine.outputs = {b.y};
  if (s.ok()) s = step("sum", sum, combine, stream);
  return s;
}

// The block's roofline minimum: x, the logits and y once, and the routed experts' two weight
// matrices (param routed_experts, else min(E, T·topk)); what the chain adds (ids, h and the down
// rows written and read back) is its cost, not the block's.
double block_bytes(const Args& a) {
  const TensorRef &x = a.inputs.at(0), &z = a.inputs.at(1), &w13 = a.inputs.at(2),
                  &w2 = a.inputs.at(3);
  const double experts = double(w13.dim(0)), slots = double(x.dim(0)) * a.param("topk", 1.0);
  const double routed = a.param("routed_experts", std::min(experts, slots));
  return double(x.bytes() + z.bytes() + a.outputs.at(0).bytes()) +
         routed * double(w13.bytes() + w2.bytes()) / experts;
}

double block_flops(const Args& a) {
  const TensorRef &x = a.inputs.at(0), &w2 = a.inputs.at(3);
  return 6.0 * double(x.dim(0)) * a.param("topk", 1.0) * double(x.dim(1)) * double(w2.dim(2));
}

// The block has no kernel of its own; what it promises of the machine code is its steps': the
// expert GEMMs on the tensor cores, and no step spilling to local memory.
std::vector<SassFact> block_facts() {
  const char* steps[] = {"topk_v6_softmax_kernel", "align_v2_shared_counting_kernel",
                         "align_v3_multi_block_kernel", "sum_v11_kernel"};
  std::vector<SassFact> facts = {
      {"grouped_v8_kernel", {}, {"HMMA", "LDGSTS"}, {}, true, "gate_up: tensor cores, no spills"},
      {"grouped_v7_kernel", {}, {"HMMA", "LDGSTS"}, {}, true, "down: tensor cores, no spills"},
      {"grouped_v12_kernel*EpiE", {"sm_90a"}, {"HGMMA", "UTMALDG"}, {"HMMA"}, true,
       "both GEMMs on sm_90a: wgmma, no spills"}};
  for (const char* k : steps) facts.push_back({k, {}, {}, {}, true, "a routing step, no spills"});
  return facts;
}

Version block_version(const char* id, const char* summary, GenericLaunch launch, Kind kind) {
  Version v = version_of(kChapter, kBlockOp, id, summary, kind,
                         kind == Kind::kVersion ? block_facts() : std::vector<SassFact>{});
  v.launch = std::move(launch);
  v.bytes = block_bytes;
  v.flops = block_flops;
  v.kernels_per_launch = 5;
  return v;
}

constexpr const char* kSumV11 = "v11_sum_thread_per_piece";
constexpr const char* kSumReversed = "mutant_weights_reversed";

const Register kChain{block_version(
    "block_chain", "top-k v6, align v2/v3, gate_up and down v12 (v8, v7 before sm_90), sum v11",
    block_chain<&kSumV11>, Kind::kVersion)};
const Register kChainFused{[] {
  Version v = block_version("block_chain_fused_sum",
                            "block_chain with the sum in the down GEMM's epilogue (v12, FP32 atomics)",
                            block_chain<&kSumV11, true>, Kind::kVersion);
  v.min_arch = 90;
  v.kernels_per_launch = 5;  // top-k, align, gate_up, down with the sum, the rounding
  return v;
}()};
// The block with moe_sum's mutant in place of v11: weight k − 1 − j on row j. Caught wherever
// topk > 1 (an emulation in tests/python/test_moe_golden.py shows it lands outside the tolerance).
const Register kChainReversed{block_version("mutant_block_weights_reversed",
                                            "the block summing with its weights reversed",
                                            block_chain<&kSumReversed>, Kind::kMutant)};

}  // namespace
}  // namespace lkw::moe
