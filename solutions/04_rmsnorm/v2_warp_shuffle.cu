// v2_warp_shuffle — warp shuffles instead of the tree; two elements (bf16x2, 4 bytes) per access.
//
// Since v1: a warp adds its 32 partial sums in registers, five __shfl_xor_sync steps with no
// shared memory and no barrier; only the 8 warp totals go through shared memory, behind one
// barrier, and every thread then adds those 8 itself (broadcast reads) instead of waiting on a
// second round. The accesses move pairs: a warp's load is 128 contiguous bytes, half as many
// load instructions for the same bytes. An odd d has no aligned pairs, so it runs the same kernel
// one element at a time (for the whole tensor: pairs would straddle rows). The second pass still
// reads x again from the L1/L2. Expect: closer to the ceiling than v1, limited by 4-byte
// accesses and the second pass; SASS: SHFL.BFLY, no 16-byte loads.
#include "rmsnorm.cuh"

namespace lkw::rmsnorm {
namespace {

constexpr int kThreads = 256;

template <int kVec>  // 2: bf16x2 pairs (d even), 1: single elements
__global__ void __launch_bounds__(kThreads)
    rmsnorm_v2_warp_shuffle_kernel(const __nv_bfloat16* __restrict__ x,
                                   const __nv_bfloat16* __restrict__ weight,
                                   __nv_bfloat16* __restrict__ y, int64_t d, float eps) {
  const int64_t units = d / kVec;
  const auto* x_row = reinterpret_cast<const Bf16Vec<kVec>*>(x + blockIdx.x * d);  // (T, d/kVec)
  const auto* w_vec = reinterpret_cast<const Bf16Vec<kVec>*>(weight);              // (d/kVec)
  auto* y_row = reinterpret_cast<Bf16Vec<kVec>*>(y + blockIdx.x * d);              // (T, d/kVec)

  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < units; i += kThreads) {
    const Bf16Vec<kVec> v = x_row[i];
#pragma unroll
    for (int j = 0; j < kVec; ++j) ss = __fmaf_rn(get(v, j), get(v, j), ss);
  }
  // BEGIN SOLUTION: warp butterfly, lane 0 stores, one barrier, every thread sums the totals
  __shared__ float warp_total_sh[kThreads / 32];
  const int lane_idx = threadIdx.x % 32, warp_idx = threadIdx.x / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, offset));
  if (lane_idx == 0) warp_total_sh[warp_idx] = ss;
  __syncthreads();
  ss = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) ss = __fadd_rn(ss, warp_total_sh[w]);
  // END SOLUTION
  const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(ss, float(d)), eps));

  for (int64_t i = threadIdx.x; i < units; i += kThreads) {
    const Bf16Vec<kVec> v = x_row[i], w = w_vec[i];
    Bf16Vec<kVec> out{};
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float z = f32(bf16(__fmul_rn(get(v, j), rstd)));
      put(out, j, __fmul_rn(z, get(w, j)));
    }
    y_row[i] = out;
  }
}

Status rmsnorm_v2_warp_shuffle(const NormArgs& a, cudaStream_t stream) {
  const bool pairs = a.d % 2 == 0;
  Status s = validate_norm(kRmsnorm, a, pairs ? 2 : 1, kNoLimit);
  if (!s.ok()) return s;
  if (pairs) {
    rmsnorm_v2_warp_shuffle_kernel<2>
        <<<unsigned(a.t), kThreads, 0, stream>>>(a.x, a.weight, a.y, a.d, a.eps);
  } else {
    rmsnorm_v2_warp_shuffle_kernel<1>
        <<<unsigned(a.t), kThreads, 0, stream>>>(a.x, a.weight, a.y, a.d, a.eps);
  }
  return last_launch_status(kRmsnorm.name);
}

const Register kRegistered{
    norm_version(kRmsnorm, "v2_warp_shuffle",
                 "warp shuffles, one barrier; bf16x2 (4-byte) accesses", rmsnorm_v2_warp_shuffle,
                 {{"rmsnorm_v2_warp_shuffle_kernel*Li2E",
                   {},
                   {"SHFL.BFLY"},
                   {"LDG.E.128", "LDG.E.64"},
                   true,
                   "shuffle reduction; pairs of BF16 (4-byte loads), nothing wider"}})};

}  // namespace
}  // namespace lkw::rmsnorm
