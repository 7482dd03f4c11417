// v0_scalar — one thread per row: the formula as a CPU programmer would write it.
//
// Thread `row` walks its row twice: the sum of squares, then y = bf16(bf16(x·rstd)·w). Correct,
// and slow for two reasons that every later version removes. The accesses are uncoalesced:
// at each step the 32 lanes of a warp read 32 elements d·2 bytes apart, 32 different lines of
// which they use 64 bytes, so most of every line fetched is wasted unless the L1/L2 keeps it
// until the lane's next 31 steps. And there is little parallelism: T = 8192 rows are 8192
// threads, two warps per SM, far too few loads in flight to cover HBM latency (the second pass
// does hit the caches). Expect: a small fraction of the copy ceiling; SASS: 2-byte loads
// (LDG.E.U16), no barriers, no shuffles.
#include "rmsnorm.cuh"

namespace lkw::rmsnorm {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    rmsnorm_v0_scalar_kernel(const __nv_bfloat16* __restrict__ x,
                             const __nv_bfloat16* __restrict__ weight,
                             __nv_bfloat16* __restrict__ y, int64_t t, int64_t d, float eps) {
  const int64_t row = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (row >= t) return;
  // BEGIN SOLUTION: sum of x² in FP32, rstd, then y[k] = bf16(bf16(x[k]·rstd)·w[k])
  const __nv_bfloat16* x_row = x + row * d;  // (T, d)
  __nv_bfloat16* y_row = y + row * d;        // (T, d)
  float ss = 0.0f;
  for (int64_t k = 0; k < d; ++k) {
    const float v = f32(x_row[k]);
    ss = __fmaf_rn(v, v, ss);
  }
  const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(ss, float(d)), eps));
  for (int64_t k = 0; k < d; ++k) {
    const __nv_bfloat16 z = bf16(__fmul_rn(f32(x_row[k]), rstd));
    y_row[k] = bf16(__fmul_rn(f32(z), f32(weight[k])));
  }
  // END SOLUTION
}

Status rmsnorm_v0_scalar(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kRmsnorm, a, 1, kNoLimit);
  if (!s.ok()) return s;
  const int64_t blocks = (a.t + kThreads - 1) / kThreads;
  rmsnorm_v0_scalar_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(a.x, a.weight, a.y, a.t, a.d,
                                                                      a.eps);
  return last_launch_status(kRmsnorm.name);
}

const Register kRegistered{norm_version(
    kRmsnorm, "v0_scalar", "one thread per row: uncoalesced, and only T threads", rmsnorm_v0_scalar,
    {{"rmsnorm_v0_scalar_kernel",
      {},
      {"LDG.E.U16"},
      {"BAR", "SHFL"},
      true,
      "2-byte loads, a row per thread: no barrier, no shuffle"}})};

}  // namespace
}  // namespace lkw::rmsnorm
