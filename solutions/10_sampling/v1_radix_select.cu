// v1_radix_select — the k-th largest value by counting, not sorting: a block per row, four passes.
//
// Since v0: no sorted copy. The k-th largest key is built one 8-bit digit at a time, most
// significant first (sampling.radix_select is the same algorithm in numpy). A pass histograms
// the digit of the candidates — the keys whose higher digits equal the prefix chosen so far — in
// 256 shared-memory counters, then warp 0 scans the counters from the top: the digit whose bucket
// holds the remaining rank is the next digit of the answer, and the counts above it are taken
// off the rank. After four passes the prefix IS the k-th key (order_key maps FP32 to uint32 with
// the same order). Every pass reads the row (the L2 holds it between passes at small B), nothing
// is written until the output stage, and no pass needs more than 256 counters.
// Expect: 5 reads of the row instead of CUB's many passes of reads and writes; at B = 256 the rows
// no longer fit the L2 and the four histogram passes go to DRAM. A block per row leaves most SMs
// idle at B = 1. SASS: ATOMS (shared-memory atomics), SHFL.
#include "sampling.cuh"

namespace lkw::sampling {
namespace {

constexpr int kThreads = 512;  // every filter version: write_row's block sum, so the same bits
constexpr int kDigitBits = 8, kBuckets = 1 << kDigitBits;

// Stage (warp 0): the digit d whose bucket holds rank `rank` counting from the top — the largest
// d with count(buckets >= d) >= rank — and the rank within that bucket. Lane l sums buckets
// 255 − 8l down to 248 − 8l; a scan over the lanes gives each lane the count above its buckets.
__device__ __forceinline__ void choose_digit(const uint32_t* hist_sh, uint32_t rank, int lane,
                                             uint32_t* digit_sh, uint32_t* rank_sh) {
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) mine += hist_sh[kBuckets - 1 - 8 * lane - j];
  uint32_t above = mine;  // inclusive scan over lanes 0..lane (the top buckets first)
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t other = __shfl_up_sync(0xffffffffu, above, offset);
    if (lane >= offset) above += other;
  }
  above -= mine;  // the count in the buckets above this lane's eight
  // BEGIN SOLUTION: v1 — the lane whose eight buckets reach the rank walks them from the top
  if (above < rank && rank <= above + mine) {
    for (int j = 0; j < 8; ++j) {
      const int d = kBuckets - 1 - 8 * lane - j;
      if (above + hist_sh[d] >= rank) {
        *digit_sh = uint32_t(d);
        *rank_sh = rank - above;
        break;
      }
      above += hist_sh[d];
    }
  }
  // END SOLUTION
}

template <bool kRenorm>
__global__ void __launch_bounds__(kThreads)
    radix_select_kernel(const float* __restrict__ x, const int32_t* __restrict__ top_k,
                        float* __restrict__ out, int64_t v) {
  __shared__ uint32_t hist_sh[kBuckets];
  __shared__ uint32_t digit_sh, rank_sh;
  const int64_t row = blockIdx.x;
  const float* x_row = x + row * v;  // (B, V)
  const int32_t k = top_k[row];      // (B)
  float threshold = -INFINITY;
  if (top_k_on(k, v)) {
    uint32_t prefix = 0, prefix_mask = 0, rank = uint32_t(k);
    for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
      // Stage: count the candidates' digits.
      for (int i = threadIdx.x; i < kBuckets; i += blockDim.x) hist_sh[i] = 0;
      __syncthreads();
      // BEGIN SOLUTION: v1 — every key with the prefix adds one to its digit's bucket
      for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
        const uint32_t key = order_key(x_row[i]);
        if ((key & prefix_mask) == prefix) atomicAdd(&hist_sh[(key >> shift) & (kBuckets - 1)], 1u);
      }
      // END SOLUTION
      __syncthreads();
      // Stage: warp 0 picks the digit, every thread extends the prefix.
      if (threadIdx.x < 32) choose_digit(hist_sh, rank, threadIdx.x, &digit_sh, &rank_sh);
      __syncthreads();
      prefix |= digit_sh << shift;
      prefix_mask |= uint32_t(kBuckets - 1) << shift;
      rank = rank_sh;
      __syncthreads();  // digit_sh and rank_sh are rewritten by the next pass
    }
    threshold = key_value(prefix);
  }
  // Stage: the filtered row.
  write_row<kRenorm>(x_row, out + row * v, v, threshold);
}

template <const FilterOp& kOp>
Status top_k_v1(const TopKArgs& a, cudaStream_t stream) {
  Status s = validate_top_k(a);
  if (!s.ok()) return s;
  radix_select_kernel<kOp.renorm><<<unsigned(a.b), kThreads, 0, stream>>>(a.x, a.top_k, a.out, a.v);
  return last_launch_status(kOp.name);
}

constexpr const char* kSummary = "a block per row: the k-th key by four 256-bin digit histograms";
std::vector<SassFact> facts(const char* kernel) {
  return {{kernel, {}, {"ATOMS", "SHFL.UP"}, {}, true,
           "shared-memory histograms and a warp scan, nothing spilled"}};
}
const Register kMask{top_k_version(kTopKMask, "v1_radix_select", kSummary, top_k_v1<kTopKMask>,
                                   facts("radix_select_kernelILb0E"))};
const Register kRenorm{top_k_version(kTopKRenorm, "v1_radix_select", kSummary,
                                     top_k_v1<kTopKRenorm>, facts("radix_select_kernelILb1E"))};

}  // namespace
}  // namespace lkw::sampling
