// v3_pivot_rejection — sample first, then ask whether the sample survives the filters: the kept
// set is never built, so top-p needs no threshold and top-k no select (the approach FlashInfer
// describes for its sampling kernels).
//
// Since v2: `sample` without a sort (v0 sorts; temperature, top-k, top-p, min-p, Philox). A
// round draws a token j from the tokens whose key z is above `low` (an inverse CDF in index order,
// select.cuh's PrefixSearch), then counts and weighs the tokens above z_j: j is kept iff fewer than
// k are above it, their mass is below p·M and its own mass is at least min_p·max. Every filter
// keeps an upper set of the keys, so a rejected j proves every key up to z_j dropped; the same
// pass weighs the midpoint of z_j and `high`, and the pivot moves to it when it is kept too. The
// accepted token is distributed as the filtered distribution (a draw from a superset, conditioned
// on landing in the set). Top-k and top-p together need M(K), the mass top-k keeps (top_k_first):
// the one row where a radix select (v2's, counting) runs first; lkw.sampling.pivot_rejection_sample
// is the same loop. Expect: about two reads of the row a round, a few rounds a row; a block per
// row, so B = 1 uses one SM. SASS: the prefix search's shuffles, MUFU.EX2 (the exponentials).
#include "select.cuh"

namespace lkw::sampling {
namespace {

constexpr int kThreads = 512, kItems = 16;
constexpr int kMaxRounds = 64;  // then a draw from above `high`, where every key is kept
using Search = PrefixSearch<kThreads, kItems>;

struct Sum4Op {  // count above j, mass above j, count above the pivot, mass above the pivot
  __device__ float4 operator()(const float4& a, const float4& b) const {
    return {__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w)};
  }
};

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) pivot_rejection_kernel(SampleArgs a) {
  __shared__ typename Search::Shared search_sh;
  __shared__ RadixShared radix_sh;
  __shared__ typename cub::BlockReduce<ArgMax, kThreads>::TempStorage argmax_sh;
  __shared__ typename cub::BlockReduce<float4, kThreads>::TempStorage sum4_sh;
  __shared__ typename cub::BlockReduce<float, kThreads>::TempStorage min_sh;
  __shared__ ArgMax best_sh;
  __shared__ float4 above_sh;
  const int64_t row = blockIdx.x, v = a.v;
  auto x = [&](int64_t i) { return logit_at(a.logits, kBf16, row * v + i); };  // (B, V)
  const float t = a.temperature[row];                                          // (B)
  const int32_t k = a.top_k[row];
  const float p = a.top_p[row], min_p = a.min_p[row];

  // Stage: the largest logit, lowest index first: the greedy token, and z's maximum.
  ArgMax best{-INFINITY, -1};
  for (int64_t i = threadIdx.x; i < v; i += kThreads) {
    const float xi = x(i);
    if (best.i < 0 || xi > best.x) best = {xi, i};
  }
  best = cub::BlockReduce<ArgMax, kThreads>(argmax_sh).Reduce(best, ArgMaxOp{});
  if (threadIdx.x == 0) best_sh = best;
  __syncthreads();
  best = best_sh;
  const float zmax = __fdiv_rn(best.x, t);
  if (!(t > 0.0f) || !isfinite(zmax)) {  // greedy (or nothing to sample, or x / T overflowed)
    if (threadIdx.x == 0) a.tokens[row] = int32_t(best.i);
    return;
  }
  auto z = [&](int64_t i) { return __fdiv_rn(x(i), t); };
  auto mass = [&](float zi) { return expf(__fsub_rn(zi, zmax)); };
  const bool k_on = top_k_on(k, v), p_on = p < 1.0f, n_on = min_p > 0.0f;
  RowStream stream(a.seed_offset, row);

  // Stage (top-k with top-p): the k-th key by counting, and M(K), the mass top-p is judged on.
  float mk = 0.0f;
  if (k_on && p_on) {
    const float kth = key_value(radix_select(
        radix_sh, v, [&](int64_t i) { return order_key(z(i)); }, [](int64_t) { return uint64_t(1); },
        [k](unsigned long long) { return (unsigned long long)k; }));
    mk = Search::totals(search_sh, v, [&](int64_t i) {
      const float zi = z(i);
      return zi >= kth ? mass(zi) : 0.0f;
    });
  }
  // Stage (min-p): its threshold as a key, the smallest z whose mass reaches min_p, so a pivot
  // between two keys is judged as the keys around it are (mass(pivot) >= min_p is not the same
  // test: the cut can fall inside the gap).
  float n_key = -INFINITY;
  if (n_on) {
    float lowest = INFINITY;
    for (int64_t i = threadIdx.x; i < v; i += kThreads) {
      const float zi = z(i);
      if (mass(zi) >= min_p) lowest = fminf(lowest, zi);
    }
    lowest = cub::BlockReduce<float, kThreads>(min_sh).Reduce(lowest, cuda::minimum<>{});
    if (threadIdx.x == 0) above_sh.x = lowest;  // INFINITY when nothing reaches min_p
    __syncthreads();
    n_key = above_sh.x;
    __syncthreads();
  }
  // Would a token of key `key`, with `count` tokens and `above` mass above it, be kept?
  auto kept = [&](float key, float count, float above) {
    return (!k_on || count < float(k)) && (!p_on || above < __fmul_rn(p, mk)) && key >= n_key;
  };

  // Stage: the rounds.
  float low = -INFINITY, high = zmax;
  int64_t token = -1;
  for (int round = 0; round < kMaxRounds && token < 0; ++round) {
    // BEGIN SOLUTION: v3 — draw j above `low` (totals, then the search at u·total)
    const float u = stream.uniform();
    auto w = [&](int64_t i) {
      const float zi = z(i);
      return zi > low ? mass(zi) : 0.0f;
    };
    const float total = Search::totals(search_sh, v, w);
    const int64_t j = Search::search<true>(search_sh, v, __fmul_rn(u, total), w);
    // STUB: const float total = 0.0f;
    // STUB: const int64_t j = 0;
    // END SOLUTION
    if (round == 0 && p_on && !k_on) mk = total;  // nothing above −inf dropped: the row's mass
    if (j < 0) break;  // nothing of positive mass above `low`: cannot happen with a finite zmax
    const float zj = z(j);
    const float pivot = __fmul_rn(__fadd_rn(zj, high), 0.5f);
    // Stage: count and weigh the tokens above z_j and above the pivot, in one pass.
    float4 above{0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = threadIdx.x; i < v; i += kThreads) {
      const float zi = z(i);
      if (zi > zj) above.x += 1.0f, above.y = __fadd_rn(above.y, mass(zi));
      if (zi > pivot) above.z += 1.0f, above.w = __fadd_rn(above.w, mass(zi));
    }
    above = cub::BlockReduce<float4, kThreads>(sum4_sh).Reduce(above, Sum4Op{});
    if (threadIdx.x == 0) above_sh = above;
    __syncthreads();
    above = above_sh;
    __syncthreads();  // above_sh is rewritten next round
    // Stage: accept j, or move the pivot: everything up to z_j is dropped; up to the pivot too
    // when the pivot itself would be dropped.
    if (kept(zj, above.x, above.y)) {
      token = j;
    } else if (kept(pivot, above.z, above.w)) {
      low = zj, high = pivot;
    } else {
      low = pivot;
    }
  }
  if (token < 0) {  // rare: every key >= high is kept; draw among them
    auto w = [&](int64_t i) {
      const float zi = z(i);
      return zi >= high ? mass(zi) : 0.0f;
    };
    const float total = Search::totals(search_sh, v, w);
    token = Search::search<true>(search_sh, v, __fmul_rn(stream.uniform(), total), w);
    if (token < 0) token = best.i;  // min_p above 1 keeps nothing: the greedy token
  }
  // Stage: the token.
  if (threadIdx.x == 0) a.tokens[row] = int32_t(token);
}

Status sample_v3(const SampleArgs& a, cudaStream_t stream) {
  Status s = validate_sample(a);
  if (!s.ok()) return s;
  if (a.bf16)
    pivot_rejection_kernel<true><<<unsigned(a.b), kThreads, 0, stream>>>(a);
  else
    pivot_rejection_kernel<false><<<unsigned(a.b), kThreads, 0, stream>>>(a);
  return last_launch_status(kSample);
}

const Register kV3{sample_version(
    "v3_pivot_rejection", "a block per row: draw, then test the draw against the filters, pivoting",
    sample_v3, {{"pivot_rejection_kernelILb0E", {}, {"MUFU.EX2", "SHFL"}, {}, true,
                 "exponentials on the MUFU unit, block scans by shuffles, nothing spilled"}})};

}  // namespace
}  // namespace lkw::sampling
