// v0_act_scalar — a thread per output element: the gated activation written the obvious way.
//
// y[t, i] = bf16(act(gate[t, i]) · up[t, i]). Each thread reads its gate and its up (two 2-byte
// loads, d elements apart) and writes one BF16. The arithmetic (elementwise.cuh: activation,
// act_and_mul) is what every later version keeps; only the way bytes move changes. A warp's 32
// loads are one contiguous 64-byte run, so the accesses coalesce; what costs is the count of
// instructions per byte — three memory instructions for 6 bytes, each 2 bytes wide — and the
// index arithmetic beside them.
// Expect: far below the copy ceiling at prefill sizes (narrow accesses cannot keep enough bytes
// in flight per SM); SASS: no 128-bit loads or stores.
#include "elementwise.cuh"

namespace lkw::elementwise {
namespace {

constexpr int kThreads = 256;

template <Act kAct>
__global__ void __launch_bounds__(kThreads)
    act_v0_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, int64_t t,
                  int64_t d, bool act_first, float limit) {
  const int64_t n = t * d;
  // BEGIN SOLUTION: v0 — element e = (row, i): gate and up d apart in row's 2d inputs
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * kThreads) {
    const int64_t row = e / d, i = e % d;
    const __nv_bfloat16* in = x + row * 2 * d;  // (T, 2d)
    const float gate = __bfloat162float(in[act_first ? i : d + i]);
    const float up = __bfloat162float(in[act_first ? d + i : i]);
    y[e] = __float2bfloat16_rn(act_and_mul<kAct>(gate, up, limit));  // (T, d)
  }
  // END SOLUTION
}

template <const ActOp& kOp>
Status act_v0(const ActArgs& a, cudaStream_t stream) {
  Status s = validate_act(kOp, a, 1, std::numeric_limits<int32_t>::max());
  if (!s.ok()) return s;
  // Enough blocks for every element up to a few waves of the largest GPU; the loop takes the rest.
  const int64_t blocks = std::min<int64_t>((a.t * a.d + kThreads - 1) / kThreads, 1 << 16);
  act_v0_kernel<kOp.act><<<unsigned(blocks), kThreads, 0, stream>>>(a.x, a.y, a.t, a.d,
                                                                     a.act_first, a.limit);
  return last_launch_status(kOp.name);
}

constexpr const char* kSummary = "a thread per output element, 2-byte loads and stores";
SassFact facts(const char* kernel) {
  return {kernel, {}, {}, {"LDG.E.128", "STG.E.128"}, true, "2-byte accesses only"};
}
const Register kSilu{act_version(kSiluAndMul, "v0_act_scalar", kSummary, act_v0<kSiluAndMul>,
                                 {facts("act_v0_kernel*ActE0E")})};
const Register kGelu{act_version(kGeluAndMul, "v0_act_scalar", kSummary, act_v0<kGeluAndMul>,
                                 {facts("act_v0_kernel*ActE1E")})};
const Register kGeluTanh{act_version(kGeluTanhAndMul, "v0_act_scalar", kSummary,
                                     act_v0<kGeluTanhAndMul>, {facts("act_v0_kernel*ActE2E")})};

}  // namespace
}  // namespace lkw::elementwise
