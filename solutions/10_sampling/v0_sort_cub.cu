// v0_sort_cub — the obvious answer: sort every row, read the thresholds off the sorted copy.
//
// CUB's segmented radix sort (a segment per row, descending, keys only: a threshold needs no
// index) writes a sorted copy of the rows to a workspace; a kernel, a block per row, reads the
// thresholds there and writes the output. Top-k: the k-th sorted value. Top-p: the first sorted
// position whose running mass (select.cuh's block scan, chunk by chunk) reaches p·M. `sample`
// sorts z = x / T (a first kernel writes it and the greedy token), then top-k's cut, top-p within
// it on the sorted masses exp(z − max z), min-p; the draw renormalizes by searching u_0 times the
// kept total in the kept masses' prefix sum in INDEX order, so a u gives the token it gives every
// version and lkw.sampling.sample. How engines began: correct, simple, and paying for an order
// nothing reads, as each radix pass reads and writes all the data before the last kernel reads it.
// Expect: many times the model's bytes (CUB's passes), far from the copy ceiling at every shape;
// slowest at B = 1, where one segment is one block of the sort.
#include <cub/device/device_segmented_radix_sort.cuh>

#include "lkw/workspace.h"
#include "select.cuh"

namespace lkw::sampling {
namespace {

constexpr int kThreads = 512;  // every filter version: write_row's block sum, so the same bits

__global__ void row_offsets_kernel(int* offsets, int b, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= b) offsets[i] = i * v;  // row i starts at i·V; offsets[B] ends the last row
}

template <bool kRenorm>
__global__ void __launch_bounds__(kThreads)
    filter_sorted_kernel(const float* __restrict__ x, const float* __restrict__ sorted,
                         const int32_t* __restrict__ top_k, float* __restrict__ out, int64_t v) {
  const int64_t row = blockIdx.x;
  const int32_t k = top_k[row];  // (B)
  // BEGIN SOLUTION: v0 — the k-th largest of the sorted row (descending), or −inf when off
  const float threshold = top_k_on(k, v) ? sorted[row * v + k - 1] : -INFINITY;  // (B, V)
  // STUB: const float threshold = -INFINITY;
  // END SOLUTION
  write_row<kRenorm>(x + row * v, out + row * v, v, threshold);
}

// Top-p from the sorted row: M its FP32 total, the threshold the value at the first position j
// whose inclusive prefix reaches p·M (every position before j has a smaller prefix: kept; the
// tie group of position j is kept whole by write_row's x >= threshold).
__global__ void __launch_bounds__(kThreads)
    top_p_sorted_kernel(const float* __restrict__ x, const float* __restrict__ sorted,
                        const float* __restrict__ top_p, float* __restrict__ out, int64_t v) {
  using Search = PrefixSearch<kThreads, 16>;
  __shared__ typename Search::Shared sh;
  const int64_t row = blockIdx.x;
  const float* s_row = sorted + row * v;  // (B, V) descending
  const float p = top_p[row];             // (B); NaN is not < 1: off
  float threshold = -INFINITY;
  if (p < 1.0f) {
    auto w = [s_row](int64_t i) { return s_row[i]; };
    const float total = Search::totals(sh, v, w);
    // BEGIN SOLUTION: v0 — the first sorted position whose prefix reaches p·M holds the threshold
    const int64_t j = Search::search<false>(sh, v, __fmul_rn(p, total), w);
    threshold = s_row[j < 0 ? 0 : j];
    // END SOLUTION
  }
  write_row<true>(x + row * v, out + row * v, v, threshold);
}

// sample, stage 1 (a block per row): z = x / T into the workspace, the keys the sort orders and
// the filters compare (x itself where T is not positive: greedy), and the greedy token, the lowest
// index of the largest logit, written for every row: the draw replaces it where T > 0.
__global__ void __launch_bounds__(kThreads) scale_rows_kernel(SampleArgs a, float* __restrict__ z) {
  __shared__ typename cub::BlockReduce<ArgMax, kThreads>::TempStorage argmax_sh;
  const int64_t row = blockIdx.x, v = a.v;
  const float t = a.temperature[row];  // (B); NaN is not > 0: greedy
  const bool scaled = t > 0.0f;
  ArgMax best{-INFINITY, -1};
  for (int64_t i = threadIdx.x; i < v; i += kThreads) {
    const float xi = logit_at(a.logits, a.bf16, row * v + i);  // (B, V)
    z[row * v + i] = scaled ? __fdiv_rn(xi, t) : xi;            // (B, V)
    if (best.i < 0 || xi > best.x) best = {xi, i};
  }
  best = cub::BlockReduce<ArgMax, kThreads>(argmax_sh).Reduce(best, ArgMaxOp{});
  if (threadIdx.x == 0) a.tokens[row] = int32_t(best.i);
}

// sample, stage 2 (a block per row, after the sort): the thresholds from the sorted row, then the
// draw over the row in index order. The sorted row's first key is max z: fp32(x / T) is monotone
// in x for T > 0, so it is the greedy kernel's largest logit divided by T, bit for bit.
__global__ void __launch_bounds__(kThreads)
    sample_sorted_kernel(SampleArgs a, const float* __restrict__ z,
                         const float* __restrict__ sorted) {
  using Search = PrefixSearch<kThreads, 16>;
  __shared__ typename Search::Shared sh;
  const int64_t row = blockIdx.x, v = a.v;
  const float* z_row = z + row * v;       // (B, V) index order
  const float* s_row = sorted + row * v;  // (B, V) descending
  const float t = a.temperature[row], zmax = s_row[0];  // (B)
  if (!(t > 0.0f) || !isfinite(zmax)) return;  // greedy (or x / T overflowed): stage 1's token
  const int32_t k = a.top_k[row];
  const float p = a.top_p[row], min_p = a.min_p[row];
  auto mass = [zmax](float zi) { return expf(__fsub_rn(zi, zmax)); };
  // Stage: the threshold tau, every filter but min-p, read off the sorted row.
  // BEGIN SOLUTION: v0 — top-k's cut (the k-th sorted key, or −inf when off), then top-p within
  //   it: the first sorted position whose running mass of the kept keys reaches p·M(K)
  float tau = top_k_on(k, v) ? s_row[k - 1] : -INFINITY;
  if (p < 1.0f) {  // NaN is not < 1: off
    auto w = [s_row, tau, mass](int64_t i) {
      const float si = s_row[i];
      return si >= tau ? mass(si) : 0.0f;
    };
    const float kept = Search::totals(sh, v, w);  // M(K): top-p is judged on what top-k kept
    const int64_t j = Search::search<false>(sh, v, __fmul_rn(p, kept), w);
    tau = fmaxf(tau, s_row[j < 0 ? 0 : j]);
  }
  // STUB: const float tau = -INFINITY;
  // END SOLUTION
  // Stage: the draw, in index order: the kept masses (min-p: at least min_p of the top's 1), their
  // total, and the first index whose running sum passes u_0 · total (the renormalization).
  const bool n_on = min_p > 0.0f;
  auto w = [z_row, tau, n_on, min_p, mass](int64_t i) {
    const float zi = z_row[i];
    const float m = zi >= tau ? mass(zi) : 0.0f;
    return n_on && m < min_p ? 0.0f : m;
  };
  const float total = Search::totals(sh, v, w);
  RowStream stream(a.seed_offset, row);
  const int64_t j = Search::search<true>(sh, v, __fmul_rn(stream.uniform(), total), w);
  if (threadIdx.x == 0 && j >= 0) a.tokens[row] = int32_t(j);  // none kept (min_p > 1): greedy
}

Status cub_status(cudaError_t e) {
  if (e == cudaSuccess) return {};
  return error(Code::kCudaError, std::string("CUB: ") + cudaGetErrorString(e));
}

// CUB's segmented sort counts items in int.
Status sort_fits(int64_t b, int64_t v) {
  return Check()
      .that(b * v <= std::numeric_limits<int32_t>::max(),
            "B · V must be below 2^31 (CUB's segmented sort counts items in int)")
      .status();
}

// The workspace and CUB's sort, shared by every op: the sorted rows, descending.
Status sort_rows(const float* x, int64_t b64, int64_t v64, cudaStream_t stream,
                 float** sorted_out) {
  Status s = sort_fits(b64, v64);
  if (!s.ok()) return s;
  const int b = int(b64), v = int(v64), n = b * v;
  // The workspace: the sorted rows, the B + 1 row offsets, then CUB's own temporary storage.
  size_t cub_bytes = 0;
  cudaError_t e = cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, cub_bytes, x, static_cast<float*>(nullptr), n, b, static_cast<int*>(nullptr),
      static_cast<int*>(nullptr) + 1, 0, 32, stream);
  if (e != cudaSuccess) return cub_status(e);
  const int64_t sorted_bytes = 4 * int64_t(n);
  const int64_t offsets_bytes = (4 * int64_t(b + 1) + 255) / 256 * 256;
  static Workspace workspace("v0_sort_cub sorted rows");
  void* base = nullptr;
  s = workspace.get(sorted_bytes + offsets_bytes + int64_t(cub_bytes), &base);
  if (!s.ok()) return s;
  auto* sorted = static_cast<float*>(base);
  auto* offsets = reinterpret_cast<int*>(static_cast<char*>(base) + sorted_bytes);
  void* cub_temp = static_cast<char*>(base) + sorted_bytes + offsets_bytes;
  row_offsets_kernel<<<(b + 1 + 255) / 256, 256, 0, stream>>>(offsets, b, v);
  e = cub::DeviceSegmentedRadixSort::SortKeysDescending(cub_temp, cub_bytes, x, sorted, n, b,
                                                        offsets, offsets + 1, 0, 32, stream);
  if (e != cudaSuccess) return cub_status(e);
  *sorted_out = sorted;
  return {};
}

template <const FilterOp& kOp>
Status top_k_v0(const TopKArgs& a, cudaStream_t stream) {
  Status s = validate_top_k(a);
  float* sorted = nullptr;
  if (s.ok()) s = sort_rows(a.x, a.b, a.v, stream, &sorted);
  if (!s.ok()) return s;
  filter_sorted_kernel<kOp.renorm>
      <<<unsigned(a.b), kThreads, 0, stream>>>(a.x, sorted, a.top_k, a.out, a.v);
  return last_launch_status(kOp.name);
}

Status top_p_v0(const TopPArgs& a, cudaStream_t stream) {
  Status s = validate_top_p(a);
  if (s.ok())
    s = Check().that(a.v <= kMaxV, "V must be at most 2^19 (the search's chunk table)").status();
  float* sorted = nullptr;
  if (s.ok()) s = sort_rows(a.x, a.b, a.v, stream, &sorted);
  if (!s.ok()) return s;
  top_p_sorted_kernel<<<unsigned(a.b), kThreads, 0, stream>>>(a.x, sorted, a.top_p, a.out, a.v);
  return last_launch_status(kTopPRenorm.name);
}

// sample: stage 1, CUB's sort of z, stage 2. z lives in a workspace of its own (the sort's is
// shared with the filters and sized by sort_rows).
Status sample_v0(const SampleArgs& a, cudaStream_t stream) {
  static Workspace scaled("v0_sort_cub scaled logits");
  Status s = validate_sample(a);
  if (s.ok()) s = sort_fits(a.b, a.v);  // before stage 1 writes anything
  void* z = nullptr;
  if (s.ok()) s = scaled.get(4 * a.b * a.v, &z);
  if (!s.ok()) return s;
  scale_rows_kernel<<<unsigned(a.b), kThreads, 0, stream>>>(a, static_cast<float*>(z));
  s = last_launch_status(kSample);
  float* sorted = nullptr;
  if (s.ok()) s = sort_rows(static_cast<const float*>(z), a.b, a.v, stream, &sorted);
  if (!s.ok()) return s;
  sample_sorted_kernel<<<unsigned(a.b), kThreads, 0, stream>>>(a, static_cast<float*>(z), sorted);
  return last_launch_status(kSample);
}

constexpr const char* kSummary = "CUB segmented radix sort of every row, thresholds read off it";
std::vector<SassFact> facts(const char* kernel, const char* pass = "the filter pass") {
  return {{kernel, {}, {}, {}, true, std::string(pass) + ": nothing spilled"}};
}
Version v0(Version v) {
  v.kernels_per_launch = 0;  // CUB picks its own kernels per shape: the ncu pass cannot map them
  return v;
}
const Register kMask{v0(top_k_version(kTopKMask, "v0_sort_cub", kSummary, top_k_v0<kTopKMask>,
                                      facts("filter_sorted_kernelILb0E")))};
const Register kRenorm{v0(top_k_version(kTopKRenorm, "v0_sort_cub", kSummary, top_k_v0<kTopKRenorm>,
                                        facts("filter_sorted_kernelILb1E")))};
const Register kTopP{v0(top_p_version("v0_sort_cub", kSummary, top_p_v0,
                                      facts("top_p_sorted_kernel")))};
const Register kSampleV0{v0(sample_version("v0_sort_cub", kSummary, sample_v0,
                                           facts("sample_sorted_kernel", "the sampling pass")))};

}  // namespace
}  // namespace lkw::sampling
