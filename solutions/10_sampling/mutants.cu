// Mutants of chapter 10, each a plausible slip that the golden cases must catch:
//   top_p_renorm_probs/mutant_off_by_one     the token that carries the running mass across p
//                                            dropped (keep M_ge < p·M instead of M_gt < p·M: the
//                                            inclusive cumsum where the exclusive one belongs)
//   top_p_renorm_probs/mutant_no_renorm      the kept probs written as they are, not divided by
//                                            their sum
//   rejection_sample/mutant_q_p_swapped      draft and target probs exchanged: u·p < q accepts,
//                                            the residual is (q − p)⁺ (v5 on swapped copies)
// The sampled ops' distributions have their own mutant-style checks in Python (a wrong sampler
// must fail the chi-square test there).
#include <cmath>

#include "lkw/workspace.h"
#include "select.cuh"

namespace lkw::sampling {
namespace {

constexpr int kThreads = 512;  // radix_select: at most kMaxWarps warps

// v2's top-p, with one slip in the output stage.
template <bool kOffByOne, bool kNoRenorm>
__global__ void __launch_bounds__(kThreads)
    top_p_slip_kernel(const float* __restrict__ x, const float* __restrict__ top_p,
                      float* __restrict__ out, int64_t v) {
  __shared__ RadixShared sh;
  const int64_t row = blockIdx.x;
  const float* x_row = x + row * v;
  const float p = top_p[row];
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) m = fmaxf(m, x_row[i]);
  m = rmsnorm::block_reduce<rmsnorm::Max>(m);
  float threshold = -INFINITY;
  if (p < 1.0f && m > 0.0f) {
    int e;
    frexpf(m, &e);
    const int scale = kFixedBits - e;
    threshold = key_value(radix_select(
        sh, v, [x_row](int64_t i) { return order_key(x_row[i]); },
        [x_row, scale](int64_t i) { return uint64_t(__float2ull_rn(ldexpf(x_row[i], scale))); },
        [p](unsigned long long total) {
          const double want = ceil(double(p) * double(total));
          return want < 1.0 ? 1ull : want > double(total) ? total : (unsigned long long)want;
        }));
    if (kOffByOne) threshold = nextafterf(threshold, INFINITY);  // keep x > t: the tie group at t goes
  }
  if (kNoRenorm) {
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x)
      out[row * v + i] = x_row[i] >= threshold ? x_row[i] : 0.0f;
  } else {
    write_row<true>(x_row, out + row * v, v, threshold);
  }
}

template <bool kOffByOne, bool kNoRenorm>
Status top_p_slip(const TopPArgs& a, cudaStream_t stream) {
  Status s = validate_top_p(a);
  if (!s.ok()) return s;
  top_p_slip_kernel<kOffByOne, kNoRenorm><<<unsigned(a.b), kThreads, 0, stream>>>(a.x, a.top_p, a.out, a.v);
  return last_launch_status(kTopPRenorm.name);
}

// v5 on copies with q and p exchanged: q' = p[:, :S], p' = [q, p[:, S]].
Status swapped(const RejectionArgs& a, cudaStream_t stream) {
  Status s = validate_rejection(a);
  if (!s.ok()) return s;
  const Version* v5 = nullptr;
  s = Registry::get().require(std::string(kChapter) + "/" + kRejection + "/v5_speculative",
                              "a mutant", &v5);
  if (!s.ok()) return s;
  const size_t row = size_t(a.v) * 4, q_bytes = size_t(a.b * a.s) * row;
  static Workspace workspace("mutant_q_p_swapped copies");
  void* base = nullptr;
  s = workspace.get(int64_t(q_bytes + size_t(a.b * (a.s + 1)) * row), &base);
  if (!s.ok()) return s;
  auto* q2 = static_cast<char*>(base);
  char* p2 = q2 + q_bytes;
  const size_t s_rows = size_t(a.s) * row, all_rows = size_t(a.s + 1) * row;
  cudaError_t e = cudaMemcpy2DAsync(q2, s_rows, a.p, all_rows, s_rows, size_t(a.b),
                                    cudaMemcpyDeviceToDevice, stream);
  if (e == cudaSuccess)
    e = cudaMemcpy2DAsync(p2, all_rows, a.q, s_rows, s_rows, size_t(a.b), cudaMemcpyDeviceToDevice, stream);
  if (e == cudaSuccess)
    e = cudaMemcpy2DAsync(p2 + s_rows, all_rows, reinterpret_cast<const char*>(a.p) + s_rows, all_rows,
                          row, size_t(a.b), cudaMemcpyDeviceToDevice, stream);
  if (e != cudaSuccess) return error(Code::kCudaError, cudaGetErrorString(e));
  Args b;
  b.inputs = {{q2, DType::kF32, {a.b, a.s, a.v}},
              {const_cast<int32_t*>(a.draft), DType::kI32, {a.b, a.s}},
              {p2, DType::kF32, {a.b, a.s + 1, a.v}},
              {const_cast<int64_t*>(a.seed_offset), DType::kI64, {2}}};
  b.outputs = {{a.tokens, DType::kI32, {a.b, a.s + 1}}, {a.accepted, DType::kI32, {a.b}}};
  return v5->launch(b, stream);
}

const Register kOffByOne{top_p_version("mutant_off_by_one",
                                       "the boundary token dropped (inclusive instead of exclusive)",
                                       top_p_slip<true, false>, {}, Kind::kMutant)};
const Register kNoRenorm{top_p_version("mutant_no_renorm", "the kept probs not renormalized",
                                       top_p_slip<false, true>, {}, Kind::kMutant)};
const Register kSwapped{rejection_version("mutant_q_p_swapped", "draft and target probs exchanged",
                                          swapped, {}, Kind::kMutant)};

}  // namespace
}  // namespace lkw::sampling
