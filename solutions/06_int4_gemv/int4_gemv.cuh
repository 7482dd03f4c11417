// Chapter 06 — int4_gemv: the W4A16 GEMV taken to the bandwidth bound.
//
// y[M, N] = x[M, K] · W_hat[N, K]^T for the decode step of an LLM (1 ≤ M ≤ 16 tokens), x and y
// BF16, FP32 accumulation, the weights packed as in chapter 02 (G ∈ {32, 64, 128} inferred as
// K / scales.shape[1]; K must be a multiple of G, so of 32):
//   int4_gemv      x bf16 [M, K], w uint32 [N, K/8] natural nibble order, scales bf16 [N, K/G]:
//                  W_hat = s·(q − 8)
//   int4i_gemv     the same weights in the interleaved order of the magic unpack (chapter 02)
//   int4i_zp_gemv  + zero points uint32 [N, K/G/8] (4 bits, natural order along the groups,
//                  K/G a multiple of 8): W_hat = q·s − zs with zs = bf16(z·s), rounded once per
//                  group — chapter 02's contract
//   int4t_gemv     int4i_gemv's words stored tiled, in the order v7 reads them: uint32
//                  [⌈N/16⌉·16, ⌈K/256⌉·32] holding [tile of 16 rows][step of 256 k][row][32 words]
//                  (tiled_word), the padding of both ends unread or multiplied by zero; scales as
//                  int4i_gemv. lkw.gemv.tile_weights repacks int4i_gemv's words.
//   bf16_gemv      x bf16 [M, K], W bf16 [N, K]: the cuBLAS peer, the bytes INT4 saves
// Bytes (the roofline minimum): N·K/2 weights + N·K/G·2 scales (+ N·K/G/2 zero points) + M·K·2
// + M·N·2. At M = 1 the weights are everything: 28672 × 8192 is 117 MB, 28 µs at 4.17 TB/s.
// FLOPs 2·M·N·K: at M = 16 that is 64 FLOP per weight byte, far below the tensor-core ridge but
// far above what the CUDA cores can issue beside the unpack (v2 vs v3).
//
// The teaching path (one file per version; the book says what each step gains):
//   v0_warp_per_column  a warp per output column, shift + I2F, FP32 FMA, warp-shuffle sum
//   v1_lop3_magic       chapter 02's magic unpack: no I2F
//   v2_vec16_rows       16-byte weight loads, two rows per warp, loads in flight before use
//   v3_mma_split_k      the tensor cores (mma m16n8k16, weights as A), a cp.async ring, split-K
//   v4_persistent_smem_x  one block per SM, x staged once in shared memory, the −8 folded out
//   v5_balanced_steps   a block's steps shared evenly over its warps
//   v6_pipelined        a two-stage ring, the whole row of x, a dependent launch, Σx on the mma
//   v7_tiled_stream     tiled weights, consecutive tiles, whole 128-byte lines, evict_first
// Shared pieces: gemv_plan.h (host scheduling), mma_tile.cuh (A operand, split-K store),
// persistent.cuh (v4 to v7's stages), lkw/ptx.cuh (the PTX wrappers).
//
// The reference and its tolerance: reference/lkw/gemv.py.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lkw/registry.h"

namespace lkw::gemv {

constexpr const char* kChapter = "06_int4_gemv";
constexpr int kMaxM = 16;  // decode batch sizes this chapter is built for

struct GemvOp {
  const char* name;
  bool zero_points;
  bool tiled = false;  // the weights in the tiled layout (int4t_gemv)
};
constexpr GemvOp kInt4Gemv{"int4_gemv", false};
constexpr GemvOp kInt4iGemv{"int4i_gemv", false};
constexpr GemvOp kInt4iZpGemv{"int4i_zp_gemv", true};
constexpr GemvOp kInt4tGemv{"int4t_gemv", false, true};

// The tiled layout of int4t_gemv: tiles of 16 rows, steps of 256 k (32 words of a row), so that
// the 16 rows × 128 bytes a warp of v7 reads at one step lie in 2 KB of contiguous memory
// instead of 16 places K/2 bytes apart. Word j of row r (interleaved nibbles, as int4i_gemv) is
// stored at tiled_word(r, j); N and K are padded up to whole tiles and steps.
constexpr int64_t kTiledRows = 16, kTiledStepWords = 32;
constexpr int64_t tiled_rows(int64_t n) { return (n + kTiledRows - 1) / kTiledRows * kTiledRows; }
constexpr int64_t tiled_row_words(int64_t k) { return (k / 8 + kTiledStepWords - 1) / kTiledStepWords * kTiledStepWords; }
constexpr int64_t tiled_word(int64_t r, int64_t j, int64_t k) {
  return ((r / kTiledRows * (tiled_row_words(k) / kTiledStepWords) + j / kTiledStepWords) * kTiledRows + r % kTiledRows) *
             kTiledStepWords +
         j % kTiledStepWords;
}
// The bytes of w as stored: [N, K/8] words, or the tiled layout's padded [⌈N/16⌉·16, ⌈K/256⌉·32].
inline int64_t weight_bytes(const GemvOp& op, int64_t n, int64_t k) {
  return op.tiled ? tiled_rows(n) * tiled_row_words(k) * 4 : n * k / 2;
}

// Everything a GEMV launcher gets: raw device pointers and sizes.
struct GemvArgs {
  const __nv_bfloat16* x;       // [M, K]
  const uint32_t* w;            // [N, K/8]
  const __nv_bfloat16* scales;  // [N, K/G]
  const uint32_t* zeros;        // [N, K/G/8], or null
  __nv_bfloat16* y;             // [M, N]
  int64_t m, n, k;
  int group;
};

using GemvLaunch = Status (*)(const GemvArgs& a, cudaStream_t stream);

// Checks shared by every launcher; `w_align` is the width of its weight loads (4 or 16 bytes).
// x is read 16 bytes (8 elements) at a time by every version, so its rows must start aligned:
// K is a multiple of 32 (a multiple of G) and the base pointer 16-byte aligned.
inline Status validate_gemv(const GemvOp& op, const GemvArgs& a, int w_align) {
  const int64_t groups = a.group > 0 ? a.k / a.group : 0;
  return Check()
      .not_null(a.x, "x")
      .not_null(a.w, "w")
      .not_null(a.scales, "scales")
      .not_null(a.y, "y")
      .that(!op.zero_points || a.zeros != nullptr, "zero points are required")
      .that(a.m >= 1 && a.m <= kMaxM,
            "M must be in 1.." + std::to_string(kMaxM) + " (got " + std::to_string(a.m) + ")")
      .positive(a.n, "N")
      .positive(a.k, "K")
      .that(a.n < (int64_t(1) << 31) && a.k < (int64_t(1) << 31), "N and K must fit int32")
      .that(a.group == 32 || a.group == 64 || a.group == 128,
            "group size must be 32, 64 or 128 (got " + std::to_string(a.group) + ")")
      .multiple_of(a.k, a.group, "K")
      .that(!op.zero_points || groups % 8 == 0,
            "zero points need K/G to be a multiple of 8 (they are packed 8 to a word)")
      .aligned(a.x, 16, "x")
      .aligned(a.w, w_align, "w")
      .aligned(a.scales, 2, "scales")
      .aligned(a.zeros, 4, "zeros")
      .aligned(a.y, 2, "y")
      .disjoint(a.y, 2 * a.m * a.n, a.x, 2 * a.m * a.k, "y and x")
      .disjoint(a.y, 2 * a.m * a.n, a.w, weight_bytes(op, a.n, a.k), "y and w")
      .disjoint(a.y, 2 * a.m * a.n, a.scales, 2 * a.n * groups, "y and scales")
      .arch_at_least(80)
      .status();
}

inline int log2_of(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

// The registry entry of a GEMV version: checks the generic Args (inputs x, w, scales [, zeros];
// output y) and maps them onto the raw-pointer launcher.
inline Version gemv_version(const GemvOp& op, const char* id, const char* summary,
                            GemvLaunch launch, std::vector<SassFact> sass = {},
                            Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  const size_t n_inputs = op.zero_points ? 4 : 3;
  v.launch = [op, launch, n_inputs](const Args& a, cudaStream_t s) -> Status {
    Status st = Check()
                    .that(a.inputs.size() == n_inputs && a.outputs.size() == 1,
                          std::string(op.name) + " takes " + std::to_string(n_inputs) +
                              " inputs (x, w, scales" + (op.zero_points ? ", zeros" : "") +
                              ") and one output (y)")
                    .status();
    if (!st.ok()) return st;
    const TensorRef &x = a.inputs[0], &w = a.inputs[1], &sc = a.inputs[2], &y = a.outputs[0];
    st = Check()
             .that(x.dtype == DType::kBF16 && sc.dtype == DType::kBF16 && y.dtype == DType::kBF16,
                   "x, scales and y must be bfloat16")
             .that(w.dtype == DType::kU32, "w must be uint32 words")
             .that(x.shape.size() == 2 && w.shape.size() == 2 && sc.shape.size() == 2 &&
                       y.shape.size() == 2,
                   "x, w, scales and y are matrices")
             .status();
    if (!st.ok()) return st;
    // N: w's rows, or (tiled, padded to whole tiles) the scales'.
    const int64_t m = x.dim(0), k = x.dim(1), n = op.tiled ? sc.dim(0) : w.dim(0);
    st = Check()
             .that(op.tiled || w.dim(1) * 8 == k, "w must be [N, K/8] words")
             .that(!op.tiled || (w.dim(0) == tiled_rows(n) && w.dim(1) == tiled_row_words(k)),
                   "w must be tiled [ceil(N/16)*16, ceil(K/256)*32] words (N from the scales)")
             .that(y.dim(0) == m && y.dim(1) == n,
                   std::string("y must be [M, N]") +
                       (op.tiled ? ", N the scales' rows (" + std::to_string(n) + ")" : ""))
             .that(sc.dim(0) == n && sc.dim(1) > 0 && k % sc.dim(1) == 0,
                   "scales must be [N, K/G]")
             .status();
    if (!st.ok()) return st;
    const uint32_t* zeros = nullptr;
    if (op.zero_points) {
      const TensorRef& z = a.inputs[3];
      st = Check()
               .that(z.dtype == DType::kU32 && z.shape.size() == 2, "zero points are uint32 words")
               .that(z.dim(0) == n && z.dim(1) * 8 == sc.dim(1), "zero points must be [N, K/G/8]")
               .status();
      if (!st.ok()) return st;
      zeros = static_cast<const uint32_t*>(z.data);
    }
    const GemvArgs args{static_cast<const __nv_bfloat16*>(x.data),
                        static_cast<const uint32_t*>(w.data),
                        static_cast<const __nv_bfloat16*>(sc.data),
                        zeros,
                        static_cast<__nv_bfloat16*>(y.data),
                        m,
                        n,
                        k,
                        int(k / sc.dim(1))};
    return launch(args, s);
  };
  // The model's bytes: every tensor once, the weights as N·K/2 (the tiled layout's padding is
  // either never read or, in a last partial step, read but not counted: the roofline minimum).
  v.bytes = [](const Args& a) {
    double b = 0;
    for (size_t i = 0; i < a.inputs.size(); ++i)
      b += i == 1 ? a.inputs[2].dim(0) * a.inputs[0].dim(1) / 2.0 : a.inputs[i].bytes();
    return b + a.outputs.at(0).bytes();
  };
  v.flops = [](const Args& a) {
    return 2.0 * a.inputs.at(0).dim(0) * a.inputs.at(2).dim(0) * a.inputs.at(0).dim(1);  // 2·M·N·K
  };
  return v;
}

// ---------------------------------------------------------------------------------------------
// Register helpers shared by the versions.

// BF16 → FP32 is a bit move: a BF16 is the top half of the FP32 with the same value. Written out
// (not __bfloat162float) so the SASS shows what it is: one shift or one mask, never a convert.
__device__ __forceinline__ float bf16_lo_to_f32(uint32_t pair) {
  return __uint_as_float(pair << 16);
}
__device__ __forceinline__ float bf16_hi_to_f32(uint32_t pair) {
  return __uint_as_float(pair & 0xffff0000u);
}
__device__ __forceinline__ float bf16_to_f32(__nv_bfloat16 v) {
  return __uint_as_float(uint32_t(__bfloat16_as_ushort(v)) << 16);
}

__device__ __forceinline__ uint32_t bits_of(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The sum of v over the 32 lanes of a warp, in every lane (five butterfly steps).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace lkw::gemv
