// v1_act_vec16 — 16-byte vectors: 8 outputs a unit, two units in flight per thread.
//
// Since v0: a thread loads 8 gates and 8 ups with two 16-byte loads, computes 8 outputs and
// stores them with one 16-byte store — three memory instructions for 48 bytes instead of for 6.
// Units are numbered over the whole [T, d/8] output, so every block has the same work at any T
// (a row per block would leave most of a block idle at d = 14336 and the GPU idle at T = 1), and
// a thread issues all four loads of its two units before the first use: 64 bytes in flight per
// thread. A d that is not a multiple of 8 takes the same kernel with units of one element (a
// row then starts at any 2-byte boundary, so no wider access is safe).
// Expect: ≥ 92% of the copy ceiling at T = 8192 (6 B per output); SASS: LDG.E.128 and STG.E.128.
#include "elementwise.cuh"

namespace lkw::elementwise {
namespace {

constexpr int kThreads = 128;
constexpr int kUnits = 2;  // units per thread, kThreads apart: each warp access one run

template <Act kAct, int kVec>
__global__ void __launch_bounds__(kThreads)
    act_v1_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
                  int64_t units, int64_t row_units, bool act_first, float limit) {
  const auto* x_vec = reinterpret_cast<const Bf16Vec<kVec>*>(x);  // (T, 2 row_units)
  auto* y_vec = reinterpret_cast<Bf16Vec<kVec>*>(y);              // (T, row_units)
  const int64_t first = blockIdx.x * int64_t(kThreads * kUnits) + threadIdx.x;
  Bf16Vec<kVec> gate[kUnits], up[kUnits];
  // Stage: load every unit's gate and up before computing any.
  // BEGIN SOLUTION: v1 — unit u = (row, c): gate at row·2·row_units + c, up row_units further
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = first + u * kThreads;
    if (unit >= units) break;
    const int64_t row = unit / row_units, c = unit % row_units;
    const int64_t gate_at = row * 2 * row_units + c + (act_first ? 0 : row_units);
    const int64_t up_at = row * 2 * row_units + c + (act_first ? row_units : 0);
    gate[u] = x_vec[gate_at];
    up[u] = x_vec[up_at];
  }
  // STUB: (void)act_first;
  // END SOLUTION
  // Stage: compute in place of gate, store.
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = first + u * kThreads;
    if (unit >= units) break;
    // BEGIN SOLUTION: v1 — the 8 (or 1) outputs of the unit: act_and_mul, rounded by put
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      put(gate[u], j, act_and_mul<kAct>(get(gate[u], j), get(up[u], j), limit));
    // END SOLUTION
    y_vec[unit] = gate[u];
  }
}

template <Act kAct, int kVec>
void launch(const ActArgs& a, cudaStream_t stream) {
  const int64_t row_units = a.d / kVec, units = a.t * row_units;
  const int64_t per_block = int64_t(kThreads) * kUnits;
  const unsigned blocks = unsigned((units + per_block - 1) / per_block);
  act_v1_kernel<kAct, kVec>
      <<<blocks, kThreads, 0, stream>>>(a.x, a.y, units, row_units, a.act_first, a.limit);
}

template <const ActOp& kOp>
Status act_v1(const ActArgs& a, cudaStream_t stream) {
  const int vec = a.d % 8 == 0 ? 8 : 1;
  // The block count is a 32-bit grid dimension: T·d / 256 blocks must stay below 2^31.
  Status s = validate_act(kOp, a, vec, std::numeric_limits<int32_t>::max());
  if (!s.ok()) return s;
  if (vec == 8) {
    launch<kOp.act, 8>(a, stream);
  } else {
    launch<kOp.act, 1>(a, stream);
  }
  return last_launch_status(kOp.name);
}

constexpr const char* kSummary = "16-byte vectors, 8 outputs a unit, two units in flight a thread";
std::vector<SassFact> facts(const std::string& act) {
  const std::string kernel = "act_v1_kernel*ActE" + act + "E";
  return {{kernel + "Li8E", {}, {"LDG.E.128", "STG.E.128"}, {}, true, "16-byte loads and stores"},
          {kernel + "Li1E", {}, {}, {"LDG.E.128"}, true,
           "the scalar path (d % 8 != 0) keeps 2-byte accesses"}};
}
const Register kSilu{act_version(kSiluAndMul, "v1_act_vec16", kSummary, act_v1<kSiluAndMul>,
                                 facts("0"))};
const Register kGelu{act_version(kGeluAndMul, "v1_act_vec16", kSummary, act_v1<kGeluAndMul>,
                                 facts("1"))};
const Register kGeluTanh{act_version(kGeluTanhAndMul, "v1_act_vec16", kSummary,
                                     act_v1<kGeluTanhAndMul>, facts("2"))};

}  // namespace
}  // namespace lkw::elementwise
