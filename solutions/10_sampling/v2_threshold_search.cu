// v2_threshold_search — one select for every filter: the weight of a token is a count (top-k) or
// its mass (top-p), and the threshold is the largest key whose upper set weighs enough.
//
// Since v1: the passes live in select.cuh as radix_select, with two changes. (1) The weight is an
// integer: 1 per token for top-k; for top-p an integer image of the mass (2^40 / the row's largest
// prob, rounded), so a bucket's sum does not depend on the order of the atomics and the threshold
// is the same on every run. The top-p threshold is the largest key t with W(key >= t) >= p·W: the
// token that carries the running mass across p is kept, as the contract says. (2) No atomics:
// lanes of a warp that hit one bucket add as one (__match_any_sync, __reduce_add_sync) into the
// warp's own histogram, summed after the pass. v1's first pass sends most of a row to two or
// three buckets (the top digit is the sign and high exponent bits), and same-address shared
// atomics serialize — a 64-bit one is even a compare-and-swap loop.
// Expect: top-k like v1 minus the first pass's atomic stalls; top-p one more read (the row's
// largest prob, for the scale). Outputs go through write_row: same threshold as v0, same bits.
// SASS: MATCH.ANY, REDUX.SUM, no ATOMS.CAST (no compare-and-swap loop).
#include "select.cuh"

namespace lkw::sampling {
namespace {

constexpr int kThreads = 512;  // radix_select: at most kMaxWarps warps

template <bool kTopP, bool kRenorm>
__global__ void __launch_bounds__(kThreads)
    threshold_search_kernel(const float* __restrict__ x, const void* __restrict__ param,
                            float* __restrict__ out, int64_t v) {
  __shared__ RadixShared sh;
  const int64_t row = blockIdx.x;
  const float* x_row = x + row * v;  // (B, V)
  auto key = [x_row](int64_t i) { return order_key(x_row[i]); };
  float threshold = -INFINITY;
  if constexpr (!kTopP) {
    const int32_t k = static_cast<const int32_t*>(param)[row];  // (B)
    if (top_k_on(k, v)) {
      // Stage: select the k-th largest key, counting.
      const uint32_t t = radix_select(sh, v, key, [](int64_t) { return uint64_t(1); },
                                      [k](unsigned long long) { return (unsigned long long)k; });
      threshold = key_value(t);
    }
  } else {
    const float p = static_cast<const float*>(param)[row];  // (B); NaN is not < 1: off
    // Stage: the scale of the integer mass, from the row's largest prob (a block max).
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) m = fmaxf(m, x_row[i]);
    m = rmsnorm::block_reduce<rmsnorm::Max>(m);
    if (p < 1.0f && m > 0.0f) {
      int e;
      frexpf(m, &e);  // m < 2^e, so every image is at most 2^kFixedBits
      const int scale = kFixedBits - e;
      // BEGIN SOLUTION: v2 — the mass image and the target p·W (at least 1, at most W)
      auto mass = [x_row, scale](int64_t i) {
        return uint64_t(__float2ull_rn(ldexpf(x_row[i], scale)));
      };
      auto target = [p](unsigned long long total) {
        const double want = ceil(double(p) * double(total));
        return want < 1.0 ? 1ull : want > double(total) ? total : (unsigned long long)want;
      };
      // STUB: auto mass = [](int64_t) { return uint64_t(1); };
      // STUB: auto target = [](unsigned long long total) { return total; };
      // END SOLUTION
      // Stage: select the top-p threshold, weighing.
      threshold = key_value(radix_select(sh, v, key, mass, target));
    }
  }
  // Stage: the filtered row.
  write_row<kRenorm>(x_row, out + row * v, v, threshold);
}

template <bool kTopP, bool kRenorm>
Status launch(const float* x, const void* param, float* out, int64_t b, int64_t v,
              cudaStream_t stream, const char* what) {
  threshold_search_kernel<kTopP, kRenorm><<<unsigned(b), kThreads, 0, stream>>>(x, param, out, v);
  return last_launch_status(what);
}

template <const FilterOp& kOp>
Status top_k_v2(const TopKArgs& a, cudaStream_t stream) {
  Status s = validate_top_k(a);
  return s.ok() ? launch<false, kOp.renorm>(a.x, a.top_k, a.out, a.b, a.v, stream, kOp.name) : s;
}

Status top_p_v2(const TopPArgs& a, cudaStream_t stream) {
  Status s = validate_top_p(a);
  return s.ok() ? launch<true, true>(a.x, a.top_p, a.out, a.b, a.v, stream, kTopPRenorm.name) : s;
}

constexpr const char* kSummary =
    "a block per row: top-k and top-p thresholds by one radix select of integer weights, "
    "warp-aggregated";
std::vector<SassFact> facts(const char* kernel) {
  return {{kernel, {}, {"MATCH.ANY", "REDUX.SUM"}, {"ATOMS.CAST"}, true,
           "warp-aggregated histograms per warp, no CAS loop, nothing spilled"}};
}
const Register kMask{top_k_version(kTopKMask, "v2_threshold_search", kSummary,
                                   top_k_v2<kTopKMask>, facts("threshold_search_kernelILb0ELb0E"))};
const Register kRenorm{top_k_version(kTopKRenorm, "v2_threshold_search", kSummary,
                                     top_k_v2<kTopKRenorm>, facts("threshold_search_kernelILb0ELb1E"))};
const Register kTopP{top_p_version("v2_threshold_search", kSummary, top_p_v2,
                                   facts("threshold_search_kernelILb1ELb1E"))};

}  // namespace
}  // namespace lkw::sampling
