// Chapter 07 — w4a16_gemm: the W4A16 product on the tensor cores, from decode to prefill.
//
// y[M, N] = x[M, K] · W_hat[N, K]^T, x and y BF16, FP32 accumulation, W_hat = s·(q − z) with
// 4-bit q and BF16 scales per group of G input channels (G ∈ {32, 64, 128}, or G = K: one scale
// per output channel). M runs from 1 (decode) to thousands (prefill).
// Zero points (GPTQ/AWQ's asymmetric contract) are an optional fourth input, uint8 [K/G, N], one
// 4-bit z per byte, the scales' shape (lkw.w4a16.from_gptq / from_awq unpack the checkpoints' words
// into it, offline like the repack): absent, z = 8 (symmetric). Every version folds z into the
// magic unpack's bias: 0x4300 | q is 128 + q, and subtracting 0x4300 | z (128 + z) instead of
// 136 leaves q − z exactly: no extra instruction per weight, one rounding (the scale's multiply).
//   w4a16_gemm   w uint32 [N, K/8] in the natural nibble order (chapter 02), scales bf16 [K/G, N]
//   w4a16r_gemm  the same weights repacked offline (lkw.w4a16.repack): uint32 [N/64, 8·K], for
//                each block of 64 output channels and step of 16 k, 32 lanes × 4 words; word w of
//                lane l holds the mma B fragments of n8-tiles 2w and 2w + 1 in the interleaved
//                nibble order of the magic unpack. One 16-byte read is a lane's B for 64 channels.
// Scales are group-major ([K/G, N], as GPTQ ships them): a k-step's scales are one contiguous row.
// Requirements (refused otherwise): N a multiple of 64, K a multiple of 32 and of G, any M ≥ 1.
// Bytes (the roofline minimum): N·K/2 + N·K/G·2 + M·K·2 + M·N·2. FLOPs 2·M·N·K. The ridge of the
// H200 (BF16 mma over the copy ceiling) is near 160 FLOP per byte; INT4 weights give 4·M FLOP per
// weight byte, so the product turns compute-bound near M = 40 (the book derives it).
//
// The teaching path (one file per version; the book says what each step gains):
//   v0_dequant_cublas   dequantize to a BF16 copy in HBM (4.5 bytes per weight, not 0.5), then cuBLAS
//   v1_mma_global       mma.sync m16n8k16, x and the weights read from global into fragments
//   v2_cp_async_ldmatrix  tiles through shared memory: a cp.async ring of stages, ldmatrix for x
//   v3_repacked_lop3    the offline repack: one 16-byte shared read per lane is its B fragment,
//                       the lop3 magic unpack of chapter 02
//   v4_scales_in_shared the group scales (and zero points) staged beside the words, once a stage
//   v5_split_k          K split over blocks where the tiles leave SMs idle; the last one sums
//   v6_wgmma            Hopper: the unpacked weights as wgmma's register operand, x by TMA,
//                       full/empty mbarriers; v5's split and a 16-token tile at small M
//   v7_gemv_small_m     M ≤ 16 without the tensor cores: the repacked words streamed as a GEMV
//   v8_group_scales     wgmma on unscaled (q − z), each group's sum scaled once; a loading warp
//   v9_warp_specialized prefill: a producer warpgroup; two consumers with 256-token tiles unpack
//                       the next stage under this one's wgmmas (setmaxnreg)
// The reference and its tolerance: reference/lkw/w4a16.py.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "02_int4_dequant/dequant.cuh"
#include "lkw/registry.h"

namespace lkw::w4a16 {

constexpr const char* kChapter = "07_w4a16_gemm";

struct GemmOp {
  const char* name;
  bool repacked;  // w in the fragment-ordered layout (w4a16r_gemm)
};
constexpr GemmOp kW4a16Gemm{"w4a16_gemm", false};
constexpr GemmOp kW4a16rGemm{"w4a16r_gemm", true};

// The tiles every tensor-core version shares: a block of 4 warps covers 256 output channels (a
// warp 64: eight n8-tiles, one 16-byte repacked read per k-step) and BM = 16·kMTiles tokens.
constexpr int kWarps = 4;
constexpr int kWarpN = 64;
constexpr int kBlockN = kWarps * kWarpN;
constexpr int kNTiles = kWarpN / 8;  // n8-tiles of a warp

struct GemmArgs {
  const __nv_bfloat16* x;       // [M, K]
  const uint32_t* w;            // [N, K/8] natural, or [N/64, 8K] repacked
  const __nv_bfloat16* scales;  // [K/G, N]
  const uint8_t* zeros;         // [K/G, N] zero points 0..15, or nullptr: z = 8
  __nv_bfloat16* y;             // [M, N]
  int64_t m, n, k;
  int64_t group;
};

using GemmLaunch = Status (*)(const GemmArgs& a, cudaStream_t stream);

// Checks shared by every launcher. x, w, scales and zeros are read 16 bytes at a time (cp.async,
// TMA), y is written in pairs: the base pointers are 16-byte aligned, and the shapes keep every
// row so. The zero points' values (0..15) live on the device and are the caller's contract.
inline Status validate_gemm(const GemmOp& op, const GemmArgs& a) {
  return Check()
      .not_null(a.x, "x")
      .not_null(a.w, "w")
      .not_null(a.scales, "scales")
      .not_null(a.y, "y")
      .that(a.m >= 1, "M must be at least 1 (got " + std::to_string(a.m) + ")")
      .positive(a.n, "N")
      .positive(a.k, "K")
      .that(a.m < (int64_t(1) << 31) && a.n < (int64_t(1) << 31) && a.k < (int64_t(1) << 31),
            "M, N and K must fit int32")
      .multiple_of(a.n, 64, "N")
      .multiple_of(a.k, 32, "K")
      .that(a.group == 32 || a.group == 64 || a.group == 128 || a.group == a.k,
            "group size must be 32, 64, 128 or K (got " + std::to_string(a.group) + ")")
      .multiple_of(a.k, a.group, "K")
      .aligned(a.x, 16, "x")
      .aligned(a.w, 16, "w")
      .aligned(a.scales, 16, "scales")
      .aligned(a.y, 16, "y")
      .aligned(a.zeros, 16, "zeros")
      .disjoint(a.y, 2 * a.m * a.n, a.x, 2 * a.m * a.k, "y and x")
      .disjoint(a.y, 2 * a.m * a.n, a.w, a.n * a.k / 2, "y and w")
      .disjoint(a.y, 2 * a.m * a.n, a.scales, 2 * a.n * (a.k / a.group), "y and scales")
      .disjoint(a.y, 2 * a.m * a.n, a.zeros, a.zeros ? a.n * (a.k / a.group) : 0, "y and zeros")
      .arch_at_least(80)
      .status();
}

// The registry entry of a version: checks the generic Args (inputs x, w, scales and optionally
// zeros; output y) and maps them onto the raw-pointer launcher.
inline Version gemm_version(const GemmOp& op, const char* id, const char* summary, GemmLaunch launch,
                            std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion,
                            int kernels_per_launch = 1) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.kernels_per_launch = kernels_per_launch;
  v.launch = [op, launch](const Args& a, cudaStream_t s) -> Status {
    Status st = Check()
                    .that((a.inputs.size() == 3 || a.inputs.size() == 4) && a.outputs.size() == 1,
                          std::string(op.name) +
                              " takes 3 or 4 inputs (x, w, scales[, zeros]) and one output (y)")
                    .status();
    if (!st.ok()) return st;
    const TensorRef &x = a.inputs[0], &w = a.inputs[1], &sc = a.inputs[2], &y = a.outputs[0];
    const TensorRef* z = a.inputs.size() == 4 ? &a.inputs[3] : nullptr;  // zero points
    st = Check()
             .that(x.dtype == DType::kBF16 && sc.dtype == DType::kBF16 && y.dtype == DType::kBF16,
                   "x, scales and y must be bfloat16")
             .that(w.dtype == DType::kU32, "w must be uint32 words")
             .that(x.shape.size() == 2 && w.shape.size() == 2 && sc.shape.size() == 2 &&
                       y.shape.size() == 2,
                   "x, w, scales and y are matrices")
             .that(!z || z->data != nullptr, "zeros is a null pointer")
             .that(!z || z->dtype == DType::kU8, "zeros must be uint8 (a 4-bit zero point a byte)")
             .that(!z || z->shape == sc.shape, "zeros must be [K/G, N], the scales' shape")
             .status();
    if (!st.ok()) return st;
    const int64_t m = x.dim(0), k = x.dim(1), n = sc.dim(1);
    st = Check()
             .that(op.repacked || (w.dim(0) == n && w.dim(1) * 8 == k), "w must be [N, K/8] words")
             .that(!op.repacked || (w.dim(0) * 64 == n && w.dim(1) == 8 * k),
                   "w must be repacked [N/64, 8K] words (N from the scales, K from x)")
             .that(y.dim(0) == m && y.dim(1) == n, "y must be [M, N]")
             .that(sc.dim(0) > 0 && k % sc.dim(0) == 0, "scales must be [K/G, N]")
             .status();
    if (!st.ok()) return st;
    const GemmArgs args{static_cast<const __nv_bfloat16*>(x.data),
                        static_cast<const uint32_t*>(w.data),
                        static_cast<const __nv_bfloat16*>(sc.data),
                        z ? static_cast<const uint8_t*>(z->data) : nullptr,
                        static_cast<__nv_bfloat16*>(y.data),
                        m, n, k, k / sc.dim(0)};
    return launch(args, s);
  };
  v.bytes = [](const Args& a) {  // every tensor once (zero points too): the roofline minimum
    double b = a.outputs.at(0).bytes();
    for (const TensorRef& t : a.inputs) b += t.bytes();
    return b;
  };
  v.flops = [](const Args& a) {
    return 2.0 * a.inputs.at(0).dim(0) * a.inputs.at(2).dim(1) * a.inputs.at(0).dim(1);  // 2·M·N·K
  };
  return v;
}

// k >> group_shift is k's group: log2(G), or 31 for one group (G = K, per channel; K < 2^31). A
// shift, because a 64-bit division by a run-time G costs a convert-and-iterate sequence per use.
inline int group_shift_of(int64_t group, int64_t k) {
  if (group == k) return 31;
  int s = 0;
  while ((int64_t(1) << s) < group) ++s;
  return s;
}

// How many m16 tiles a block takes: the fewest that cover M, up to 4 (BM = 64). Small M wastes no
// mma rows on padding; large M reuses each unpacked weight fragment 4 times.
inline int m_tiles_for(int64_t m) { return m <= 16 ? 1 : m <= 32 ? 2 : 4; }

// ---------------------------------------------------------------------------------------------
// Register helpers shared by the versions.

__device__ __forceinline__ uint32_t bits_of(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }
__device__ __forceinline__ __nv_bfloat162 bf162_of(uint32_t u) { return *reinterpret_cast<const __nv_bfloat162*>(&u); }

// The bias of the magic unpack for zero point z, as a BF16 pair: 0x4300 | z reads as 128 + z
// (exact for z < 128), so (0x4300 | q) − (0x4300 | z) = q − z exactly. z = 8 gives 136 (0x4308),
// chapter 02's symmetric constant: without zero points the result is bit-identical.
constexpr uint32_t kBias8 = 0x43084308u;
__host__ __device__ __forceinline__ uint32_t zero_bias(uint32_t z) {
  return 0x43004300u | (z * 0x10001u);
}

// The bias of group `group` for output channel n: from the zero points [K/G, N], or z = 8.
__device__ __forceinline__ uint32_t zero_bias_at(const uint8_t* zeros, int64_t group, int64_t n,
                                                 int64_t n_total) {
  return zeros ? zero_bias(zeros[group * n_total + n]) : kBias8;  // (K/G, N)
}

// The bias of channel c of a zero-point row already staged in shared memory, or z = 8 where the
// row pointer is null (no zero points).
__device__ __forceinline__ uint32_t zero_bias_of(const uint8_t* z_row, int c) {
  return z_row ? zero_bias(z_row[c]) : kBias8;
}

// Two natural-order nibbles (bits 0..3 and 4..7 of `byte`) as the BF16 pair (q0 − z, q1 − z):
// each nibble goes into the mantissa of 128.0 (0x4300 | q = 128 + q, exact), one packed subtract
// of the bias (128 + z) leaves q − z. Chapter 02's magic, one pair at a time: no integer→float
// convert.
__device__ __forceinline__ __nv_bfloat162 nibble_pair_minus_zero(uint32_t byte, uint32_t bias) {
  const uint32_t pair = (byte & 0xfu) | ((byte & 0xf0u) << 12) | 0x43004300u;
  return __hsub2(bf162_of(pair), bf162_of(bias));
}

// A repacked word (eight interleaved nibbles: pairs 0, 1 of channel n_a, pairs 2, 3 of n_a + 8)
// as four (q − z) pairs: chapter 02's u4_to_bf16_magic with the biases of the two channels in
// place of its constant 136. One LOP3 and one HSUB2 a pair, as there.
__device__ __forceinline__ void unpack_minus_zero(uint32_t word, uint32_t bias_a, uint32_t bias_b,
                                                  __nv_bfloat162 (&q)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    q[i] = __hsub2(bf162_of(int4::lop3<int4::kAndOr>(word, 0x000f000fu, 0x43004300u)),
                   bf162_of(i < 2 ? bias_a : bias_b));
    word >>= 4;
  }
}

// The scale of group `group` for output channel n, as a BF16 pair (both halves the same).
__device__ __forceinline__ __nv_bfloat162 scale_pair(const __nv_bfloat16* scales, int64_t group, int64_t n,
                                                     int64_t n_total) {
  return __bfloat162bfloat162(scales[group * n_total + n]);  // (K/G, N)
}

// One m16n8 accumulator tile to y: c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g + 8. Rows past
// M are dropped; N is a multiple of 64, so both columns of a pair exist.
__device__ __forceinline__ void store_c(__nv_bfloat16* y, const float (&c)[4], int64_t row0, int64_t col,
                                        int64_t m, int64_t n) {
  if (row0 < m)
    *reinterpret_cast<__nv_bfloat162*>(y + row0 * n + col) = __floats2bfloat162_rn(c[0], c[1]);  // (M, N)
  if (row0 + 8 < m)
    *reinterpret_cast<__nv_bfloat162*>(y + (row0 + 8) * n + col) = __floats2bfloat162_rn(c[2], c[3]);
}

// Runs `launch_for<kMTiles>` with the m16-tile count M asks for (m_tiles_for).
template <template <int> class Launch>
Status launch_by_m(const GemmArgs& a, cudaStream_t stream) {
  switch (m_tiles_for(a.m)) {
    case 1: return Launch<1>::run(a, stream);
    case 2: return Launch<2>::run(a, stream);
    default: return Launch<4>::run(a, stream);
  }
}

}  // namespace lkw::w4a16
