// Chapter 10 — sampling: the last kernels of a decode step, from logits to the next token.
//
// ops (reference/lkw/sampling.py is the contract; its docstring defines every filter and rounding):
//   top_k_mask_logits    logits [B, V] FP32, top_k [B] int32 → logits with every token outside its
//                        row's top k set to −inf (bit-exact; a kept −0.0 is written +0.0, as the
//                        contract reads it)
//   top_k_renorm_probs   probs [B, V] FP32, top_k [B] → the kept probs renormalized to sum 1
//                        (within 2^-14 relative; dropped tokens exactly 0)
// A token is kept iff fewer than k keys of its row are greater than its own: every token equal to
// the k-th largest value is kept, so a tie may keep more than k. k <= 0 or k >= V keeps the row.
//
// Bytes: the row read once and written once, 8 B per element (the per-row k aside). The obvious
// way finds the k-th value by sorting every row; this chapter's lesson is that a threshold is
// enough, and a threshold can be found by counting.
//
// versions: v0_sort_cub (CUB's segmented radix sort of every row, the k-th of the sorted row) →
// v1_radix_select (a block per row finds the k-th key by four 256-bin histograms of 8-bit digits:
// selection, no sort). Later: top-p by a threshold search, rejection sampling with pivots, a fused
// sampler, speculative decoding's rejection sampling.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include "04_rmsnorm/rmsnorm.cuh"
#include "lkw/registry.h"

namespace lkw::sampling {

constexpr const char* kChapter = "10_sampling";

struct FilterOp {
  const char* name;
  bool renorm;  // probs in, renormalized probs out; else logits in, masked logits out
};
constexpr FilterOp kTopKMask{"top_k_mask_logits", false};
constexpr FilterOp kTopKRenorm{"top_k_renorm_probs", true};

struct TopKArgs {
  const float* x;        // logits or probs [B, V]
  const int32_t* top_k;  // [B]
  float* out;            // [B, V]
  int64_t b, v;
};

using TopKLaunch = Status (*)(const TopKArgs& a, cudaStream_t stream);

inline Status validate_top_k(const TopKArgs& a) {
  const int64_t n = a.b * a.v;
  Status s = Check()
                 .not_null(a.x, "x")
                 .not_null(a.top_k, "top_k")
                 .not_null(a.out, "out")
                 .positive(a.b, "B")
                 .positive(a.v, "V")
                 .that(a.b <= std::numeric_limits<int32_t>::max(), "B must be below 2^31")
                 .that(a.v <= std::numeric_limits<int32_t>::max(), "V must be below 2^31")
                 .aligned(a.x, 4, "x")
                 .aligned(a.top_k, 4, "top_k")
                 .aligned(a.out, 4, "out")
                 .status();
  if (!s.ok()) return s;
  return Check()
      .disjoint(a.out, 4 * n, a.x, 4 * n, "out and x")
      .disjoint(a.out, 4 * n, a.top_k, 4 * a.b, "out and top_k")
      .arch_at_least(80)
      .status();
}

inline Status top_k_args(const FilterOp& op, const Args& a, TopKArgs* out) {
  Status s = Check()
                 .that(a.inputs.size() == 2 && a.outputs.size() == 1,
                       std::string(op.name) + " takes 2 inputs and 1 output")
                 .status();
  if (!s.ok()) return s;
  const TensorRef& x = a.inputs[0];
  const TensorRef& k = a.inputs[1];
  const TensorRef& y = a.outputs[0];
  s = Check()
          .that(x.dtype == DType::kF32 && x.shape.size() == 2,
                std::string(op.renorm ? "probs" : "logits") + " are float32 [B, V]")
          .that(k.dtype == DType::kI32 && k.shape.size() == 1, "top_k is int32 [B]")
          .that(y.dtype == DType::kF32 && y.shape == x.shape, "the output is float32 [B, V]")
          .that(k.shape.size() != 1 || x.shape.size() != 2 || k.dim(0) == x.dim(0),
                "top_k must have B entries")
          .status();
  if (!s.ok()) return s;
  *out = TopKArgs{static_cast<const float*>(x.data), static_cast<const int32_t*>(k.data),
                  static_cast<float*>(y.data), x.dim(0), x.dim(1)};
  return {};
}

inline Version top_k_version(const FilterOp& op, const char* id, const char* summary,
                             TopKLaunch launch, std::vector<SassFact> sass = {},
                             Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    TopKArgs ta;
    Status s = top_k_args(op, a, &ta);
    return s.ok() ? launch(ta, stream) : s;
  };
  v.bytes = io_bytes;
  // A compare per element, and the renormalization's sum and division.
  v.flops = [op](const Args& a) { return (op.renorm ? 3.0 : 1.0) * double(a.inputs[0].numel()); };
  return v;
}

// ---------------------------------------------------------------------------------------------
// Keys: FP32 → uint32 with the same order (a < b iff key(a) < key(b)), −0.0 read as +0.0: a
// non-negative float gets its sign bit set, a negative one has every bit inverted. A radix
// select works on these bits, most significant digit first.
__host__ __device__ __forceinline__ uint32_t order_key(float x) {
#ifdef __CUDA_ARCH__
  const uint32_t bits = __float_as_uint(x + 0.0f);  // −0 + 0 = +0 under round to nearest
#else
  const float plus = x + 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &plus, 4);
#endif
  return bits >> 31 ? ~bits : bits | 0x80000000u;
}

__host__ __device__ __forceinline__ float key_value(uint32_t key) {
  const uint32_t bits = key >> 31 ? key & 0x7fffffffu : ~key;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// Row b's filter is on iff 0 < k < V.
__device__ __forceinline__ bool top_k_on(int32_t k, int64_t v) { return k > 0 && k < v; }

// The output stage of every version: given the row's threshold (the k-th largest value, or −inf
// when the filter is off), keep x >= threshold. Masked logits: kept x (+0.0 for −0.0), else −inf.
// Renormalized probs: the block's FP32 sum of the kept probs, then x / sum, else 0. Every thread of
// the block calls it (the renorm's sum is a block reduction).
template <bool kRenorm>
__device__ __forceinline__ void write_row(const float* __restrict__ x, float* __restrict__ out,
                                          int64_t v, float threshold) {
  if constexpr (kRenorm) {
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
      const float p = x[i];
      if (p >= threshold) sum = __fadd_rn(sum, p);
    }
    sum = rmsnorm::block_reduce<rmsnorm::Add>(sum);
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
      const float p = x[i];
      out[i] = p >= threshold ? __fdiv_rn(p, sum) : 0.0f;
    }
  } else {
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
      const float z = x[i];
      out[i] = z >= threshold ? z + 0.0f : -INFINITY;
    }
  }
}

}  // namespace lkw::sampling
