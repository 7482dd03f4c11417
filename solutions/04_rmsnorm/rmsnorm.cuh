// Chapter 04 — rmsnorm: from a scalar RMSNorm to fused residual add + RMSNorm + dynamic quant.
//
// ops (BF16 x [T, d], residual [T, d], weight [d]; eps an FP32 param). reference/lkw/rmsnorm.py
// is the contract; it says where each value is rounded:
//   rmsnorm                 y = bf16(bf16(x·rstd)·w),  rstd = 1/sqrt(sum(x²)/d + eps)
//   fused_add_rmsnorm       r = bf16(x + residual) → residual_out, y = rmsnorm(r)
//   fused_add_rmsnorm_fp8   r → residual_out; q E4M3 [T, d] and scales FP32 [T, 1]: chapter 03's
//   fused_add_rmsnorm_int8  per-token quant of yb = rmsnorm(r), which never reaches memory
//   fused_add_rmsnorm_fp8_group   the same with chapter 03's per_group_fp8 of yb: a scale per
//                           1 × 128 slice of a row, scales FP32 [d/128, T] (column-major: the
//                           blockwise FP8 GEMM's activation scales); d a multiple of 128
// residual_out is either residual itself (updated in place, vLLM's signature) or a disjoint buffer.
//
// Bytes per element (plus the weight, 2·d per launch, and 4 B per row, or per group, of scales):
//   rmsnorm                         4 B   x read, y written
//   fused add + norm                8 B   x, residual read; y, residual_out written
//   fused add + norm + quant        7 B   x, residual read; q (1 B), residual_out written
//   unfused add → norm             10 B   add 6 (x, residual in, r out) + norm 4 (r in, y out)
//   unfused add → norm → quant     13 B   add 6 + norm 4 + quant 3 (y in, q out)
// The work per element is a handful of FP32 operations, far below any ridge point: every version
// is judged by bytes, and fusion wins only bytes — the intermediate tensors that the unfused chain
// sends through HBM and reads back.
//
// versions: v0_scalar (a thread per row) → v1_block_tree (a block per row, shared-memory tree) →
// v2_warp_shuffle (shuffles, bf16x2) → v3_vec16_registers (16-byte vectors, the row held in
// registers, one HBM read) → v4_fused_add (fused_add_rmsnorm) → v5_fused_add_quant (the FP8,
// FP8-group and INT8 ops); peers chain_unfused (the separate kernels). v3, v4, v5 and the chains
// share the row routine below, so for a given d they sum the squares in the same order and
// compute the same rstd and the same yb, bit for bit: the fused quant must equal the unfused
// chain exactly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "lkw/registry.h"

namespace lkw::rmsnorm {

constexpr const char* kChapter = "04_rmsnorm";

enum class Quant { kNone, kFp8, kInt8 };
constexpr int kGroup = 128;  // chapter 03's per_group_fp8: 1 × 128 groups along d

struct NormOp {
  const char* name;
  bool residual;  // fused residual add: inputs x, residual, weight; residual_out is the last output
  Quant quant;    // kNone: y BF16; else q and scales instead of y
  int group = 0;  // a scale per 1 × group slice of a row (d a multiple of it); 0: one per row
};
constexpr NormOp kRmsnorm{"rmsnorm", false, Quant::kNone};
constexpr NormOp kFusedAdd{"fused_add_rmsnorm", true, Quant::kNone};
constexpr NormOp kFusedAddFp8{"fused_add_rmsnorm_fp8", true, Quant::kFp8};
constexpr NormOp kFusedAddInt8{"fused_add_rmsnorm_int8", true, Quant::kInt8};
constexpr NormOp kFusedAddFp8Group{"fused_add_rmsnorm_fp8_group", true, Quant::kFp8, kGroup};

// The scales' shape: [T, 1], or per group [d/group, T], column-major as chapter 03's
// per_group_fp8 writes them (the T scales of one group contiguous: what the GEMM reads).
inline std::vector<int64_t> scales_shape(const NormOp& op, int64_t t, int64_t d) {
  return op.group ? std::vector<int64_t>{d / op.group, t} : std::vector<int64_t>{t, 1};
}
inline std::string scales_text(const NormOp& op) {
  return op.group ? "[d/" + std::to_string(op.group) + ", T]" : "[T, 1]";
}

// Everything a launcher gets: raw device pointers (null where the op has no such tensor) and sizes.
struct NormArgs {
  const __nv_bfloat16* x;            // [T, d]
  const __nv_bfloat16* residual_in;  // [T, d]
  __nv_bfloat16* residual_out;       // [T, d]; == residual_in for the in-place update
  const __nv_bfloat16* weight;       // [d]
  __nv_bfloat16* y;                  // [T, d]
  void* q;                           // E4M3 or int8 [T, d]
  float* scales;                     // [T, 1], or [d/128, T] per group
  int64_t t, d;
  float eps;
};

using NormLaunch = Status (*)(const NormArgs& a, cudaStream_t stream);

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// The checks every launcher starts with. `vec` is the number of BF16 elements per access the
// launcher will use for this d (each BF16 tensor must be aligned to 2·vec bytes, q to vec);
// `max_d` is what its register budget allows. Outputs may not overlap any input or each other —
// except residual_out, which may be residual_in exactly (the in-place update; each element is
// read and then written by the same thread). A partial overlap is refused.
inline Status validate_norm(const NormOp& op, const NormArgs& a, int vec, int64_t max_d) {
  const bool has_y = op.quant == Quant::kNone;
  Status s = Check()
                 .not_null(a.x, "x")
                 .not_null(a.weight, "weight")
                 .that(!op.residual || a.residual_in, "residual is a null pointer")
                 .that(!op.residual || a.residual_out, "residual_out is a null pointer")
                 .that(!has_y || a.y, "y is a null pointer")
                 .that(has_y || a.q, "q is a null pointer")
                 .that(has_y || a.scales, "scales is a null pointer")
                 .positive(a.t, "T")
                 .positive(a.d, "d")
                 .that(!op.group || a.d % op.group == 0,
                       std::string(op.name) + ": d = " + std::to_string(a.d) +
                           " must be a multiple of " + std::to_string(op.group) + " (its groups)")
                 .that(a.t <= std::numeric_limits<int32_t>::max(),
                       "T must be below 2^31 (rows are blockIdx.x)")
                 .that(a.d <= max_d, "d = " + std::to_string(a.d) + " exceeds this version's " +
                                         std::to_string(max_d) + " (its registers per row)")
                 .that(std::isfinite(a.eps) && a.eps >= 0.0f, "eps must be finite and >= 0")
                 .aligned(a.x, 2 * vec, "x")
                 .aligned(a.residual_in, 2 * vec, "residual")
                 .aligned(a.residual_out, 2 * vec, "residual_out")
                 .aligned(a.weight, 2 * vec, "weight")
                 .aligned(a.y, 2 * vec, "y")
                 .aligned(a.q, vec, "q")
                 .aligned(a.scales, 4, "scales")
                 .status();
  if (!s.ok()) return s;
  struct Span {
    const void* p;
    int64_t bytes;
    const char* name;
  };
  const int64_t elems = a.t * a.d;
  const int64_t n_scales = a.t * (op.group ? a.d / op.group : 1);
  const Span inputs[] = {
      {a.x, 2 * elems, "x"}, {a.residual_in, 2 * elems, "residual"}, {a.weight, 2 * a.d, "weight"}};
  const Span outputs[] = {{a.residual_out, 2 * elems, "residual_out"},
                          {a.y, 2 * elems, "y"},
                          {a.q, elems, "q"},
                          {a.scales, 4 * n_scales, "scales"}};
  Check c;
  for (int o = 0; o < 4; ++o) {
    if (!outputs[o].p) continue;
    for (int i = 0; i < 3; ++i) {
      const bool in_place = o == 0 && i == 1 && a.residual_out == a.residual_in;
      if (inputs[i].p && !in_place)
        c.disjoint(outputs[o].p, outputs[o].bytes, inputs[i].p, inputs[i].bytes,
                   (std::string(outputs[o].name) + " and " + inputs[i].name).c_str());
    }
    for (int other = 0; other < o; ++other)
      if (outputs[other].p)
        c.disjoint(outputs[o].p, outputs[o].bytes, outputs[other].p, outputs[other].bytes,
                   (std::string(outputs[o].name) + " and " + outputs[other].name).c_str());
  }
  return c.arch_at_least(80).status();
}

// Generic Args → NormArgs: tensor counts, dtypes and shapes of the op, and the param eps.
inline Status norm_args(const NormOp& op, const Args& a, NormArgs* out) {
  const size_t n_in = op.residual ? 3 : 2;
  const size_t n_out = op.quant != Quant::kNone ? 3 : op.residual ? 2 : 1;
  Status s = Check()
                 .that(a.inputs.size() == n_in && a.outputs.size() == n_out,
                       std::string(op.name) + " takes " + std::to_string(n_in) + " inputs and " +
                           std::to_string(n_out) + " outputs")
                 .that(a.params.count("eps") == 1, std::string(op.name) + " needs the param eps")
                 .status();
  if (!s.ok()) return s;
  const TensorRef& x = a.inputs[0];
  const TensorRef& w = a.inputs.back();
  const TensorRef* residual = op.residual ? &a.inputs[1] : nullptr;
  const TensorRef* residual_out = op.residual ? &a.outputs.back() : nullptr;
  const TensorRef& first = a.outputs[0];  // y, or q
  const TensorRef* scales = op.quant != Quant::kNone ? &a.outputs[1] : nullptr;
  const DType first_dtype = op.quant == Quant::kFp8    ? DType::kE4M3
                            : op.quant == Quant::kInt8 ? DType::kI8
                                                       : DType::kBF16;
  auto bf16_matrix = [](const TensorRef* t) {
    return !t || (t->dtype == DType::kBF16 && t->shape.size() == 2);
  };
  s = Check()
          .that(bf16_matrix(&x) && bf16_matrix(residual) && bf16_matrix(residual_out),
                "x, residual and residual_out are BF16 [T, d]")
          .that(w.dtype == DType::kBF16 && w.shape.size() == 1, "weight is BF16 [d]")
          .that(first.dtype == first_dtype && first.shape.size() == 2,
                std::string(op.quant == Quant::kNone ? "y" : "q") + " must be " +
                    dtype_name(first_dtype) + " [T, d]")
          .that(!scales || (scales->dtype == DType::kF32 && scales->shape.size() == 2),
                "scales are float32 " + scales_text(op))
          .status();
  if (!s.ok()) return s;
  const int64_t t = x.dim(0), d = x.dim(1);
  auto same = [&](const TensorRef* r) { return !r || (r->dim(0) == t && r->dim(1) == d); };
  s = Check()
          .that(w.dim(0) == d, "weight must have d elements")
          .that(same(residual) && same(residual_out) && same(&first),
                "every [T, d] tensor must have x's shape")
          .that(!scales || scales->shape == scales_shape(op, t, d),
                "scales must be " + scales_text(op))
          .status();
  if (!s.ok()) return s;
  *out = NormArgs{static_cast<const __nv_bfloat16*>(x.data),
                  residual ? static_cast<const __nv_bfloat16*>(residual->data) : nullptr,
                  residual_out ? static_cast<__nv_bfloat16*>(residual_out->data) : nullptr,
                  static_cast<const __nv_bfloat16*>(w.data),
                  op.quant == Quant::kNone ? static_cast<__nv_bfloat16*>(first.data) : nullptr,
                  op.quant != Quant::kNone ? first.data : nullptr,
                  scales ? static_cast<float*>(scales->data) : nullptr,
                  t,
                  d,
                  static_cast<float>(a.params.at("eps"))};
  return {};
}

// FP32 operations per element: square and accumulate (2), ×rstd, ×w; +1 for the residual add;
// +2 for the quant (|yb| into the absmax, ×1/scale). The per-row rsqrt is noise.
inline double flops_per_element(const NormOp& op) {
  return 4.0 + (op.residual ? 1.0 : 0.0) + (op.quant != Quant::kNone ? 2.0 : 0.0);
}

// The roofline minimum: every input read once, every output written once (the weight once per
// launch). The unfused chains replace it with what they really move.
inline double tensor_bytes(const Args& a) {
  double b = 0;
  for (const TensorRef& t : a.inputs) b += t.bytes();
  for (const TensorRef& t : a.outputs) b += t.bytes();
  return b;
}

inline Version norm_version(const NormOp& op, const char* id, const char* summary,
                            NormLaunch launch, std::vector<SassFact> sass = {},
                            Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    NormArgs na;
    Status s = norm_args(op, a, &na);
    return s.ok() ? launch(na, stream) : s;
  };
  v.bytes = tensor_bytes;
  v.flops = [op](const Args& a) { return flops_per_element(op) * double(a.inputs.at(0).numel()); };
  return v;
}

// ---------------------------------------------------------------------------------------------
// The row routine of v3, v4, v5 and the chains.
//
// A block owns one row (rows on blockIdx.x, so T may be in the millions). The row is cut into
// units of kVec BF16: 8 (16 bytes) when d is a multiple of 8, else 1 for the whole tensor (then a
// row start can sit anywhere, so no wider access is safe). The choice depends on d alone, and so
// does the thread count, so every kernel that uses this routine makes the same choice for the
// same d. Thread t holds units t, t + blockDim.x, t + 2·blockDim.x, ... (up to kUnits of them) in
// registers: each warp-wide access is one contiguous run, and the row is read from HBM once.
// The sum of squares has one fixed order: each thread's units in order (one FMA per element),
// a shuffle butterfly in each warp, then the warp totals, again by butterfly, in warp 0. The
// arithmetic is spelled with _rn intrinsics, which the compiler never contracts or reorders, so
// the order in the source is the order on the GPU.

// kVec BF16 values, aligned to their size so that one unit is one access (16 bytes for 8). Pairs
// are held as 32-bit words: an array of 16-bit elements would be split by the compiler into a
// register per element, and its loads into narrower ones. get and put read and write one
// element as FP32.
template <int kVec>
struct alignas(2 * kVec) Bf16Vec {
  static_assert(kVec == 1 || kVec % 2 == 0, "one element or whole pairs");
  using Word = std::conditional_t<kVec == 1, uint16_t, uint32_t>;
  Word word[kVec == 1 ? 1 : kVec / 2];
};

// Element j as FP32 (exact: a BF16 is the top half of an FP32).
template <int kVec>
__device__ __forceinline__ float get(const Bf16Vec<kVec>& v, int j) {
  if constexpr (kVec == 1) {
    return __uint_as_float(uint32_t(v.word[0]) << 16);
  } else {
    const uint32_t w = v.word[j / 2];
    return __uint_as_float(j % 2 ? w & 0xffff0000u : w << 16);
  }
}

// Element j = bf16(x), rounded to nearest even.
template <int kVec>
__device__ __forceinline__ void put(Bf16Vec<kVec>& v, int j, float x) {
  const uint32_t b = __bfloat16_as_ushort(__float2bfloat16_rn(x));
  if constexpr (kVec == 1) {
    v.word[0] = uint16_t(b);
  } else {
    uint32_t& w = v.word[j / 2];
    w = j % 2 ? (w & 0x0000ffffu) | (b << 16) : (w & 0xffff0000u) | b;
  }
}

__device__ __forceinline__ float f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ __nv_bfloat16 bf16(float v) { return __float2bfloat16_rn(v); }

// One thread's share of a row, and the register budget behind it, both compile-time constants:
// 32 elements in 16 registers, as 4 units of 16 bytes (at up to 1024 threads: d ≤ 32768) or 32
// single elements, two to a register (at up to 512 threads: d ≤ 16384; single elements need more
// registers for their addresses and predicates, so fewer threads share the register file).
template <int kVec>
struct RowTile {
  static_assert(kVec == 8 || kVec == 1, "units are 16-byte vectors or single elements");
  static constexpr int kUnits = kVec == 8 ? 4 : 32;
  static constexpr int kMaxThreads = kVec == 8 ? 1024 : 512;
  static constexpr int64_t kMaxD = int64_t(kMaxThreads) * kUnits * kVec;
  using Pack = Bf16Vec<kVec == 8 ? 8 : 2>;  // a unit, or two single-element units
  static constexpr int kPerPack = kVec == 8 ? 1 : 2;
  Pack pack[kUnits / kPerPack];

  __device__ __forceinline__ float get(int u, int j) const {
    if constexpr (kVec == 8) {
      return rmsnorm::get(pack[u], j);
    } else {
      return rmsnorm::get(pack[u / 2], u % 2);
    }
  }
  __device__ __forceinline__ void put(int u, int j, float x) {
    if constexpr (kVec == 8) {
      rmsnorm::put(pack[u], j, x);
    } else {
      rmsnorm::put(pack[u / 2], u % 2, x);
    }
  }
};

inline int row_vec(int64_t d) { return d % 8 == 0 ? 8 : 1; }
inline int64_t row_max_d(int64_t d) { return d % 8 == 0 ? RowTile<8>::kMaxD : RowTile<1>::kMaxD; }

// Threads per row: as few whole warps as hold the row at kUnits units a thread (d = 4096: 128,
// 8192: 256, 16384: 512). Few threads with several 16-byte loads each keep more bytes in flight
// per SM than many threads with one each.
inline int row_threads(int64_t d) {
  const int vec = row_vec(d);
  const int64_t per_thread = vec == 8 ? RowTile<8>::kUnits : RowTile<1>::kUnits;
  const int64_t threads = (d / vec + per_thread - 1) / per_thread;
  return int((threads + 31) / 32 * 32);
}

// Stage: load this thread's units of one row (of `units` units) into registers. Units past the
// end are zero: they add nothing to a sum of squares or an absmax, and are never stored.
template <int kVec>
__device__ __forceinline__ void load_row(const __nv_bfloat16* row, int units, RowTile<kVec>& tile) {
  // BEGIN SOLUTION: v3 — unit u is row unit threadIdx.x + u·blockDim.x (0 past the end)
  if constexpr (kVec == 8) {
    const auto* row_vec = reinterpret_cast<const Bf16Vec<8>*>(row);
#pragma unroll
    for (int u = 0; u < RowTile<8>::kUnits; ++u) {
      const int i = threadIdx.x + u * blockDim.x;
      tile.pack[u] = i < units ? row_vec[i] : Bf16Vec<8>{};  // (T, d/8) × 16 B
    }
  } else {
    const auto* row_bits = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
    for (int u = 0; u < RowTile<1>::kUnits; u += 2) {
      const int i = threadIdx.x + u * blockDim.x, i_next = i + blockDim.x;
      const uint32_t lo = i < units ? row_bits[i] : 0u, hi = i_next < units ? row_bits[i_next] : 0u;
      tile.pack[u / 2].word[0] = lo | hi << 16;  // (T, d) × 2 B, two units a register
    }
  }
  // STUB: tile = {};
  // END SOLUTION
}

// Stage: store this thread's units of one row.
template <int kVec>
__device__ __forceinline__ void store_row(__nv_bfloat16* row, int units,
                                          const RowTile<kVec>& tile) {
  if constexpr (kVec == 8) {
    auto* row_vec = reinterpret_cast<Bf16Vec<8>*>(row);
#pragma unroll
    for (int u = 0; u < RowTile<8>::kUnits; ++u) {
      const int i = threadIdx.x + u * blockDim.x;
      if (i < units) row_vec[i] = tile.pack[u];  // (T, d/8) × 16 B
    }
  } else {
    auto* row_bits = reinterpret_cast<uint16_t*>(row);
#pragma unroll
    for (int u = 0; u < RowTile<1>::kUnits; ++u) {
      const int i = threadIdx.x + u * blockDim.x;
      const uint32_t two = tile.pack[u / 2].word[0];
      if (i < units) row_bits[i] = uint16_t(u % 2 ? two >> 16 : two);  // (T, d) × 2 B
    }
  }
}

// Stage (v4, v5): r = bf16(x + residual) in place of x. The FP32 sum of two BF16 values is
// rounded once, here, and this rounded r is what residual_out, the variance and the
// normalization all use — as the unfused chain, whose add kernel writes r to memory, must.
template <int kVec>
__device__ __forceinline__ void add_residual(RowTile<kVec>& x, const RowTile<kVec>& residual) {
  // BEGIN SOLUTION: v4 — each element becomes bf16(fp32(x) + fp32(residual))
#pragma unroll
  for (int u = 0; u < RowTile<kVec>::kUnits; ++u) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) x.put(u, j, __fadd_rn(x.get(u, j), residual.get(u, j)));
  }
  // END SOLUTION
}

struct Add {
  __device__ __forceinline__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly over the warp, or with kLanes = 16 over each aligned half-warp (xor offsets below 16
// never leave it): every lane ends with the same total (a + b and b + a are the same IEEE sum,
// so the lanes cannot drift apart).
template <class Op, int kLanes = 32>
__device__ __forceinline__ float warp_reduce(float v) {
  static_assert(kLanes == 32 || kLanes == 16, "the warp, or each aligned half of it");
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1)
    v = Op{}(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Every thread of the block gets the block's total. Slots of absent warps hold 0, the identity
// of both uses (a sum, and a max of absolute values). Every thread of the block must call it.
template <class Op>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float warp_total_sh[32];  // up to 1024 threads
  __shared__ float total_sh;
  const int lane_idx = threadIdx.x % 32, warp_idx = threadIdx.x / 32;
  v = warp_reduce<Op>(v);
  if (lane_idx == 0) warp_total_sh[warp_idx] = v;
  __syncthreads();
  if (warp_idx == 0) {
    v = warp_reduce<Op>(lane_idx < blockDim.x / 32 ? warp_total_sh[lane_idx] : 0.0f);
    if (lane_idx == 0) total_sh = v;
  }
  __syncthreads();
  return total_sh;
}

// Hides the tile's values from the optimizer at this point (an empty asm that "may change" each
// register). Without it, the compiler keeps the FP32 copy of every element it converted before a
// block reduction alive across the reduction, to reuse after it: two registers per pair instead
// of one, which at 1024 threads spills to local memory. After this it converts again from the
// packed words, one shift or mask per element.
template <int kVec>
__device__ __forceinline__ void keep_packed(RowTile<kVec>& tile) {
#pragma unroll
  for (auto& pack : tile.pack) {
#pragma unroll
    for (uint32_t& word : pack.word) asm volatile("" : "+r"(word));
  }
}

// Stage: rstd = 1/sqrt(sum(v²)/d + eps) for the row, in every thread. rsqrtf is MUFU.RSQ, within
// 2 FP32 ulps of the rounded 1/sqrt, which the contract allows; it is the same instruction in
// every kernel, so the kernels still agree with each other exactly.
template <int kVec>
__device__ __forceinline__ float row_rstd(RowTile<kVec>& tile, int64_t d, float eps) {
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < RowTile<kVec>::kUnits; ++u) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float v = tile.get(u, j);
      ss = __fmaf_rn(v, v, ss);
    }
  }
  ss = block_reduce<Add>(ss);
  keep_packed(tile);
  return rsqrtf(__fadd_rn(__fdiv_rn(ss, float(d)), eps));
}

// Stage: y = bf16(bf16(v·rstd)·w) in place of v. z = v·rstd is rounded to BF16 before the weight
// multiply (the contract, and what an unfused norm kernel hands over); z·w is exact in FP32
// (8-bit significands), so the second rounding is the only one of the product.
template <int kVec>
__device__ __forceinline__ void normalize_row(RowTile<kVec>& tile, float rstd,
                                              const RowTile<kVec>& weight) {
#pragma unroll
  for (int u = 0; u < RowTile<kVec>::kUnits; ++u) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float z = f32(bf16(__fmul_rn(tile.get(u, j), rstd)));
      tile.put(u, j, __fmul_rn(z, weight.get(u, j)));
    }
  }
}

// Stage (v5): the row's absmax, max |value| over the row, in every thread (exact in any order).
template <int kVec>
__device__ __forceinline__ float row_absmax(RowTile<kVec>& tile) {
  float m = 0.0f;
#pragma unroll
  for (int u = 0; u < RowTile<kVec>::kUnits; ++u) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) m = fmaxf(m, fabsf(tile.get(u, j)));
  }
  m = block_reduce<Max>(m);
  keep_packed(tile);
  return m;
}

}  // namespace lkw::rmsnorm
