// v1_row_in_registers — one block per row, the row loaded once and kept in registers.
//
// Since v0: each thread loads its kPerThread elements of the row (element j·blockDim + tid, so
// each warp-wide load is still one contiguous run) into registers before anything else, the
// block reduces the absmax, and the quantize pass reads the registers instead of memory. The
// block is sized to the row: ceil(d / kPerThread) threads, rounded up to whole warps; a fixed
// kPerThread lets the compiler index the array with constants, so it lives in registers, not in
// local memory. Rows longer than kPerThread × 1024 = 16384 are refused.
// Expect: one load instruction per element instead of two; accesses are still 2 and 1 bytes
// wide, which v2 widens. SASS: no LDG.E.128, no local memory.
#include "dynamic_quant.cuh"

namespace lkw::quant {
namespace {

constexpr int kPerThread = 16;  // row elements each thread holds
constexpr int kMaxThreads = 1024;

template <class Quant>
__global__ void __launch_bounds__(kMaxThreads)
    quant_v1_row_in_registers_kernel(const __nv_bfloat16* __restrict__ x,
                                     typename Quant::Code* __restrict__ q,
                                     float* __restrict__ scales, int d, float scale_ub) {
  __shared__ float red_sh[kMaxThreads / 32];
  const __nv_bfloat16* x_row = x + int64_t(blockIdx.x) * d;   // (T, d)
  typename Quant::Code* q_row = q + int64_t(blockIdx.x) * d;  // (T, d)
  // Load elements tid + j·blockDim, j < kPerThread, into a register array (0 beyond d) and take
  // their absmax; block_max; the scale (thread 0 stores it); quantize from the registers.
  // BEGIN SOLUTION: load, reduce, quantize from registers
  float x_rg[kPerThread];
  float absmax = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int col = threadIdx.x + j * blockDim.x;
    x_rg[j] = col < d ? __bfloat162float(x_row[col]) : 0.0f;
    absmax = fmaxf(absmax, fabsf(x_rg[j]));
  }
  absmax = block_max(absmax, red_sh);
  const float scale = Quant::scale(absmax, scale_ub);
  const float inv = Quant::inverse(scale);
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int col = threadIdx.x + j * blockDim.x;
    if (col < d) q_row[col] = Quant::code(x_rg[j], inv);
  }
  // END SOLUTION
}

template <const QuantOp& kOp, class Quant>
Status quant_v1_row_in_registers(const QuantArgs& a, cudaStream_t stream) {
  Status s = validate_quant(kOp, a, {int64_t(kPerThread) * kMaxThreads});
  if (!s.ok()) return s;
  const int threads = round_up_to_warp(ceil_div(a.d, kPerThread));
  quant_v1_row_in_registers_kernel<Quant><<<unsigned(a.t), threads, 0, stream>>>(
      a.x, static_cast<typename Quant::Code*>(a.q), a.scales, int(a.d), a.scale_ub);
  return last_launch_status(kOp.name);
}

SassFact in_registers(const char* kernel) {
  return {kernel, {},
          {},     {"LDG.E.128"},
          true,   "the row stays in registers (no local memory); loads still 2 bytes wide"};
}

constexpr const char* kSummary = "one block per row, the row read once into registers";
const Register kFp8Registered{quant_version(
    kPerTokenFp8, "v1_row_in_registers", kSummary, quant_v1_row_in_registers<kPerTokenFp8, Fp8>,
    {in_registers("quant_v1_row_in_registers_kernel*Fp8")})};
const Register kInt8Registered{quant_version(
    kPerTokenInt8, "v1_row_in_registers", kSummary, quant_v1_row_in_registers<kPerTokenInt8, Int8>,
    {in_registers("quant_v1_row_in_registers_kernel*Int8")})};

}  // namespace
}  // namespace lkw::quant
