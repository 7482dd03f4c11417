// Chapter 08 — fp8_gemm: W8A8 FP8 on Hopper, from mma.sync to a warp-specialized blockwise wgmma.
//
// y[M, N] BF16 = (A[M, K] · s_a) (B[N, K] · s_b)^T with A and B in E4M3, FP32 accumulation. Both
// operands K-major (FP8 wgmma reads no other layout: "TN", as cuBLASLt's FP8 path). Two ops, by
// where the scales act: fp8_gemm (tensor or rowwise scales, which leave the sum: every version)
// and fp8_gemm_blockwise (v4 on). The scales' shapes name the granularity (lkw.fp8_gemm):
//   tensor     s_a [1], s_b [1]                 applied in the epilogue
//   rowwise    s_a [M, 1] per token, s_b [N, 1] per output channel: in the epilogue
//   blockwise  s_a [K/128, M] (1 × 128 groups, column-major as chapter 03's per_group_fp8 writes
//              them; [M, K/128] with the param a_scales_row_major = 1), s_b [ceil(N/128), K/128]
//              (128 × 128 blocks): they depend on k, so each 128-wide K block's sum is scaled
//              and promoted into a second FP32 accumulator inside the K loop (v4).
// Requirements (refused otherwise): M ≥ 1, N and K multiples of 16 (cuBLASLt's FP8 rule: 16-byte
// rows), blockwise K a multiple of 128. Tails of M, N and K inside a tile are zero-filled reads
// and masked stores. Bytes: M·K + N·K + scales + 2·M·N; FLOPs 2·M·N·K.
//
// The teaching path (one file per version; the book says what each step gains):
//   v0_mma_sync        mma.sync m16n8k32 e4m3 (sm_89's FP8 instruction), cp.async and ldmatrix
//   v1_wgmma           Hopper's warpgroup MMA reading both operands from swizzled shared memory
//   v2_tma_pipeline    TMA boxes and an mbarrier ring instead of cp.async
//   v3_warp_specialized  a producer warpgroup (one thread issues), two consumer warpgroups,
//                      setmaxnreg, persistent tiles
//   v4_blockwise       DeepSeek's 1 × 128 / 128 × 128 scales, promoted every K block
//   v5_tuned           split K where the tiles cannot fill the SMs, tiles in L2 bands
//   v6_small_m         M <= 16: B streamed through mma.sync, the tokens the mma's narrow side
//   v7_swap_ab         M <= 64: v5's ring with B's rows on wgmma's 64-row side, the tokens its N
// The reference, its error bound and the accumulation model: reference/lkw/fp8_gemm.py.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "lkw/registry.h"
#include "lkw/tma.h"

namespace lkw::fp8 {

constexpr const char* kChapter = "08_fp8_gemm";
constexpr const char* kOp = "fp8_gemm";
constexpr const char* kBlockwiseOp = "fp8_gemm_blockwise";
constexpr int kScaleBlock = 128;  // blockwise: A's groups and B's blocks along K, B's along N

enum class Granularity { kTensor, kRowwise, kBlockwise };

inline const char* granularity_name(Granularity g) {
  return g == Granularity::kTensor ? "tensor" : g == Granularity::kRowwise ? "rowwise" : "blockwise";
}

struct GemmArgs {
  const uint8_t* a;   // [M, K] E4M3
  const uint8_t* b;   // [N, K] E4M3
  const float* s_a;   // tensor [1], rowwise [M], blockwise [K/128, M] (or [M, K/128])
  const float* s_b;   // tensor [1], rowwise [N], blockwise [ceil(N/128), K/128]
  __nv_bfloat16* y;   // [M, N]
  int64_t m, n, k;
  Granularity granularity;
  bool a_scales_row_major;  // blockwise only
  int max_blocks;           // persistent versions: at most this many blocks (0: one per SM)
};

using GemmLaunch = Status (*)(const GemmArgs& a, cudaStream_t stream);

// v5_tuned's launcher, which v6 and v7 hand every M above theirs to (defined in v5_tuned.cu).
Status gemm_v5_tuned(const GemmArgs& a, cudaStream_t stream);

inline int64_t scale_a_count(const GemmArgs& a) {
  return a.granularity == Granularity::kTensor ? 1
         : a.granularity == Granularity::kRowwise ? a.m
                                                  : a.m * (a.k / kScaleBlock);
}
inline int64_t scale_b_count(const GemmArgs& a) {
  return a.granularity == Granularity::kTensor ? 1
         : a.granularity == Granularity::kRowwise
             ? a.n
             : (a.n + kScaleBlock - 1) / kScaleBlock * (a.k / kScaleBlock);
}

// Checks shared by every launcher: A, B and y are read and written in 16-byte pieces (cp.async,
// TMA rows) and pairs, so the bases are 16-byte aligned and every row a whole number of them.
// `takes` lists the granularities the version handles: blockwise scales change inside the K
// loop, which v0 to v3 do not do (they scale in the epilogue), so they refuse them by name.
inline Status validate_gemm(const GemmArgs& a, std::initializer_list<Granularity> takes,
                            int min_arch, const char* version) {
  bool taken = false;
  for (Granularity g : takes) taken |= g == a.granularity;
  const int64_t kb = a.k / kScaleBlock;
  return Check()
      .not_null(a.a, "A")
      .not_null(a.b, "B")
      .not_null(a.s_a, "s_a")
      .not_null(a.s_b, "s_b")
      .not_null(a.y, "y")
      .that(a.m >= 1, "M must be at least 1 (got " + std::to_string(a.m) + ")")
      .positive(a.n, "N")
      .positive(a.k, "K")
      .that(a.m < (int64_t(1) << 31) && a.n < (int64_t(1) << 31) && a.k < (int64_t(1) << 31),
            "M, N and K must fit int32")
      .that(a.m <= int64_t(65535) * 128,
            "M must be at most 65535 · 128 (the non-persistent versions' tile rows are grid.y)")
      .multiple_of(a.n, 16, "N")
      .multiple_of(a.k, 16, "K")
      .that(a.granularity != Granularity::kBlockwise || a.k % kScaleBlock == 0,
            "blockwise scales need K a multiple of 128 (got " + std::to_string(a.k) + ")")
      .that(taken, std::string(version) + " does not take " + granularity_name(a.granularity) +
                       " scales (blockwise scales change inside the K loop: v4_blockwise)")
      .aligned(a.a, 16, "A")
      .aligned(a.b, 16, "B")
      .aligned(a.y, 16, "y")
      .aligned(a.s_a, 4, "s_a")
      .aligned(a.s_b, 4, "s_b")
      .disjoint(a.y, 2 * a.m * a.n, a.a, a.m * a.k, "y and A")
      .disjoint(a.y, 2 * a.m * a.n, a.b, a.n * a.k, "y and B")
      .disjoint(a.y, 2 * a.m * a.n, a.s_a, 4 * scale_a_count(a), "y and s_a")
      .disjoint(a.y, 2 * a.m * a.n, a.s_b, 4 * scale_b_count(a), "y and s_b")
      .that(a.granularity != Granularity::kBlockwise || kb * a.m < (int64_t(1) << 31),
            "blockwise: M·K/128 scales must fit int32")
      .that(a.max_blocks >= 0, "max_blocks must be >= 0 (0: one block per SM)")
      .arch_at_least(min_arch)
      .status();
}

// The granularity the scale shapes name (see the header), or an error that says what was given.
inline Status granularity_of(const TensorRef& sa, const TensorRef& sb, int64_t m, int64_t n,
                             int64_t k, bool row_major, Granularity* g) {
  auto is = [](const TensorRef& t, std::vector<int64_t> shape) { return t.shape == shape; };
  const int64_t kb = k / kScaleBlock, nb = (n + kScaleBlock - 1) / kScaleBlock;
  if (is(sa, {1}) && is(sb, {1})) {
    *g = Granularity::kTensor;
  } else if (is(sa, {m, 1}) && is(sb, {n, 1})) {
    *g = Granularity::kRowwise;
  } else if (k % kScaleBlock == 0 && (row_major ? is(sa, {m, kb}) : is(sa, {kb, m})) &&
             is(sb, {nb, kb})) {
    *g = Granularity::kBlockwise;
  } else {
    return error(Code::kInvalidArgument,
                 "fp8_gemm: scales s_a " + shape_text(sa.shape) + " and s_b " +
                     shape_text(sb.shape) +
                     " name no granularity: tensor [1], [1]; rowwise [M, 1], [N, 1]; blockwise "
                     "[K/128, M] (or [M, K/128] with a_scales_row_major), [ceil(N/128), K/128]");
  }
  return {};
}

// The registry entry of a version for one op (kOp or kBlockwiseOp): inputs A, B (float8_e4m3fn),
// s_a, s_b (float32), output y (bfloat16); the params a_scales_row_major (blockwise) and
// max_blocks (a test's knob: fewer persistent blocks than SMs, so that each walks several tiles).
inline Version gemm_version(const char* op, const char* id, const char* summary, GemmLaunch launch,
                            int min_arch, std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op, id, summary, kind, std::move(sass));
  v.min_arch = min_arch;
  const bool blockwise_op = std::string(op) == kBlockwiseOp;
  v.launch = [launch, blockwise_op](const Args& a, cudaStream_t s) -> Status {
    Status st = Check()
                    .that(a.inputs.size() == 4 && a.outputs.size() == 1,
                          "fp8_gemm takes 4 inputs (A, B, s_a, s_b) and one output (y)")
                    .status();
    if (!st.ok()) return st;
    const TensorRef &ta = a.inputs[0], &tb = a.inputs[1], &sa = a.inputs[2], &sb = a.inputs[3];
    const TensorRef& ty = a.outputs[0];
    st = Check()
             .that(ta.dtype == DType::kE4M3 && tb.dtype == DType::kE4M3, "A and B must be float8_e4m3fn")
             .that(sa.dtype == DType::kF32 && sb.dtype == DType::kF32, "s_a and s_b must be float32")
             .that(ty.dtype == DType::kBF16, "y must be bfloat16")
             .that(ta.shape.size() == 2 && tb.shape.size() == 2 && ty.shape.size() == 2,
                   "A, B and y are matrices")
             .status();
    if (!st.ok()) return st;
    const int64_t m = ta.dim(0), k = ta.dim(1), n = tb.dim(0);
    st = Check()
             .that(tb.dim(1) == k, "A [M, K] and B [N, K] must agree on K")
             .that(ty.dim(0) == m && ty.dim(1) == n, "y must be [M, N]")
             .status();
    if (!st.ok()) return st;
    GemmArgs args{static_cast<const uint8_t*>(ta.data), static_cast<const uint8_t*>(tb.data),
                  static_cast<const float*>(sa.data),   static_cast<const float*>(sb.data),
                  static_cast<__nv_bfloat16*>(ty.data), m, n, k, Granularity::kTensor,
                  a.param("a_scales_row_major", 0) != 0, int(a.param("max_blocks", 0))};
    st = granularity_of(sa, sb, m, n, k, args.a_scales_row_major, &args.granularity);
    if (!st.ok()) return st;
    if (blockwise_op != (args.granularity == Granularity::kBlockwise))
      return error(Code::kInvalidArgument,
                   blockwise_op ? "fp8_gemm_blockwise takes blockwise scales: s_a [K/128, M] (or [M, K/128]), "
                                  "s_b [ceil(N/128), K/128]"
                                : "fp8_gemm takes tensor or rowwise scales (blockwise ones: fp8_gemm_blockwise)");
    return launch(args, s);
  };
  v.bytes = [](const Args& a) {  // every tensor once: the roofline minimum
    double b = a.outputs.at(0).bytes();
    for (const TensorRef& t : a.inputs) b += t.bytes();
    return b;
  };
  v.flops = [](const Args& a) {
    return 2.0 * a.inputs.at(0).dim(0) * a.inputs.at(1).dim(0) * a.inputs.at(0).dim(1);  // 2·M·N·K
  };
  return v;
}

// Registers a version under each of `ops`: one that takes every granularity serves both
// (kBlockwiseOp and kOp), each op its own registry entry.
struct RegisterGemm {
  RegisterGemm(std::initializer_list<const char*> ops, const char* id, const char* summary, GemmLaunch launch,
               int min_arch, const std::vector<SassFact>& sass, Kind kind = Kind::kVersion) {
    for (const char* op : ops) Registry::get().add(gemm_version(op, id, summary, launch, min_arch, sass, kind));
  }
};

// The tensor maps of the TMA versions: A's rows in boxes of block_m × 128 bytes, B's in boxes of
// block_n × 128, both in the 128-byte swizzle their wgmma descriptors name.
inline Status operand_maps(const GemmArgs& a, int block_m, int block_n, CUtensorMap* a_map,
                           CUtensorMap* b_map) {
  Status s = tensor_map_u8_sw128(a_map, a.a, a.m, a.k, block_m);
  return s.ok() ? tensor_map_u8_sw128(b_map, a.b, a.n, a.k, block_n) : s;
}

// ---------------------------------------------------------------------------------------------
// The epilogue's scales, shared by the versions that apply them there (tensor, rowwise).

// s_a of row m and s_b of column n (tensor: the one scale). Rows and columns past the matrix
// read the first scale: their results are never stored.
__device__ __forceinline__ float row_scale(const GemmArgs& a, int64_t m) {
  return a.granularity == Granularity::kTensor ? a.s_a[0] : a.s_a[m < a.m ? m : 0];  // (M)
}
__device__ __forceinline__ float col_scale(const GemmArgs& a, int64_t n) {
  return a.granularity == Granularity::kTensor ? a.s_b[0] : a.s_b[n < a.n ? n : 0];  // (N)
}

// The product s_a[m, kb]·s_b[n0/128, kb] that row m takes for K block kb (blockwise scales), 1
// for the others (their scales wait for the epilogue). Rows past M read row 0's: never stored.
__device__ __forceinline__ const float* block_scale_a(const GemmArgs& a, int64_t row, int kb) {
  const int64_t blocks = a.k / kScaleBlock, r = row < a.m ? row : 0;
  return a.a_scales_row_major ? a.s_a + r * blocks + kb : a.s_a + kb * a.m + r;  // (M, KB) or (KB, M)
}
__device__ __forceinline__ const float* block_scale_b(const GemmArgs& a, int64_t n0, int kb) {
  return a.s_b + (n0 / kScaleBlock) * (a.k / kScaleBlock) + kb;  // (ceil(N/128), KB)
}
__device__ __forceinline__ float block_scale(const GemmArgs& a, int64_t row, int64_t n0, int kb) {
  if (a.granularity != Granularity::kBlockwise) return 1.f;
  return *block_scale_a(a, row, kb) * *block_scale_b(a, n0, kb);
}

// bf16(s_a · (s_b · acc)) of a pair (scale B first, then A: vLLM's epilogue order, which the
// reference's accumulation model follows).
__device__ __forceinline__ __nv_bfloat162 scaled_pair(float c0, float c1, float sa, float sb0, float sb1) {
  return __floats2bfloat162_rn(sa * (sb0 * c0), sa * (sb1 * c1));
}

// y[m, n..n+1] = scaled_pair(...). N is a multiple of 16, so a pair is whole or absent.
__device__ __forceinline__ void store_pair(const GemmArgs& a, int64_t m, int64_t n, float c0, float c1,
                                           float sa, float sb0, float sb1) {
  if (m < a.m && n < a.n)
    *reinterpret_cast<__nv_bfloat162*>(a.y + m * a.n + n) = scaled_pair(c0, c1, sa, sb0, sb1);  // (M, N)
}

// A warpgroup's 64 × kN wgmma accumulators to y. Accumulator j of a thread (lane = 4g + t of warp
// w of the warpgroup) is row 16w + g + 8·((j / 2) % 2), column 8·(j / 4) + 2t + j % 2; `row` is
// the thread's first (16w + g of the tile's rows), `n0` the tile's first column. kScaled: apply
// the epilogue scales (tensor, rowwise); blockwise sums arrive scaled already.
template <int kN, bool kScaled = true>
__device__ __forceinline__ void store_wgmma_tile(const GemmArgs& a, const float (&acc)[kN / 2],
                                                 int64_t row, int64_t n0, int t) {
  const float sa0 = kScaled ? row_scale(a, row) : 1.f, sa1 = kScaled ? row_scale(a, row + 8) : 1.f;
#pragma unroll
  for (int j = 0; j < kN / 2; j += 4) {
    const int64_t col = n0 + 2 * j + 2 * t;  // 8·(j / 4) + 2t
    const float sb0 = kScaled ? col_scale(a, col) : 1.f, sb1 = kScaled ? col_scale(a, col + 1) : 1.f;
    store_pair(a, row, col, acc[j], acc[j + 1], sa0, sb0, sb1);
    store_pair(a, row + 8, col, acc[j + 2], acc[j + 3], sa1, sb0, sb1);
  }
}

// A TMA-store epilogue's staging: a warpgroup's 64 × kN BF16 results in shared memory as kN / 64
// boxes of 64 rows × 64 columns (128 bytes a row), each in the 128-byte swizzle (16-byte piece p of
// row r at p ^ (r % 8)), so a warp's four-byte pairs, eight rows of one piece, meet 32 banks. `r` is
// the thread's first row in the warpgroup (16w + g), `row` the same in y; the copy engine clips
// what lies past M and N, so nothing here is masked.
template <int kN, bool kScaled = true>
__device__ __forceinline__ void stage_wgmma_tile(const GemmArgs& a, const float (&acc)[kN / 2],
                                                 unsigned char* staging, int r, int64_t row,
                                                 int64_t n0, int t) {
  const float sa0 = kScaled ? row_scale(a, row) : 1.f, sa1 = kScaled ? row_scale(a, row + 8) : 1.f;
  const int mine = r * 128 + 4 * t;  // row r, pair t of a 16-byte piece
  const int swizzle = (r % 8) * 16;  // rows r and r + 8 share it
#pragma unroll
  for (int j = 0; j < kN / 2; j += 4) {
    const int col = 2 * j + 2 * t;  // the tile's column: 8·(j / 4) + 2t, piece (j / 4) % 8 of box j / 32
    const float sb0 = kScaled ? col_scale(a, n0 + col) : 1.f, sb1 = kScaled ? col_scale(a, n0 + col + 1) : 1.f;
    unsigned char* const at = staging + (mine + (j / 32) * (64 * 128) + ((((j / 4) % 8) * 16) ^ swizzle));
    *reinterpret_cast<__nv_bfloat162*>(at) = scaled_pair(acc[j], acc[j + 1], sa0, sb0, sb1);
    *reinterpret_cast<__nv_bfloat162*>(at + 8 * 128) = scaled_pair(acc[j + 2], acc[j + 3], sa1, sb0, sb1);
  }
}

}  // namespace lkw::fp8
