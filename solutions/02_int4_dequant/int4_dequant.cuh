// Chapter 02 — int4_dequant: from naive unpack to lop3 magic numbers.
//
// ops (W_hat [N, K] out; scales [N, K/G], G ∈ {32, 64, 128} inferred as K / scales.shape[1]):
//   int4_f16 / int4_bf16          packed uint32 [N, K/8], natural nibble order, W = s·(q − 8)
//   int4i_f16 / int4i_bf16        the same weights repacked in the interleaved order (dequant.cuh)
//   int4i_zp_f16 / int4i_zp_bf16  + zero points uint32 [N, K/G/8] (4-bit, natural order along
//                                 the groups): W = q·s − z·s, z·s rounded once per group
//   int8_f16                      uint8 [N, K] with bias 128: W = s·(b − 128)
//   e4m3_f16 / e4m3_bf16          FP8 E4M3 [N, K]: W = s·e4m3(b)
// Bytes per element: 0.5 (INT4) or 1 (8-bit) read + 2/G·2 for scales (+ 0.5/G zero points)
// + 2 written.
//
// versions: v0_naive (per element: shift, mask, I2F, subtract, multiply) → v1_vec16 (16-byte
// loads and stores, same arithmetic) → v2_lop3_magic (FP16 magic, interleaved) → v3_bf16_magic →
// v4_zero_points; and for 8-bit weights v1_vec16 (I2F / hardware cvt) vs v5_int8_prmt and
// v6_fp8_bit_shift.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lkw/registry.h"

namespace lkw::int4 {

constexpr const char* kChapter = "02_int4_dequant";

enum class Weights { kInt4, kInt8, kE4M3 };

struct DequantOp {
  const char* name;
  Weights weights;
  DType out;          // FP16 or BF16: also the scales' dtype
  bool zero_points;
};
constexpr DequantOp kInt4F16{"int4_f16", Weights::kInt4, DType::kF16, false};
constexpr DequantOp kInt4Bf16{"int4_bf16", Weights::kInt4, DType::kBF16, false};
constexpr DequantOp kInt4iF16{"int4i_f16", Weights::kInt4, DType::kF16, false};
constexpr DequantOp kInt4iBf16{"int4i_bf16", Weights::kInt4, DType::kBF16, false};
constexpr DequantOp kInt4iZpF16{"int4i_zp_f16", Weights::kInt4, DType::kF16, true};
constexpr DequantOp kInt4iZpBf16{"int4i_zp_bf16", Weights::kInt4, DType::kBF16, true};
constexpr DequantOp kInt8F16{"int8_f16", Weights::kInt8, DType::kF16, false};
constexpr DequantOp kE4m3F16{"e4m3_f16", Weights::kE4M3, DType::kF16, false};
constexpr DequantOp kE4m3Bf16{"e4m3_bf16", Weights::kE4M3, DType::kBF16, false};

// Everything a dequant launcher gets: raw device pointers and sizes.
struct DequantArgs {
  const void* weights;   // uint32 [N, K/8] (INT4) or uint8 [N, K]
  const void* scales;    // FP16/BF16 [N, K/G]
  const uint32_t* zeros; // uint32 [N, K/G/8] or null
  void* out;             // FP16/BF16 [N, K]
  int64_t n, k;
  int group;
};

using DequantLaunch = Status (*)(const DequantArgs& a, cudaStream_t stream);

// Checks shared by every launcher; `elems_per_thread` is what one thread converts (1 for v0).
inline Status validate_dequant(const DequantOp& op, const DequantArgs& a, int align) {
  return Check()
      .not_null(a.weights, "weights")
      .not_null(a.scales, "scales")
      .not_null(a.out, "out")
      .that(!op.zero_points || a.zeros != nullptr, "zero points are required")
      .positive(a.n, "N")
      .positive(a.k, "K")
      .that(a.group == 32 || a.group == 64 || a.group == 128,
            "group size must be 32, 64 or 128 (got " + std::to_string(a.group) + ")")
      .multiple_of(a.k, a.group, "K")
      .that(!op.zero_points || (a.k / a.group) % 8 == 0,
            "zero points need K/G to be a multiple of 8 (they are packed 8 to a word)")
      .aligned(a.weights, align, "weights")
      .aligned(a.out, align, "out")
      .aligned(a.scales, 2, "scales")
      .aligned(a.zeros, 4, "zeros")
      .arch_at_least(80)
      .status();
}

inline Version dequant_version(const DequantOp& op, const char* id, const char* summary,
                               DequantLaunch launch, std::vector<SassFact> sass = {},
                               Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  const size_t n_inputs = op.zero_points ? 3 : 2;
  const DType wtype = op.weights == Weights::kInt4   ? DType::kU32
                      : op.weights == Weights::kInt8 ? DType::kU8
                                                     : DType::kE4M3;
  const int per_unit = op.weights == Weights::kInt4 ? 8 : 1;  // elements per weight array element
  v.launch = [op, launch, n_inputs, wtype, per_unit](const Args& a, cudaStream_t s) -> Status {
    Status st = Check()
                    .that(a.inputs.size() == n_inputs && a.outputs.size() == 1,
                          std::string(op.name) + " takes " + std::to_string(n_inputs) +
                              " inputs and one output")
                    .status();
    if (!st.ok()) return st;
    const TensorRef &w = a.inputs[0], &sc = a.inputs[1], &out = a.outputs[0];
    st = Check()
             .that(w.dtype == wtype, std::string("weights must be ") + dtype_name(wtype))
             .that(sc.dtype == op.out && out.dtype == op.out,
                   std::string("scales and out must be ") + dtype_name(op.out))
             .that(w.shape.size() == 2 && sc.shape.size() == 2 && out.shape.size() == 2,
                   "weights, scales and out are matrices")
             .status();
    if (!st.ok()) return st;
    const int64_t n = out.dim(0), k = out.dim(1);
    st = Check()
             .that(w.dim(0) == n && w.dim(1) * per_unit == k, "weights must be [N, K/8] words (INT4) or [N, K] bytes")
             .that(sc.dim(0) == n && sc.dim(1) > 0 && k % sc.dim(1) == 0, "scales must be [N, K/G]")
             .status();
    if (!st.ok()) return st;
    const uint32_t* zeros = nullptr;
    if (op.zero_points) {
      const TensorRef& z = a.inputs[2];
      st = Check()
               .that(z.dtype == DType::kU32 && z.shape.size() == 2, "zero points are uint32 words")
               .that(z.dim(0) == n && z.dim(1) * 8 == sc.dim(1), "zero points must be [N, K/G/8]")
               .status();
      if (!st.ok()) return st;
      zeros = static_cast<const uint32_t*>(z.data);
    }
    const DequantArgs args{w.data, sc.data, zeros, out.data, n, k, int(k / sc.dim(1))};
    return launch(args, s);
  };
  v.bytes = [](const Args& a) {
    double b = 0;
    for (const TensorRef& t : a.inputs) b += t.bytes();
    return b + a.outputs.at(0).bytes();
  };
  v.flops = [](const Args&) { return 0.0; };
  return v;
}

// ---------------------------------------------------------------------------------------------
// The kernel shape shared by v1..v6. The unit of work is 8 weights: one word of INT4 or two words
// of 8-bit weights in, 16 bytes of FP16/BF16 out (always inside one group, since 8 | G). Thread t
// of a block converts units t and t + blockDim of its row segment:
// every load instruction of a warp reads one contiguous run (128 or 256 bytes) and every store
// instruction writes 512 contiguous bytes — whole lines on both sides. (Giving each thread one
// 16-byte *load* instead would spread its 64 output bytes over four stores 64 bytes apart: each
// store instruction would then touch twice the lines for the same bytes, on the side that moves
// four times the bytes; the book measures that layout.) Unpack provides:
//   using Pair = half2 / __nv_bfloat162;   static constexpr int kPerWord = 8 or 4;
//   static constexpr bool kZeroPoints;     (compile time: other kernels carry no zero-point code)
//   void operator()(uint32_t word, Pair scale2, Pair neg_zs2, Pair* out) const   (kPerWord/2 pairs)
// The grid is 2-D — blockIdx.y is the row — and the group size a power of two, so the index math
// is shifts and adds: a run-time integer division would itself compile to I2F (reciprocal)
// instructions and cloud the SASS facts.
template <class Pair>
struct PairOf;
template <>
struct PairOf<half2> {
  using Scalar = half;
  static __device__ __forceinline__ half2 dup(half x) { return __half2half2(x); }
  static __device__ __forceinline__ half from_u32(uint32_t z) { return __uint2half_rn(z); }
};
template <>
struct PairOf<__nv_bfloat162> {
  using Scalar = __nv_bfloat16;
  static __device__ __forceinline__ __nv_bfloat162 dup(__nv_bfloat16 x) { return __bfloat162bfloat162(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_u32(uint32_t z) { return __uint2bfloat16_rn(z); }
};

constexpr int kThreads = 256;
constexpr int kUnitsPerThread = 2;

template <int kWords>
struct Words;
template <>
struct Words<1> {
  using Type = uint32_t;
  static __device__ __forceinline__ uint32_t get(uint32_t w, int) { return w; }
};
template <>
struct Words<2> {
  using Type = uint2;
  static __device__ __forceinline__ uint32_t get(uint2 w, int i) { return i == 0 ? w.x : w.y; }
};

// One thread's units: first every load (weights, scales, zero points), then every convert and
// store. kFull (the whole block's tile lies inside the row) makes the loads unconditional; only
// then does the compiler issue them all before the first store — with a bound check per unit it
// keeps each load behind the previous unit's store, and the thread has one load in flight, not
// kUnitsPerThread (the book's chapter 02 shows the SASS and the time this saves).
template <class Unpack, bool kFull>
__device__ __forceinline__ void convert_units(
    const typename Words<8 / Unpack::kPerWord>::Type* __restrict__ w_row,
    const typename PairOf<typename Unpack::Pair>::Scalar* __restrict__ scale_row,
    const uint32_t* __restrict__ zero_row, uint4* __restrict__ out_row, int64_t first,
    int64_t units_per_row, int group_shift) {
  using Pair = typename Unpack::Pair;
  using P = PairOf<Pair>;
  using Scalar = typename P::Scalar;
  constexpr int kWords = 8 / Unpack::kPerWord;  // words per unit of 8 weights
  using W = Words<kWords>;

  typename W::Type w[kUnitsPerThread];
  Scalar scale[kUnitsPerThread];
  uint32_t zero_word[kUnitsPerThread];
#pragma unroll
  for (int u = 0; u < kUnitsPerThread; ++u) {
    const int64_t unit = first + u * kThreads;
    if (kFull || unit < units_per_row) {
      const int64_t g = (unit * 8) >> group_shift;
      w[u] = w_row[unit];    // (K/8) units
      scale[u] = scale_row[g];  // (K/G)
      if constexpr (Unpack::kZeroPoints) zero_word[u] = zero_row[g / 8];  // (K/G/8)
    }
  }
#pragma unroll
  for (int u = 0; u < kUnitsPerThread; ++u) {
    const int64_t unit = first + u * kThreads;
    if (!kFull && unit >= units_per_row) break;
    Pair neg_zs = P::dup(scale[u]);
    if constexpr (Unpack::kZeroPoints) {
      const int64_t g = (unit * 8) >> group_shift;
      const uint32_t z = (zero_word[u] >> (4 * (g % 8))) & 0xf;
      neg_zs = P::dup(__hneg(__hmul(P::from_u32(z), scale[u])));
    }
    Pair r[4];
#pragma unroll
    for (int i = 0; i < kWords; ++i)
      Unpack{}(W::get(w[u], i), P::dup(scale[u]), neg_zs, r + i * Unpack::kPerWord / 2);
    out_row[unit] = *reinterpret_cast<const uint4*>(r);  // (K/8) × 16 B
  }
}

template <class Unpack>
__global__ void __launch_bounds__(kThreads)
    dequant_units_kernel(const void* __restrict__ weights,
                         const typename PairOf<typename Unpack::Pair>::Scalar* __restrict__ scales,
                         const uint32_t* __restrict__ zeros, uint4* __restrict__ out, int64_t k,
                         int group_shift) {
  using W = Words<8 / Unpack::kPerWord>;
  const int64_t units_per_row = k / 8, row = blockIdx.y;
  const int64_t groups = k >> group_shift;
  const auto* w_row = static_cast<const typename W::Type*>(weights) + row * units_per_row;
  const auto* scale_row = scales + row * groups;                     // (N, K/G)
  const uint32_t* zero_row = zeros ? zeros + row * (groups / 8) : nullptr;  // (N, K/G/8)
  uint4* out_row = out + row * units_per_row;                        // (N, K/8) × 16 B
  const int64_t tile = blockIdx.x * int64_t(kThreads * kUnitsPerThread);
  // The branch is the same for the whole block: only a row's last tile can be partial.
  if (tile + kThreads * kUnitsPerThread <= units_per_row)
    convert_units<Unpack, true>(w_row, scale_row, zero_row, out_row, tile + threadIdx.x,
                                units_per_row, group_shift);
  else
    convert_units<Unpack, false>(w_row, scale_row, zero_row, out_row, tile + threadIdx.x,
                                 units_per_row, group_shift);
}

inline int log2_of(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

template <class Unpack>
Status launch_units(const DequantOp& op, const DequantArgs& a, cudaStream_t stream) {
  Status s = Check().that(a.n <= 65535, "N must be at most 65535 (rows are grid.y)").status();
  constexpr int kWordBytes = 4 * (8 / Unpack::kPerWord);
  if (s.ok()) s = validate_dequant(op, a, kWordBytes > 4 ? 8 : 4);
  if (s.ok()) s = Check().aligned(a.out, 16, "out").status();
  if (!s.ok()) return s;
  const int64_t units_per_row = a.k / 8, per_block = int64_t(kThreads) * kUnitsPerThread;
  const dim3 grid(unsigned((units_per_row + per_block - 1) / per_block), unsigned(a.n));
  using Scalar = typename PairOf<typename Unpack::Pair>::Scalar;
  dequant_units_kernel<Unpack><<<grid, kThreads, 0, stream>>>(
      a.weights, static_cast<const Scalar*>(a.scales), a.zeros, static_cast<uint4*>(a.out), a.k,
      log2_of(a.group));
  return last_launch_status(op.name);
}

}  // namespace lkw::int4
