// v1_block_tree — one block per row; the partial sums meet in a shared-memory tree.
//
// Since v0: the 256 threads of a block share a row. Thread t takes elements t, t + 256, ...: a
// warp's 32 loads are now 64 contiguous bytes, and T rows are T blocks, enough to fill the GPU.
// Each thread's partial sum of squares goes to shared memory, and a tree halves the live
// partials at each step — 8 steps for 256, each ending in a barrier, most threads idle in the
// later ones. Thread 0's total is the row's, read by all after the last barrier. The second pass
// reads x again, which the L1/L2 still hold: HBM sees the row about once, but every element is
// fetched twice through the memory pipeline, 2 bytes at a time. Expect: well above v0, still
// short of the ceiling (2-byte accesses); SASS: shared-memory loads and stores (LDS/STS), barriers
// (BAR.SYNC), no shuffles.
#include "rmsnorm.cuh"

namespace lkw::rmsnorm {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    rmsnorm_v1_block_tree_kernel(const __nv_bfloat16* __restrict__ x,
                                 const __nv_bfloat16* __restrict__ weight,
                                 __nv_bfloat16* __restrict__ y, int64_t d, float eps) {
  __shared__ float partial_sh[kThreads];
  const int tid = threadIdx.x;
  const __nv_bfloat16* x_row = x + blockIdx.x * d;  // (T, d)
  __nv_bfloat16* y_row = y + blockIdx.x * d;        // (T, d)

  float ss = 0.0f;
  for (int64_t k = tid; k < d; k += kThreads) {
    const float v = f32(x_row[k]);
    ss = __fmaf_rn(v, v, ss);
  }
  partial_sh[tid] = ss;
  __syncthreads();
  // BEGIN SOLUTION: halve the live partials each step (stride kThreads/2 … 1), a barrier each
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (tid < stride) partial_sh[tid] = __fadd_rn(partial_sh[tid], partial_sh[tid + stride]);
    __syncthreads();
  }
  // END SOLUTION
  const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(partial_sh[0], float(d)), eps));

  for (int64_t k = tid; k < d; k += kThreads) {
    const __nv_bfloat16 z = bf16(__fmul_rn(f32(x_row[k]), rstd));
    y_row[k] = bf16(__fmul_rn(f32(z), f32(weight[k])));
  }
}

Status rmsnorm_v1_block_tree(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kRmsnorm, a, 1, kNoLimit);
  if (!s.ok()) return s;
  rmsnorm_v1_block_tree_kernel<<<unsigned(a.t), kThreads, 0, stream>>>(a.x, a.weight, a.y, a.d,
                                                                       a.eps);
  return last_launch_status(kRmsnorm.name);
}

const Register kRegistered{
    norm_version(kRmsnorm, "v1_block_tree", "a block per row, shared-memory tree reduction",
                 rmsnorm_v1_block_tree,
                 {{"rmsnorm_v1_block_tree_kernel",
                   {},
                   {"LDS", "STS", "BAR.SYNC"},
                   {"SHFL"},
                   true,
                   "the tree in shared memory, barriers between its steps, no shuffles"}})};

}  // namespace
}  // namespace lkw::rmsnorm
