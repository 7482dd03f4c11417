// Chapter 10's device building blocks, shared by the versions: the radix select (histograms of
// 8-bit digits of an order-preserving key, warp-aggregated), the search of a prefix sum in index
// order (the inverse CDF, and the top-p boundary of a sorted row), the greedy argmax, and the
// Philox stream of a row. A version file reads as its stages; these are the stages' tools.
//
// Determinism: every sum here has one fixed association (a thread's run, then cub's block tree),
// and the radix histograms of mass are integers (a fixed-point image of the mass, whose sum does
// not depend on the order of the atomics). So a launch repeated with the same inputs and the same
// seed writes the same bits: a sampled run can be replayed.
#pragma once
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/functional>
#include <curand_kernel.h>

#include <cstdint>

#include "sampling.cuh"

namespace lkw::sampling {

// ---------------------------------------------------------------------------------------------
// Radix select: the largest key t of a row with W(key >= t) >= target, one 8-bit digit a pass.

constexpr int kDigitBits = 8, kBuckets = 1 << kDigitBits;
constexpr uint32_t kNoBucket = kBuckets;  // a lane with nothing to add

// Mass as an integer: fixed(m) = rint(m · 2^kFixedBits / 2^e) for a row whose masses are below
// 2^e, so every token's image is at most 2^kFixedBits and a row of 2^17 tokens sums below 2^58.
// The rounding costs at most 2^-41 of the row's largest mass a token: for V = 2^18 tokens, under
// 2^-23 of the row's mass, far inside the 2^-16 margin the contract allows a kernel's sums.
constexpr int kFixedBits = 40;

// Every lane of the warp calls it, converged (the loops round their trip counts up to whole
// warps). Lanes that hold the same bucket add as one: __match_any_sync groups them, the group's
// weights are summed by __reduce_add_sync in two 20-bit halves (a 32-lane sum of either half fits
// 32 bits), and its lowest lane adds the sum to the WARP's own histogram with a plain
// read-modify-write: a bucket has one such lane per warp and step, and no other warp writes there.
// Shared atomics would be the obvious tool, but a 64-bit shared atomic add is a compare-and-swap
// loop on this hardware (ATOMS.CAST.SPIN.64), and a row's first digit sends nearly every token to
// two or three buckets: the loops of sixteen warps spinning on one address serialize the pass.
// The grouping is the expensive part, so it runs only where it adds something: after pass 0 few
// keys are still candidates, and a warp with none skips it on one vote; a warp whose weights are
// all 1 (top-k's counts) counts its group instead of summing it.
__device__ __forceinline__ void histogram_add(unsigned long long* warp_hist_sh, uint32_t bucket,
                                              uint64_t weight) {
  if (__ballot_sync(0xffffffffu, bucket != kNoBucket) == 0) return;  // no candidate in the warp
  const uint32_t peers = __match_any_sync(0xffffffffu, bucket);
  const bool leader = (threadIdx.x % 32) == __ffs(peers) - 1;
  unsigned long long sum;
  if (__all_sync(0xffffffffu, weight <= 1)) {  // counts: a candidate's weight is 1
    sum = __popc(peers);
  } else {
    const uint32_t lo = __reduce_add_sync(peers, uint32_t(weight) & 0xfffffu);
    const uint32_t hi = __reduce_add_sync(peers, uint32_t(weight >> 20));
    sum = (static_cast<unsigned long long>(hi) << 20) + lo;
  }
  if (leader && bucket != kNoBucket) warp_hist_sh[bucket] += sum;
}

constexpr int kMaxWarps = 16;  // radix_select's blocks have at most 512 threads

struct RadixShared {
  unsigned long long warp_hist[kMaxWarps][kBuckets];  // each warp's own counts, then summed
  unsigned long long hist[kBuckets];
  unsigned long long rank;   // the weight still to find inside the chosen bucket
  unsigned long long total;  // the weight of the whole row (pass 0's histogram)
  uint32_t digit;
};

// Stage (warp 0): the digit d whose bucket holds rank `rank` counting from the top — the largest
// d with hist[>= d] >= rank — and the rank left inside that bucket. Lane l sums buckets 255 − 8l
// down to 248 − 8l; a scan over the lanes gives each lane the weight above its buckets.
__device__ __forceinline__ void choose_digit(RadixShared& sh, unsigned long long rank, int lane) {
  unsigned long long mine = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) mine += sh.hist[kBuckets - 1 - 8 * lane - j];
  unsigned long long above = mine;  // inclusive scan over lanes 0..lane (the top buckets first)
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(0xffffffffu, above, offset);
    if (lane >= offset) above += other;
  }
  above -= mine;
  if (above < rank && rank <= above + mine) {
    for (int j = 0; j < 8; ++j) {
      const int d = kBuckets - 1 - 8 * lane - j;
      if (above + sh.hist[d] >= rank) {
        sh.digit = uint32_t(d);
        sh.rank = rank - above;
        break;
      }
      above += sh.hist[d];
    }
  }
}

// A block that holds the whole row has nothing to merge.
struct NoMerge {
  __device__ void operator()(RadixShared&, int) const {}
};

// The largest key t with W(key >= t) >= target(total), where key(i) is an order_key and weight(i)
// an integer below 2^kFixedBits (1 for top-k, the fixed mass for top-p), total the whole row's
// weight. Four passes over the row; every thread of the block calls it and gets t. The target
// must lie in 1..total (callers clamp it); a row of total weight 0 returns −inf's key (keeps all).
// merge(sh, pass) runs once the block's histogram is complete: a cluster that splits the row
// among its blocks adds the others' histograms there (v4), so every block sees the row's.
template <class KeyFn, class WeightFn, class TargetFn, class Merge = NoMerge>
__device__ uint32_t radix_select(RadixShared& sh, int64_t v, KeyFn key, WeightFn weight,
                                 TargetFn target, Merge merge = {}) {
  uint32_t prefix = 0, prefix_mask = 0;
  unsigned long long rank = 0;
  const int64_t trips = (v + blockDim.x - 1) / blockDim.x * blockDim.x;  // whole warps
  const int warps = blockDim.x / 32;
  unsigned long long* mine = sh.warp_hist[threadIdx.x / 32];
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    // Stage: histogram the digit of the candidates (keys whose higher digits are the prefix).
    for (int i = threadIdx.x; i < warps * kBuckets; i += blockDim.x) sh.warp_hist[i / kBuckets][i % kBuckets] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < trips; i += blockDim.x) {
      uint32_t bucket = kNoBucket;
      uint64_t w = 0;
      if (i < v) {
        const uint32_t k = key(i);
        if ((k & prefix_mask) == prefix) {
          w = weight(i);
          if (w != 0) bucket = (k >> shift) & (kBuckets - 1);  // a weightless key adds nothing
        }
      }
      histogram_add(mine, bucket, w);
    }
    __syncthreads();
    // Stage: the warps' histograms summed, warp by warp (integers: any order gives the same).
    for (int d = threadIdx.x; d < kBuckets; d += blockDim.x) {
      unsigned long long sum = 0;
      for (int w = 0; w < warps; ++w) sum += sh.warp_hist[w][d];
      sh.hist[d] = sum;
    }
    __syncthreads();
    merge(sh, (32 - kDigitBits - shift) / kDigitBits);
    // Stage (warp 0): the row's total and the target after pass 0, then the digit.
    if (threadIdx.x < 32) {
      if (shift == 32 - kDigitBits) {
        unsigned long long t = 0;
        for (int d = threadIdx.x; d < kBuckets; d += 32) t += sh.hist[d];
        for (int offset = 16; offset > 0; offset >>= 1) t += __shfl_xor_sync(0xffffffffu, t, offset);
        rank = t == 0 ? 0 : target(t);
        if (threadIdx.x == 0) sh.total = t;
      } else {
        rank = sh.rank;
      }
      __syncwarp();  // every lane has read sh.rank before choose_digit's lane rewrites it
      if (rank == 0) {
        if (threadIdx.x == 0) sh.digit = 0, sh.rank = 0;  // nothing to select: key 0 keeps all
      } else {
        choose_digit(sh, rank, threadIdx.x);
      }
    }
    __syncthreads();
    prefix |= sh.digit << shift;
    prefix_mask |= uint32_t(kBuckets - 1) << shift;
    __syncthreads();  // sh.digit is rewritten by the next pass
  }
  return sh.total == 0 ? order_key(-INFINITY) : prefix;
}

// ---------------------------------------------------------------------------------------------
// The search of a prefix sum in index order: the first i with C_i > t (kStrict: the inverse CDF)
// or C_i >= t (the top-p boundary of a sorted row), C the inclusive FP32 prefix sum of w(i). One
// association throughout: a thread sums kItems consecutive weights left to right, cub's BlockScan
// sums the threads of a chunk of kThreads·kItems, the chunks are added left to right.

constexpr int kMaxChunks = 64;  // the chunk totals kept in shared memory: V <= 64 · kThreads · kItems

template <int kThreads, int kItems>
struct PrefixSearch {
  static constexpr int kChunk = kThreads * kItems;
  using Scan = cub::BlockScan<float, kThreads>;
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  struct Shared {
    union {
      typename Scan::TempStorage scan;
      typename Reduce::TempStorage reduce;
    };
    float start[kMaxChunks + 1];  // start[c]: the sum before chunk c; start[chunks]: the total
    int64_t last;                 // the last index of positive weight (-1: none)
    int64_t found;                // the search's answer
  };

  // Stage: the chunk totals and the row's total (returned to every thread).
  template <class W>
  __device__ static float totals(Shared& sh, int64_t v, W w) {
    float running = 0.0f;
    int64_t last = -1;
    int c = 0;
    for (int64_t base = 0; base < v; base += kChunk, ++c) {
      float partial = 0.0f;
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int64_t i = base + int64_t(threadIdx.x) * kItems + k;
        if (i < v) {
          const float wi = w(i);
          partial = __fadd_rn(partial, wi);
          if (wi > 0.0f) last = i;
        }
      }
      float before, chunk;
      Scan(sh.scan).ExclusiveSum(partial, before, chunk);
      __syncthreads();
      if (threadIdx.x == 0) sh.start[c] = running;
      running = __fadd_rn(running, chunk);
    }
    last = Reduce(sh.reduce).Reduce(last, cuda::maximum<>{});  // valid in thread 0
    if (threadIdx.x == 0) sh.start[c] = running, sh.last = last;
    __syncthreads();
    return running;
  }

  // Stage: the search, scanning only the chunks where the running total may cross t (the
  // first whose end reaches t; the next ones only if rounding inside the chunk fell short).
  // Returns the index, or the last index of positive weight when no prefix reaches t. origin:
  // the sum before index 0 (a cluster's block holding a later slice of the row; 0 + c is c).
  template <bool kStrict, class W>
  __device__ static int64_t search(Shared& sh, int64_t v, float t, W w, float origin = 0.0f) {
    const int chunks = int((v + kChunk - 1) / kChunk);
    auto reaches = [t, origin](float c) {
      const float at = __fadd_rn(origin, c);
      return kStrict ? at > t : at >= t;
    };
    int c = 0;
    while (c < chunks && !reaches(sh.start[c + 1])) ++c;
    for (; c < chunks; ++c) {
      const int64_t base = int64_t(c) * kChunk;
      float wi[kItems], partial = 0.0f;
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int64_t i = base + int64_t(threadIdx.x) * kItems + k;
        wi[k] = i < v ? w(i) : 0.0f;
        partial = __fadd_rn(partial, wi[k]);
      }
      float before;
      Scan(sh.scan).ExclusiveSum(partial, before);
      __syncthreads();
      float run = __fadd_rn(sh.start[c], before);
      int64_t found = INT64_MAX;
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        run = __fadd_rn(run, wi[k]);
        const int64_t i = base + int64_t(threadIdx.x) * kItems + k;
        if (found == INT64_MAX && i < v && reaches(run) && (!kStrict || wi[k] > 0.0f)) found = i;
      }
      found = Reduce(sh.reduce).Reduce(found, cuda::minimum<>{});  // valid in thread 0
      if (threadIdx.x == 0) sh.found = found;
      __syncthreads();
      if (sh.found != INT64_MAX) break;
    }
    const int64_t index = c < chunks ? sh.found : sh.last;
    __syncthreads();  // sh is reused by the caller's next search
    return index;
  }
};

// ---------------------------------------------------------------------------------------------
// Greedy: a block's (or a cluster's) largest logit and its index, the lower index on a tie (the
// reference's argmax), reduced with ArgMaxOp (cub::BlockReduce, then across CTAs).
struct ArgMax {
  float x;
  int64_t i;  // -1: no element
};
struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    return (a.x > b.x || (a.x == b.x && a.i < b.i)) ? a : b;
  }
};

// ---------------------------------------------------------------------------------------------
// Randomness: row b's stream is curand's Philox4_32_10 at (seed, subsequence b, offset), read as
// raw 32-bit draws; a uniform in [0, 1) is the top 24 bits times 2^-24 (exact in FP32, never 1,
// so a search for C_i > u·total always ends inside the row). lkw.sampling.philox_uniforms draws
// the same numbers on the host.
struct RowStream {
  curandStatePhilox4_32_10_t state;
  __device__ RowStream(const int64_t* seed_offset, int64_t row) {
    curand_init(static_cast<unsigned long long>(seed_offset[0]), static_cast<unsigned long long>(row),
                static_cast<unsigned long long>(seed_offset[1]), &state);
  }
  __device__ float uniform() { return float(curand(&state) >> 8) * 0x1p-24f; }
};

}  // namespace lkw::sampling
