// Chapter 10 — sampling: the last kernels of a decode step, from logits to the next token.
//
// ops (reference/lkw/sampling.py is the contract; its docstring defines every filter and rounding):
//   top_k_mask_logits    logits [B, V] FP32, top_k [B] int32 → logits with every token outside its
//                        row's top k set to −inf (bit-exact; a kept −0.0 is written +0.0, as the
//                        contract reads it)
//   top_k_renorm_probs   probs [B, V] FP32, top_k [B] → the kept probs renormalized to sum 1
//                        (within 2^-14 relative; dropped tokens exactly 0)
//   top_p_renorm_probs   probs [B, V] FP32, top_p [B] FP32 → the same for top-p (p >= 1 or NaN
//                        keeps the row; p <= 0 keeps the top tie group)
//   sample               logits [B, V] FP32 or BF16, temperature, top_k, top_p, min_p [B],
//                        seed_offset int64 [2] → tokens [B] int32 (T = 0: greedy)
//   rejection_sample     speculative decoding: draft probs q [B, S, V], draft tokens [B, S],
//                        target probs p [B, S+1, V], seed_offset → tokens [B, S+1], accepted [B]
// A token is kept iff fewer than k keys of its row are greater than its own: every token equal to
// the k-th largest value is kept, so a tie may keep more than k. k <= 0 or k >= V keeps the row.
//
// Bytes: the filters read the row once and write it once, 8 B per element; the sampler reads it
// once, 4 B. The obvious way finds a threshold by sorting every row; this chapter's lesson is that
// a threshold can be found by counting, and a sample drawn without ever building the kept set.
//
// versions: v0_sort_cub (CUB's segmented radix sort of every row) → v1_radix_select (the k-th key
// by four 256-bin digit histograms) → v2_threshold_search (top-p: the same select over an integer
// image of the mass) → v3_pivot_rejection (sample, then test the sample against the filters,
// narrowing a pivot) → v4_fused_cluster (a cluster of CTAs holds the row in shared memory: read
// once, every filter and the draw on chip) → v5_speculative (rejection sampling of draft tokens).
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
constexpr FilterOp kTopPRenorm{"top_p_renorm_probs", true};

struct TopKArgs {
  const float* x;        // logits or probs [B, V]
  const int32_t* top_k;  // [B]
  float* out;            // [B, V]
  int64_t b, v;
};

using TopKLaunch = Status (*)(const TopKArgs& a, cudaStream_t stream);

// The checks of a filter's call: x [B, V] in, a 4-byte parameter per row (k or p), out [B, V].
inline Status validate_filter(const float* x, const void* param, const char* param_name,
                              const float* out, int64_t b, int64_t v) {
  const int64_t n = b * v;
  Status s = Check()
                 .not_null(x, "x")
                 .not_null(param, param_name)
                 .not_null(out, "out")
                 .positive(b, "B")
                 .positive(v, "V")
                 .that(b <= std::numeric_limits<int32_t>::max(), "B must be below 2^31")
                 .that(v <= std::numeric_limits<int32_t>::max(), "V must be below 2^31")
                 .aligned(x, 4, "x")
                 .aligned(param, 4, param_name)
                 .aligned(out, 4, "out")
                 .status();
  if (!s.ok()) return s;
  return Check()
      .disjoint(out, 4 * n, x, 4 * n, "out and x")
      .disjoint(out, 4 * n, param, 4 * b, (std::string("out and ") + param_name).c_str())
      .arch_at_least(80)
      .status();
}

inline Status validate_top_k(const TopKArgs& a) {
  return validate_filter(a.x, a.top_k, "top_k", a.out, a.b, a.v);
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

// top_p_renorm_probs: the same shape of call, a float p per row instead of an int k.
struct TopPArgs {
  const float* x;      // probs [B, V]
  const float* top_p;  // [B]
  float* out;          // [B, V]
  int64_t b, v;
};

using TopPLaunch = Status (*)(const TopPArgs& a, cudaStream_t stream);

inline Status validate_top_p(const TopPArgs& a) {
  return validate_filter(a.x, a.top_p, "top_p", a.out, a.b, a.v);
}

inline Version top_p_version(const char* id, const char* summary, TopPLaunch launch,
                             std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, kTopPRenorm.name, id, summary, kind, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    const bool two = a.inputs.size() == 2 && a.outputs.size() == 1;
    Status s = Check()
                   .that(two, "top_p_renorm_probs takes 2 inputs and 1 output")
                   .that(!two || (a.inputs[0].dtype == DType::kF32 && a.inputs[0].shape.size() == 2),
                         "probs are float32 [B, V]")
                   .that(!two || (a.inputs[1].dtype == DType::kF32 && a.inputs[1].shape.size() == 1),
                         "top_p is float32 [B]")
                   .that(!two || (a.outputs[0].dtype == DType::kF32 &&
                                  a.outputs[0].shape == a.inputs[0].shape),
                         "the output is float32 [B, V]")
                   .status();
    if (!s.ok()) return s;
    s = Check().that(a.inputs[1].dim(0) == a.inputs[0].dim(0), "top_p must have B entries").status();
    if (!s.ok()) return s;
    return launch(TopPArgs{static_cast<const float*>(a.inputs[0].data),
                           static_cast<const float*>(a.inputs[1].data),
                           static_cast<float*>(a.outputs[0].data), a.inputs[0].dim(0),
                           a.inputs[0].dim(1)},
                  stream);
  };
  v.bytes = io_bytes;
  v.flops = [](const Args& a) { return 3.0 * double(a.inputs[0].numel()); };
  return v;
}

// ---------------------------------------------------------------------------------------------
// sample: every filter per row, the randomness from seed_offset (device memory, so a CUDA graph
// replays with a new offset written before each launch). A row's stream: select.cuh RowStream.

constexpr const char* kSample = "sample";
constexpr int64_t kMaxV = int64_t(1) << 19;  // the prefix search keeps 64 chunk totals of 8192

struct SampleArgs {
  const void* logits;          // [B, V] FP32 or BF16
  bool bf16;
  const float* temperature;    // [B]: 0 = greedy
  const int32_t* top_k;        // [B]: <= 0 or >= V = off
  const float* top_p;          // [B]: >= 1 = off
  const float* min_p;          // [B]: <= 0 = off
  const int64_t* seed_offset;  // [2]: Philox seed, offset
  int32_t* tokens;             // [B]
  int64_t b, v;
};

using SampleLaunch = Status (*)(const SampleArgs& a, cudaStream_t stream);

inline Status validate_sample(const SampleArgs& a) {
  const int64_t row_bytes = a.bf16 ? 2 : 4;
  Status s = Check()
                 .not_null(a.logits, "logits")
                 .not_null(a.temperature, "temperature")
                 .not_null(a.top_k, "top_k")
                 .not_null(a.top_p, "top_p")
                 .not_null(a.min_p, "min_p")
                 .not_null(a.seed_offset, "seed_offset")
                 .not_null(a.tokens, "tokens")
                 .positive(a.b, "B")
                 .positive(a.v, "V")
                 .that(a.b <= std::numeric_limits<int32_t>::max(), "B must be below 2^31")
                 .that(a.v <= kMaxV, "V must be at most 2^19 (the prefix search's chunk table)")
                 .aligned(a.logits, int(row_bytes), "logits")
                 .aligned(a.seed_offset, 8, "seed_offset")
                 .aligned(a.tokens, 4, "tokens")
                 .status();
  if (!s.ok()) return s;
  return Check()
      .disjoint(a.tokens, 4 * a.b, a.logits, row_bytes * a.b * a.v, "tokens and logits")
      .disjoint(a.tokens, 4 * a.b, a.seed_offset, 16, "tokens and seed_offset")
      .arch_at_least(80)
      .status();
}

inline Version sample_version(const char* id, const char* summary, SampleLaunch launch,
                              std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, kSample, id, summary, kind, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 6 && a.outputs.size() == 1,
                         "sample takes 6 inputs (logits, temperature, top_k, top_p, min_p, "
                         "seed_offset) and 1 output (tokens)")
                   .status();
    if (!s.ok()) return s;
    const TensorRef& x = a.inputs[0];
    const bool rows = x.shape.size() == 2;
    auto per_row = [&](const TensorRef& t, DType d) {
      return t.dtype == d && t.shape.size() == 1 && rows && t.dim(0) == x.dim(0);
    };
    s = Check()
            .that((x.dtype == DType::kF32 || x.dtype == DType::kBF16) && rows,
                  "logits are float32 or bfloat16 [B, V]")
            .that(per_row(a.inputs[1], DType::kF32), "temperature is float32 [B]")
            .that(per_row(a.inputs[2], DType::kI32), "top_k is int32 [B]")
            .that(per_row(a.inputs[3], DType::kF32), "top_p is float32 [B]")
            .that(per_row(a.inputs[4], DType::kF32), "min_p is float32 [B]")
            .that(a.inputs[5].dtype == DType::kI64 && a.inputs[5].numel() == 2,
                  "seed_offset is int64 [2]")
            .that(per_row(a.outputs[0], DType::kI32), "tokens are int32 [B]")
            .status();
    if (!s.ok()) return s;
    return launch(SampleArgs{x.data, x.dtype == DType::kBF16,
                             static_cast<const float*>(a.inputs[1].data),
                             static_cast<const int32_t*>(a.inputs[2].data),
                             static_cast<const float*>(a.inputs[3].data),
                             static_cast<const float*>(a.inputs[4].data),
                             static_cast<const int64_t*>(a.inputs[5].data),
                             static_cast<int32_t*>(a.outputs[0].data), x.dim(0), x.dim(1)},
                  stream);
  };
  v.bytes = io_bytes;
  // A division by T, an exponential and a few compares per element.
  v.flops = [](const Args& a) { return 4.0 * double(a.inputs[0].numel()); };
  return v;
}

// The row's logit i as FP32 (BF16 widens exactly).
__device__ __forceinline__ float logit_at(const void* logits, bool bf16, int64_t i) {
  if (bf16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(logits)[i]) << 16);
  return static_cast<const float*>(logits)[i];
}

// ---------------------------------------------------------------------------------------------
// rejection_sample (speculative decoding).

constexpr const char* kRejection = "rejection_sample";

struct RejectionArgs {
  const float* q;              // draft probs [B, S, V]
  const int32_t* draft;        // draft tokens [B, S]
  const float* p;              // target probs [B, S + 1, V]
  const int64_t* seed_offset;  // [2]
  int32_t* tokens;             // [B, S + 1]: accepted drafts, the last token, then −1
  int32_t* accepted;           // [B]
  int64_t b, s, v;
};

using RejectionLaunch = Status (*)(const RejectionArgs& a, cudaStream_t stream);

// The bytes a launch must move at least, whatever the outcome: the drafts, q and p at every
// draft (one float each), the two rows a rejection at the last draft reads, the outputs
// (lkw.sampling.rejection_bytes with num_accepted None).
inline double rejection_bytes(const Args& a) {
  const double b = double(a.inputs[0].dim(0)), s = double(a.inputs[0].dim(1));
  const double v = double(a.inputs[0].dim(2));
  return b * s * 4 + b * s * 2 * 4 + 2 * b * v * 4 + b * (s + 1) * 4 + b * 4;
}

inline Status validate_rejection(const RejectionArgs& a) {
  Status s = Check()
                 .not_null(a.q, "draft_probs")
                 .not_null(a.draft, "draft_tokens")
                 .not_null(a.p, "target_probs")
                 .not_null(a.seed_offset, "seed_offset")
                 .not_null(a.tokens, "tokens")
                 .not_null(a.accepted, "num_accepted")
                 .positive(a.b, "B")
                 .that(a.s >= 0, "S must be >= 0 (0: only the bonus token)")
                 .positive(a.v, "V")
                 .that(a.b <= std::numeric_limits<int32_t>::max(), "B must be below 2^31")
                 .that(a.s <= 64, "S must be at most 64 (a row draws S + 1 numbers)")
                 .that(a.v <= kMaxV, "V must be at most 2^19 (the prefix search's chunk table)")
                 .aligned(a.q, 4, "draft_probs")
                 .aligned(a.p, 4, "target_probs")
                 .aligned(a.seed_offset, 8, "seed_offset")
                 .status();
  if (!s.ok()) return s;
  const int64_t out_bytes = 4 * a.b * (a.s + 1);
  return Check()
      .disjoint(a.tokens, out_bytes, a.accepted, 4 * a.b, "tokens and num_accepted")
      .disjoint(a.tokens, out_bytes, a.q, 4 * a.b * a.s * a.v, "tokens and draft_probs")
      .disjoint(a.tokens, out_bytes, a.p, 4 * a.b * (a.s + 1) * a.v, "tokens and target_probs")
      .disjoint(a.accepted, 4 * a.b, a.q, 4 * a.b * a.s * a.v, "num_accepted and draft_probs")
      .disjoint(a.accepted, 4 * a.b, a.p, 4 * a.b * (a.s + 1) * a.v, "num_accepted and target_probs")
      .arch_at_least(80)
      .status();
}

inline Version rejection_version(const char* id, const char* summary, RejectionLaunch launch,
                                 std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, kRejection, id, summary, kind, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 4 && a.outputs.size() == 2,
                         "rejection_sample takes 4 inputs (draft_probs, draft_tokens, "
                         "target_probs, seed_offset) and 2 outputs (tokens, num_accepted)")
                   .status();
    if (!s.ok()) return s;
    const TensorRef &q = a.inputs[0], &d = a.inputs[1], &p = a.inputs[2];
    const bool q3 = q.dtype == DType::kF32 && q.shape.size() == 3;
    const int64_t b = q3 ? q.dim(0) : 0, n = q3 ? q.dim(1) : 0, v = q3 ? q.dim(2) : 0;
    s = Check()
            .that(q3, "draft_probs are float32 [B, S, V]")
            .that(d.dtype == DType::kI32 && d.shape == std::vector<int64_t>{b, n},
                  "draft_tokens are int32 [B, S]")
            .that(p.dtype == DType::kF32 && p.shape == std::vector<int64_t>{b, n + 1, v},
                  "target_probs are float32 [B, S + 1, V]")
            .that(a.inputs[3].dtype == DType::kI64 && a.inputs[3].numel() == 2,
                  "seed_offset is int64 [2]")
            .that(a.outputs[0].dtype == DType::kI32 &&
                      a.outputs[0].shape == std::vector<int64_t>{b, n + 1},
                  "tokens are int32 [B, S + 1]")
            .that(a.outputs[1].dtype == DType::kI32 && a.outputs[1].shape == std::vector<int64_t>{b},
                  "num_accepted is int32 [B]")
            .status();
    if (!s.ok()) return s;
    return launch(RejectionArgs{static_cast<const float*>(q.data),
                                static_cast<const int32_t*>(d.data),
                                static_cast<const float*>(p.data),
                                static_cast<const int64_t*>(a.inputs[3].data),
                                static_cast<int32_t*>(a.outputs[0].data),
                                static_cast<int32_t*>(a.outputs[1].data), b, n, v},
                  stream);
  };
  v.bytes = rejection_bytes;
  v.flops = [](const Args& a) { return 2.0 * double(a.inputs[0].dim(0) * a.inputs[0].dim(2)); };
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
