// v4_fused_cluster — the row read from HBM once: a cluster of CTAs holds it in shared memory, and
// every filter and the draw run on chip.
//
// Since v3: v3 reads the row about twice a round from L2 (or HBM, once B rows exceed the L2). Here
// a cluster of 8 CTAs (a launcher argument) splits the row; each copies its slice into shared
// memory with one bulk copy (the copy engine, no registers on the way), divides by T in place. The
// exact thresholds of v2, cluster-wide: top-k by a radix select of counts, top-p by one of the
// integer mass within top-k (no M(K) pass: pass 0's total IS M(K)), each pass merging the CTAs'
// histograms through distributed shared memory (one cluster barrier a pass, double-buffered);
// min-p needs only the max. The draw is an inverse CDF in index order: each CTA totals its slice,
// the CTAs' totals are exchanged, and the one CTA where u·total falls searches its slice. One
// uniform a row (u_0): lkw.sampling.sample is the same computation, token for token.
// Expect: HBM bytes = the row once; ~12 cluster barriers and ~10 passes over shared memory a row,
// which B = 1 spreads over 8 SMs. SASS: UBLKCP (the bulk copy), MATCH.ANY, no ATOMS.CAST.
#include <cooperative_groups.h>

#include <map>
#include <mutex>
#include <tuple>

#include "lkw/ptx.cuh"
#include "select.cuh"

namespace lkw::sampling {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512, kItems = 8;
constexpr int kMaxSliceBytes = 176 * 1024;  // the slice of z; static shared memory takes ~42 KB
using Search = PrefixSearch<kThreads, kItems>;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // the kernel's helpers: clusters are sm_90
struct Slice {  // what a CTA tells the others about its slice's draw
  float total;
  int64_t last;  // its last index of positive weight, in the row (-1: none)
};

// merge for radix_select: the CTAs' histograms summed in rank order (integers: any order agrees).
struct ClusterMerge {
  unsigned long long (*stage)[kBuckets];  // [2][kBuckets] in this CTA's shared memory
  __device__ void operator()(RadixShared& sh, int pass) const {
    cg::cluster_group cluster = cg::this_cluster();
    unsigned long long* mine = stage[pass & 1];  // a CTA rewrites it two barriers later
    for (int d = threadIdx.x; d < kBuckets; d += kThreads) mine[d] = sh.hist[d];
    cluster.sync();
    for (int d = threadIdx.x; d < kBuckets; d += kThreads) {
      unsigned long long sum = 0;
      for (unsigned r = 0; r < cluster.num_blocks(); ++r)
        sum += cluster.map_shared_rank(mine, r)[d];
      sh.hist[d] = sum;
    }
    __syncthreads();
  }
};
#endif

template <bool kBf16, bool kBulk>
__global__ void __launch_bounds__(kThreads) fused_cluster_kernel(SampleArgs a, int64_t slice) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters and the bulk copy: sm_90
  extern __shared__ float4 dynamic_sh[];
  float* z_sh = reinterpret_cast<float*>(dynamic_sh);  // this CTA's slice: x, then z = x / T
  __shared__ RadixShared radix_sh;
  __shared__ typename Search::Shared search_sh;
  __shared__ typename cub::BlockReduce<ArgMax, kThreads>::TempStorage argmax_tmp;
  __shared__ unsigned long long stage_sh[2][kBuckets];
  __shared__ ArgMax best_sh;
  __shared__ Slice slice_sh;
  __shared__ alignas(8) uint64_t loaded_bar;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
  const int64_t row = blockIdx.x / ranks, v = a.v;
  const int64_t first = rank * slice;  // this CTA's tokens: first .. first + len − 1
  const int64_t len = first < v ? (v - first < slice ? v - first : slice) : 0;
  const float t = a.temperature[row];  // (B)
  const int32_t k = a.top_k[row];
  const float p = a.top_p[row], min_p = a.min_p[row];

  // Stage: load the slice (one bulk copy, or element by element for BF16 / unaligned rows).
  if constexpr (kBulk) {
    if (threadIdx.x == 0) {
      ptx::mbarrier_init(&loaded_bar, 1);
      ptx::mbarrier_arrive_expect_tx(&loaded_bar, unsigned(4 * len));
      if (len > 0)
        ptx::bulk_load(z_sh, static_cast<const float*>(a.logits) + row * v + first,
                       unsigned(4 * len), &loaded_bar);
    }
    __syncthreads();  // the barrier is initialized before anyone waits on it
    ptx::mbarrier_wait(&loaded_bar, 0);
  } else {
    for (int64_t i = threadIdx.x; i < len; i += kThreads)
      z_sh[i] = logit_at(a.logits, kBf16, row * v + first + i);  // (B, V)
    __syncthreads();
  }

  // Stage: the largest logit of the row (lowest index first), cluster-wide.
  ArgMax best{-INFINITY, -1};
  for (int64_t i = threadIdx.x; i < len; i += kThreads)
    if (best.i < 0 || z_sh[i] > best.x) best = {z_sh[i], first + i};
  best = cub::BlockReduce<ArgMax, kThreads>(argmax_tmp).Reduce(best, ArgMaxOp{});
  if (threadIdx.x == 0) best_sh = best;
  cluster.sync();
  best = {-INFINITY, -1};
  for (unsigned r = 0; r < ranks; ++r) best = ArgMaxOp{}(best, *cluster.map_shared_rank(&best_sh, r));
  const float zmax = __fdiv_rn(best.x, t);
  if (!(t > 0.0f) || !isfinite(zmax)) {  // greedy (or nothing to sample, or x / T overflowed)
    if (rank == 0 && threadIdx.x == 0) a.tokens[row] = int32_t(best.i);
    cluster.sync();  // no CTA leaves while another may still read its shared memory
    return;
  }
  for (int64_t i = threadIdx.x; i < len; i += kThreads) z_sh[i] = __fdiv_rn(z_sh[i], t);
  __syncthreads();
  auto key = [z_sh](int64_t i) { return order_key(z_sh[i]); };
  auto mass = [zmax](float zi) { return expf(__fsub_rn(zi, zmax)); };
  const ClusterMerge merge{stage_sh};

  // Stage: top-k, a radix select of counts over the cluster.
  float tau = -INFINITY;
  if (top_k_on(k, v))
    tau = key_value(radix_select(radix_sh, len, key, [](int64_t) { return uint64_t(1); },
                                 [k](unsigned long long) { return (unsigned long long)k; }, merge));
  // Stage: top-p, a radix select of the integer mass of the tokens top-k keeps (mass <= 1).
  if (p < 1.0f) {
    // BEGIN SOLUTION: v4 — weigh only the tokens at or above tau; the target is p of pass 0's total
    auto weight = [z_sh, tau, mass](int64_t i) {
      const float zi = z_sh[i];
      return zi >= tau ? uint64_t(__float2ull_rn(ldexpf(mass(zi), kFixedBits))) : uint64_t(0);
    };
    auto target = [p](unsigned long long total) {
      const double want = ceil(double(p) * double(total));
      return want < 1.0 ? 1ull : want > double(total) ? total : (unsigned long long)want;
    };
    tau = fmaxf(tau, key_value(radix_select(radix_sh, len, key, weight, target, merge)));
    // STUB: (void)0;
    // END SOLUTION
  }

  // Stage: the draw. Each CTA totals its kept mass; the CTAs' totals in rank order give t.
  const bool n_on = min_p > 0.0f;
  auto w = [z_sh, tau, n_on, min_p, mass](int64_t i) {
    const float zi = z_sh[i];
    const float m = zi >= tau ? mass(zi) : 0.0f;
    return n_on && m < min_p ? 0.0f : m;
  };
  const float mine = Search::totals(search_sh, len, w);
  if (threadIdx.x == 0) slice_sh = {mine, search_sh.last < 0 ? -1 : first + search_sh.last};
  cluster.sync();
  RowStream stream(a.seed_offset, row);
  const float u = stream.uniform();
  float total = 0.0f;
  for (unsigned r = 0; r < ranks; ++r)
    total = __fadd_rn(total, cluster.map_shared_rank(&slice_sh, r)->total);
  const float target = __fmul_rn(u, total);
  float before = 0.0f;
  unsigned owner = ranks;  // the first CTA whose running total passes the target
  int64_t fallback = best.i;  // else the row's last token of positive weight (min_p > 1: greedy)
  for (unsigned r = 0; r < ranks; ++r) {
    const Slice s = *cluster.map_shared_rank(&slice_sh, r);
    const float after = __fadd_rn(before, s.total);
    if (owner == ranks && after > target) owner = r;
    if (owner == ranks) before = after;
    if (s.last >= 0) fallback = s.last;
  }
  // Stage: the owner searches its slice and writes the token.
  if (rank == owner) {
    const int64_t j = Search::search<true>(search_sh, len, target, w, before);
    if (threadIdx.x == 0) a.tokens[row] = int32_t(j < 0 ? fallback : first + j);
  } else if (owner == ranks && rank == 0 && threadIdx.x == 0) {
    a.tokens[row] = int32_t(fallback);
  }
  cluster.sync();  // no CTA leaves while another may still read its shared memory
#endif
}

constexpr int kPortableRanks = 8;  // the largest cluster every sm_90 device must launch

// A cluster above kPortableRanks CTAs is non-portable: the kernel must opt in, and whether the
// device can co-schedule one at all (that many SMs of one GPC free for CTAs of this size) is the
// occupancy calculator's answer, asked once per device, kernel and slice. 0 clusters: a refusal
// that says why, never a launch that fails on the device.
Status large_cluster_fits(const void* kernel, const cudaLaunchConfig_t& config, int ranks) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, size_t>, int> known;  // → clusters that fit
  std::lock_guard<std::mutex> lock(mutex);
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  const auto key = std::make_tuple(device, kernel, config.dynamicSmemBytes);
  auto it = known.find(key);
  if (e == cudaSuccess && it == known.end()) {
    int clusters = 0;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    if (e == cudaSuccess) it = known.emplace(key, clusters).first;
  }
  const std::string what = "a cluster of " + std::to_string(ranks) + " CTAs";
  if (e != cudaSuccess) {
    cudaGetLastError();  // a refused query must not surface as the next launch's error
    return error(Code::kCudaError, std::string(kSample) + ", " + what + ": " +
                                       cudaGetErrorString(e));
  }
  if (it->second > 0) return {};
  return error(Code::kUnsupportedArch,
               "this device cannot co-schedule " + what + " with " +
                   std::to_string(config.dynamicSmemBytes) +
                   " B of dynamic shared memory each (cudaOccupancyMaxActiveClusters = 0); "
                   "v4_fused_cluster's 8 is portable");
}

template <bool kBf16, bool kBulk>
Status launch(const SampleArgs& a, int ranks, int64_t slice, int bytes, cudaStream_t stream) {
  auto kernel = fused_cluster_kernel<kBf16, kBulk>;
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSliceBytes);
  if (opt_in != cudaSuccess) return error(Code::kCudaError, cudaGetErrorString(opt_in));
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim = {unsigned(ranks), 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(a.b * ranks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = size_t(bytes);
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  if (ranks > kPortableRanks) {
    const Status fits = large_cluster_fits(reinterpret_cast<const void*>(kernel), config, ranks);
    if (!fits.ok()) return fits;
  }
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, a, slice);
  if (e != cudaSuccess)
    return error(Code::kCudaError, std::string(kSample) + ": " + cudaGetErrorString(e));
  return last_launch_status(kSample);
}

// kRanks: the cluster's CTAs (a knob: more spread a row over more SMs, at the price of more
// distributed-shared-memory traffic per barrier; a slice must fit kMaxSliceBytes; above 8 the
// device may refuse, large_cluster_fits).
template <int kRanks>
Status sample_v4(const SampleArgs& a, cudaStream_t stream) {
  Status s = validate_sample(a);
  // A slice of whole 16-byte units, so that every slice of an aligned row starts aligned.
  const int64_t slice = ((a.v + kRanks - 1) / kRanks + 3) & ~int64_t(3);
  if (s.ok())
    s = Check()
            .that(4 * slice <= kMaxSliceBytes, "V must be at most " +
                                                   std::to_string(kRanks * kMaxSliceBytes / 4) +
                                                   " (a cluster's shared memory holds the row)")
            .that(a.b * kRanks <= std::numeric_limits<int32_t>::max(), "B is too large")
            .arch_at_least(90)
            .status();
  if (!s.ok()) return s;
  const int bytes = int(4 * slice);
  const bool bulk = !a.bf16 && a.v % 4 == 0 && reinterpret_cast<uintptr_t>(a.logits) % 16 == 0;
  if (a.bf16) return launch<true, false>(a, kRanks, slice, bytes, stream);
  return bulk ? launch<false, true>(a, kRanks, slice, bytes, stream)
              : launch<false, false>(a, kRanks, slice, bytes, stream);
}

Version v4() {
  Version v = sample_version(
      "v4_fused_cluster",
      "a cluster per row holds it in shared memory: read once, exact thresholds",
      sample_v4<kPortableRanks>,
      {{"fused_cluster_kernelILb0ELb1E", {"sm_90a"}, {"UBLKCP", "MATCH.ANY"}, {"ATOMS.CAST"}, true,
        "the slice by one bulk copy, warp-aggregated histograms, nothing spilled"}});
  v.min_arch = 90;
  return v;
}
const Register kV4{v4()};
// The ablations: the cluster size (benched, tested, never graded). 16 is non-portable.
Version cluster(const char* id, const char* summary, SampleLaunch launch) {
  Version v = sample_version(id, summary, launch, {}, Kind::kAblation);
  v.min_arch = 90;
  return v;
}
const Register kCluster4{cluster("ablation_v4_cluster4", "v4 with a cluster of 4 CTAs a row",
                                 sample_v4<4>)};
const Register kCluster16{cluster("ablation_v4_cluster16",
                                  "v4 with a cluster of 16 CTAs a row (non-portable)",
                                  sample_v4<16>)};

}  // namespace
}  // namespace lkw::sampling
