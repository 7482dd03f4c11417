// Chapter 03 — dynamic_quant: absmax reductions that turn BF16 activations into FP8 and INT8.
//
// ops (x BF16 [T, d] in; q and scales out; the contract is reference/lkw/quant.py, and every
// rounding step is a call into quant_math.cuh):
//   per_token_fp8   q E4M3 [T, d], scales FP32 [T, 1]; Args param "scale_ub" (optional): the
//                   absmax is clamped to it before the division by 448
//   per_token_int8  q int8 [T, d], scales FP32 [T, 1]
//   per_tensor_fp8  q E4M3 [T, d], scale FP32 [1]: one absmax over the whole tensor
//   per_group_fp8   q E4M3 [T, d], scales FP32 [d/128, T], column-major: 1 × 128 groups along
//                   d, the T scales of one group contiguous (the FP8 GEMM's activation format);
//                   with Args param "scales_row_major" = 1 they are [T, d/128] instead (the
//                   param, not the shape, decides: the two shapes coincide when T = d/128)
// Bytes per element: 2 read + 1 written, + 4 per scale (4/d per token, 4/128 per group).
// At the bound every op reads x once and writes q once; how the absmax is found decides the rest.
//
// versions:
//   v0_two_pass          absmax pass, then a quantize pass that loads x from global again
//   v1_row_in_registers  one block per row, the row loaded once into registers
//   v2_vec16             16-byte loads, 8-byte stores, a warp per short row; per group a
//                        half-warp per 128-element group; per tensor the same two passes wide
//   v3_grid_sync         per tensor in one cooperative kernel, grid.sync() between the passes
// Per tensor cannot keep the tensor on chip while the grid agrees on one absmax: every version
// reads x twice (the second read partly from L2), so it moves up to 5 B per element, not 3.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lkw/registry.h"
#include "quant_math.cuh"

namespace lkw::quant {

constexpr const char* kChapter = "03_dynamic_quant";
constexpr int kGroup = 128;       // per_group_fp8: 1 × 128 groups along d
constexpr float kNoBound = 0.0f;  // fp8_scale's "no scale_ub"

enum class Granularity { kToken, kTensor, kGroup };

struct QuantOp {
  const char* name;
  Granularity granularity;
  DType code;  // q's dtype
};
constexpr QuantOp kPerTokenFp8{"per_token_fp8", Granularity::kToken, DType::kE4M3};
constexpr QuantOp kPerTokenInt8{"per_token_int8", Granularity::kToken, DType::kI8};
constexpr QuantOp kPerTensorFp8{"per_tensor_fp8", Granularity::kTensor, DType::kE4M3};
constexpr QuantOp kPerGroupFp8{"per_group_fp8", Granularity::kGroup, DType::kE4M3};

// Everything a quant launcher gets: raw device pointers and sizes.
struct QuantArgs {
  const __nv_bfloat16* x;  // [T, d]
  void* q;                 // [T, d] E4M3 codes or int8
  float* scales;           // [T] per token, [1] per tensor, [d/128, T] per group
  int64_t t, d;
  float scale_ub;  // per_token_fp8 only: the absmax is clamped to it; ≤ 0 means none
  bool scales_row_major = false;  // per_group_fp8 only: scales [T, d/128] instead of [d/128, T]
};

// Where the scale of token `row`, group `g` lives (per_group_fp8).
__host__ __device__ __forceinline__ int64_t group_scale_index(int64_t g, int64_t row, int64_t t,
                                                              int64_t groups, bool row_major) {
  return row_major ? row * groups + g : g * t + row;
}

using QuantLaunch = Status (*)(const QuantArgs& a, cudaStream_t stream);

inline int64_t scale_count(const QuantOp& op, int64_t t, int64_t d) {
  switch (op.granularity) {
    case Granularity::kToken:
      return t;
    case Granularity::kTensor:
      return 1;
    case Granularity::kGroup:
      return t * (d / kGroup);
  }
  return 0;
}

// What one launcher relies on beyond the op's own rules.
struct Limits {
  int64_t max_d = std::numeric_limits<int32_t>::max();  // a row must fit in registers
  int x_align = 2;                                      // bytes its loads of x need
  int q_align = 1;                                      // bytes its stores of q need
};

inline bool is_aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Checks shared by every launcher; the arch check comes last, so that bad arguments are refused
// (and tested) on machines without a GPU.
inline Status validate_quant(const QuantOp& op, const QuantArgs& a, const Limits& limits = {}) {
  Status s =
      Check()
          .not_null(a.x, "x")
          .not_null(a.q, "q")
          .not_null(a.scales, "scales")
          .positive(a.t, "T")
          .positive(a.d, "d")
          .that(a.t <= std::numeric_limits<int32_t>::max(),
                "T = " + std::to_string(a.t) + " rows: at most 2^31 - 1 (rows are blockIdx.x)")
          .that(a.d <= limits.max_d,
                "d = " + std::to_string(a.d) +
                    ": this version takes rows of d <= " + std::to_string(limits.max_d))
          .status();
  if (!s.ok()) return s;
  const int64_t x_bytes = 2 * a.t * a.d, q_bytes = a.t * a.d;
  const int64_t scale_bytes = 4 * scale_count(op, a.t, a.d);
  const bool takes_ub = op.granularity == Granularity::kToken && op.code == DType::kE4M3;
  return Check()
      .that(op.granularity != Granularity::kGroup || a.d % kGroup == 0,
            "per_group_fp8: d = " + std::to_string(a.d) +
                " must be a multiple of 128 (1 x 128 groups)")
      .that(takes_ub || !(a.scale_ub > 0.0f),
            std::string(op.name) + " takes no scale_ub (only per_token_fp8 does)")
      .that(op.granularity == Granularity::kGroup || !a.scales_row_major,
            std::string(op.name) + " takes no scales_row_major (only per_group_fp8 does)")
      .aligned(a.x, limits.x_align, "x")
      .aligned(a.q, limits.q_align, "q")
      .aligned(a.scales, 4, "scales")
      .disjoint(a.x, x_bytes, a.q, q_bytes, "x and q")
      .disjoint(a.x, x_bytes, a.scales, scale_bytes, "x and scales")
      .disjoint(a.q, q_bytes, a.scales, scale_bytes, "q and scales")
      .arch_at_least(80)
      .status();
}

// The shape the scales output must have: [T, 1] (or [T]), [1], or [d/128, T] ([T, d/128] when
// row-major).
inline bool scales_shape_ok(const QuantOp& op, const std::vector<int64_t>& shape, int64_t t,
                            int64_t d, bool row_major) {
  switch (op.granularity) {
    case Granularity::kToken:
      return shape == std::vector<int64_t>{t, 1} || shape == std::vector<int64_t>{t};
    case Granularity::kTensor:
      return shape == std::vector<int64_t>{1};
    case Granularity::kGroup:
      return row_major ? shape == std::vector<int64_t>{t, d / kGroup}
                       : shape == std::vector<int64_t>{d / kGroup, t};
  }
  return false;
}
inline const char* scales_shape_text(const QuantOp& op, bool row_major) {
  return op.granularity == Granularity::kToken    ? "[T, 1]"
         : op.granularity == Granularity::kTensor ? "[1]"
         : row_major                              ? "[T, d/128] (scales_row_major)"
                                                  : "[d/128, T]";
}

// kernels_per_launch: what one launch runs (per tensor: reset + two passes, or one kernel).
inline Version quant_version(const QuantOp& op, const char* id, const char* summary,
                             QuantLaunch launch, std::vector<SassFact> sass = {},
                             int kernels_per_launch = 1, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.kernels_per_launch = kernels_per_launch;
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 1 && a.outputs.size() == 2,
                         std::string(op.name) + " takes one input (x) and two outputs (q, scales)")
                   .status();
    if (!s.ok()) return s;
    const TensorRef &x = a.inputs[0], &q = a.outputs[0], &scales = a.outputs[1];
    s = Check()
            .that(x.dtype == DType::kBF16, "x must be bfloat16")
            .that(q.dtype == op.code, std::string("q must be ") + dtype_name(op.code))
            .that(scales.dtype == DType::kF32, "scales must be float32")
            .that(x.shape.size() == 2 && q.shape == x.shape, "x and q must be [T, d]")
            .status();
    if (!s.ok()) return s;
    const int64_t t = x.dim(0), d = x.dim(1);
    const bool row_major = a.param("scales_row_major", 0.0) != 0.0;
    s = Check()
            .that(scales_shape_ok(op, scales.shape, t, d, row_major),
                  std::string(op.name) + ": scales must be " + scales_shape_text(op, row_major))
            .status();
    if (!s.ok()) return s;
    const auto* x_data = static_cast<const __nv_bfloat16*>(x.data);
    auto* scales_data = static_cast<float*>(scales.data);
    const auto scale_ub = static_cast<float>(a.param("scale_ub", 0.0));
    return launch({x_data, q.data, scales_data, t, d, scale_ub, row_major}, stream);
  };
  // 2 B read + 1 B written per element, 4 B per scale.
  v.bytes = [](const Args& a) {
    return double(a.inputs.at(0).bytes() + a.outputs.at(0).bytes() + a.outputs.at(1).bytes());
  };
  v.flops = [](const Args&) { return 0.0; };
  return v;
}

// The chapter's fastest per-token launchers (v2_vec16.cu), for later chapters to chain behind
// their own kernels: the same arguments and checks as the registered versions.
Status per_token_fp8_vec16(const QuantArgs& a, cudaStream_t stream);
Status per_token_int8_vec16(const QuantArgs& a, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Host helpers

inline int round_up_to_warp(int64_t threads) { return int(ceil_div(threads, 32) * 32); }

// How many blocks of `kernel` the whole device holds at once (occupancy × SMs): the grid of a
// grid-stride loop, and the largest grid a cooperative launch accepts.
template <class Kernel>
Status resident_blocks(Kernel kernel, int threads, int* blocks) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
  if (e != cudaSuccess)
    return error(Code::kCudaError, std::string("occupancy query: ") + cudaGetErrorString(e));
  *blocks = sms * per_sm;
  return Check().that(*blocks > 0, "the kernel fits no block on this device").status();
}

// ---------------------------------------------------------------------------------------------
// Device helpers shared by the versions

// The two code formats as policies, so that one kernel template serves both. Every rounding is
// a quant_math.cuh call; codes4 packs four codes into one word, element 0 in the low byte.
struct Fp8 {
  using Code = uint8_t;
  static __device__ __forceinline__ float scale(float absmax, float scale_ub) {
    return fp8_scale(absmax, scale_ub);
  }
  static __device__ __forceinline__ float inverse(float scale) { return fp8_inverse(scale); }
  static __device__ __forceinline__ uint8_t code(float x, float inv) {
    return static_cast<uint8_t>(quantize_e4m3x2(x, 0.0f, inv));  // the low byte is x's code
  }
  static __device__ __forceinline__ uint32_t codes4(float2 a, float2 b, float inv) {
    return uint32_t(quantize_e4m3x2(a.x, a.y, inv)) | uint32_t(quantize_e4m3x2(b.x, b.y, inv))
                                                          << 16;
  }
};
struct Int8 {
  using Code = int8_t;
  // The second argument is per_token_fp8's scale_ub, which the launchers refuse for INT8.
  static __device__ __forceinline__ float scale(float absmax, float) { return int8_scale(absmax); }
  static __device__ __forceinline__ float inverse(float scale) { return int8_inverse(scale); }
  static __device__ __forceinline__ int8_t code(float x, float inv) {
    return quantize_int8(x, inv);
  }
  static __device__ __forceinline__ uint32_t codes4(float2 a, float2 b, float inv) {
    return uint32_t(uint8_t(quantize_int8(a.x, inv))) |
           uint32_t(uint8_t(quantize_int8(a.y, inv))) << 8 |
           uint32_t(uint8_t(quantize_int8(b.x, inv))) << 16 |
           uint32_t(uint8_t(quantize_int8(b.y, inv))) << 24;
  }
};

// Two BF16 in one word (element 0 in the low half) → two FP32, exactly: a BF16 is the top half
// of an FP32, so this is a shift and a mask.
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// max(m, |v|) over the eight BF16 of one 16-byte vector.
__device__ __forceinline__ float absmax8(uint4 v, float m) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = bf16x2_to_float2(words[i]);
    m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  return m;
}

// Eight BF16 (one 16-byte load) → eight codes (one 8-byte store).
template <class Quant>
__device__ __forceinline__ uint2 quantize8(uint4 v, float inv) {
  return make_uint2(Quant::codes4(bf16x2_to_float2(v.x), bf16x2_to_float2(v.y), inv),
                    Quant::codes4(bf16x2_to_float2(v.z), bf16x2_to_float2(v.w), inv));
}

// Max over the block of non-negative values; every thread gets it. red_sh holds one float per
// warp (blockDim.x is a multiple of 32). One __syncthreads: instead of warp 0 reducing the
// partials and broadcasting them through shared memory again, every warp reduces them itself.
// Call it once per kernel: a second call could overwrite partials another warp still reads.
__device__ __forceinline__ float block_max(float v, float* red_sh) {
  const int warp_idx = threadIdx.x / 32, lane_idx = threadIdx.x % 32;
  v = warp_max(v);
  if (lane_idx == 0) red_sh[warp_idx] = v;
  __syncthreads();
  v = lane_idx < int(blockDim.x / 32) ? red_sh[lane_idx] : 0.0f;
  return warp_max(v);
}

// Max over each aligned half-warp (lanes 0-15, 16-31): xor offsets below 16 never cross halves.
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Per tensor, blocks merge their scales in the output word: fp8_scale is monotonic in the
// absmax (an RN division by 448 and a max with MIN_SCALE never reverse an order), so the largest
// block scale is the tensor's scale. Non-negative IEEE floats order like their bits read as
// unsigned integers, so an integer atomicMax on the bits is a float max. The word must start
// below every block's scale (≥ MIN_SCALE): +0, bits 0, set by reset_kernel.
__device__ __forceinline__ void atomic_max_scale(float* scale, float block_scale) {
  atomicMax(reinterpret_cast<unsigned int*>(scale), __float_as_uint(block_scale));
}

template <class T>
__global__ void reset_kernel(T* word) {
  *word = T(0);
}

}  // namespace lkw::quant
