// v5_fused_add_quant — residual add + RMSNorm + dynamic FP8 / INT8 quant (per token or group).
//
// Since v4: yb, the BF16 normalized row, stays in registers. One more block reduction, a max of
// |yb| this time, gives the row's absmax; thread 0 stores the scale, and every thread quantizes
// its own units with chapter 03's arithmetic (03_dynamic_quant/quant_math.cuh) and stores 8 codes
// (8 bytes) per unit. The scale is computed from the BF16 yb — not from the FP32 product before
// its rounding — because yb is exactly what the unfused chain's norm kernel writes and its quant
// kernel reads: with the shared row routine, the codes and scales equal the chain's bit for bit.
// The group form (1 × 128, scales [d/128, T]: the blockwise FP8 GEMM's input in chapter 11) needs
// no block reduction: a group is 16 units in one slot of an aligned half-warp, its max 4 shuffles.
// Bytes: x and residual read, residual_out and q written: 7 B per element (+4 per scale) against
// the chain's 13 — y never touches HBM.
// Expect: close to v4's fraction of the ceiling, on fewer bytes; SASS: LDG.E.128, STG.E.128
// (residual_out), STG.E.64 (8 codes); on sm_89+ the hardware FP8 convert F2FP.SATFINITE.E4M3,
// for INT8 the saturating F2I.S8; no local memory.
#include "03_dynamic_quant/quant_math.cuh"
#include "rmsnorm.cuh"

namespace lkw::rmsnorm {
namespace {

// kVec one-byte codes, aligned to their size (a unit of 8 is one 8-byte store).
template <int kVec>
struct alignas(kVec) CodeVec {
  uint8_t b[kVec];
};

// The per-row quantizers: built from the row's absmax, they convert one unit of yb to codes.
struct Fp8Quant {
  float scale, inv;
  // BEGIN SOLUTION: scale and inverse from quant_math.cuh (fp8_scale with no bound)
  __device__ explicit Fp8Quant(float absmax)
      : scale(quant::fp8_scale(absmax, 0.0f)), inv(quant::fp8_inverse(scale)) {}
  // STUB: __device__ explicit Fp8Quant(float) : scale(0.0f), inv(0.0f) {}
  // END SOLUTION
  template <int kVec>
  __device__ CodeVec<kVec> operator()(const RowTile<kVec>& tile, int u) const {
    CodeVec<kVec> q;
    // BEGIN SOLUTION: unit u's codes, quant::quantize_e4m3x2 on pairs (1 element: pair with 0)
    if constexpr (kVec == 1) {
      q.b[0] = uint8_t(quant::quantize_e4m3x2(tile.get(u, 0), 0.0f, inv));
    } else {
#pragma unroll
      for (int j = 0; j < kVec; j += 2) {
        const uint16_t two = quant::quantize_e4m3x2(tile.get(u, j), tile.get(u, j + 1), inv);
        q.b[j] = uint8_t(two);
        q.b[j + 1] = uint8_t(two >> 8);
      }
    }
    // STUB: q = {};
    // END SOLUTION
    return q;
  }
};

struct Int8Quant {
  float scale, inv;
  // BEGIN SOLUTION: scale and inverse from quant_math.cuh (int8_scale, int8_inverse)
  __device__ explicit Int8Quant(float absmax)
      : scale(quant::int8_scale(absmax)), inv(quant::int8_inverse(scale)) {}
  // STUB: __device__ explicit Int8Quant(float) : scale(0.0f), inv(0.0f) {}
  // END SOLUTION
  template <int kVec>
  __device__ CodeVec<kVec> operator()(const RowTile<kVec>& tile, int u) const {
    CodeVec<kVec> q;
#pragma unroll
    for (int j = 0; j < kVec; ++j) q.b[j] = uint8_t(quant::quantize_int8(tile.get(u, j), inv));
    return q;
  }
};

// v4's row, which both kernels below start with: residual_out = x + residual, then r normalized
// and weighted in place, so that it holds yb, the chain's BF16 y, for the quantization.
template <int kVec>
__device__ __forceinline__ void add_and_normalize(const __nv_bfloat16* x,
                                                  const __nv_bfloat16* residual_in,
                                                  __nv_bfloat16* residual_out,
                                                  const __nv_bfloat16* weight, int units, int64_t d,
                                                  float eps, RowTile<kVec>& r) {
  RowTile<kVec> residual, w;
  load_row(x, units, r);
  load_row(residual_in, units, residual);
  add_residual(r, residual);
  store_row(residual_out, units, r);
  const float rstd = row_rstd(r, d, eps);
  load_row(weight, units, w);  // (d)
  normalize_row(r, rstd, w);
}

template <int kVec, class Quantizer>
__global__ void __launch_bounds__(RowTile<kVec>::kMaxThreads)
    fused_add_rmsnorm_quant_v5_kernel(const __nv_bfloat16* __restrict__ x,
                                      const __nv_bfloat16* residual_in, __nv_bfloat16* residual_out,
                                      const __nv_bfloat16* __restrict__ weight,
                                      uint8_t* __restrict__ q, float* __restrict__ scales,
                                      int64_t d, float eps) {
  const int units = int(d / kVec);
  const int64_t row_offset = blockIdx.x * d;
  RowTile<kVec> r;
  add_and_normalize(x + row_offset, residual_in + row_offset, residual_out + row_offset, weight,
                    units, d, eps, r);  // (T, d); r now holds yb, the chain's BF16 y

  // BEGIN SOLUTION: a Quantizer from row_absmax; store each unit's codes; thread 0 the scale
  const Quantizer quantize(row_absmax(r));
  auto* q_row = reinterpret_cast<CodeVec<kVec>*>(q + row_offset);  // (T, d/kVec)
#pragma unroll
  for (int u = 0; u < RowTile<kVec>::kUnits; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    if (i < units) q_row[i] = quantize(r, u);
  }
  if (threadIdx.x == 0) scales[blockIdx.x] = quantize.scale;  // (T, 1)
  // END SOLUTION
}

// The group form: a scale per 1 × 128 slice of the row, stored at [g, row] of scales [d/128, T].
// Unit i (8 elements) of the row is slot i / blockDim.x of thread i % blockDim.x, and blockDim.x
// is a multiple of 32 (row_threads), so the 16 units of a group sit in one slot of the 16 threads
// of an aligned half-warp: its absmax is a max over the half-warp, no shared memory, no barrier.
// d is a multiple of 128, so a half-warp's slot is wholly in the row or wholly past it (zeros,
// never stored); every lane runs the shuffles, which need the whole warp.
constexpr int kGroupUnits = kGroup / 8;  // 16
static_assert(kGroupUnits == 16, "a group's units are one aligned half-warp's");

__global__ void __launch_bounds__(RowTile<8>::kMaxThreads) fused_add_rmsnorm_group_quant_v5_kernel(
    const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* residual_in,
    __nv_bfloat16* residual_out, const __nv_bfloat16* __restrict__ weight, uint8_t* __restrict__ q,
    float* __restrict__ scales, int64_t t, int64_t d, float eps) {
  const int units = int(d / 8);
  const int64_t row_offset = blockIdx.x * d;
  RowTile<8> r;
  add_and_normalize(x + row_offset, residual_in + row_offset, residual_out + row_offset, weight,
                    units, d, eps, r);  // (T, d); r now holds yb, the chain's BF16 y

  // BEGIN SOLUTION: per slot, the group's absmax (warp_reduce<Max, 16>), an Fp8Quant from it and
  //   the unit's codes; the group's first lane stores the scale at [i / 16, row]
  auto* q_row = reinterpret_cast<CodeVec<8>*>(q + row_offset);  // (T, d/8)
#pragma unroll
  for (int u = 0; u < RowTile<8>::kUnits; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(r.get(u, j)));
    const Fp8Quant quantize(warp_reduce<Max, kGroupUnits>(m));
    if (i < units) {
      q_row[i] = quantize(r, u);
      if (threadIdx.x % kGroupUnits == 0)
        scales[(i / kGroupUnits) * t + blockIdx.x] = quantize.scale;  // (d/128, T)
    }
  }
  // END SOLUTION
}

template <const NormOp& kOp, class Quantizer>
Status fused_add_rmsnorm_quant_v5(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kOp, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.t)), block(row_threads(a.d));
  uint8_t* q = static_cast<uint8_t*>(a.q);
  if (row_vec(a.d) == 8) {
    fused_add_rmsnorm_quant_v5_kernel<8, Quantizer><<<grid, block, 0, stream>>>(
        a.x, a.residual_in, a.residual_out, a.weight, q, a.scales, a.d, a.eps);
  } else {
    fused_add_rmsnorm_quant_v5_kernel<1, Quantizer><<<grid, block, 0, stream>>>(
        a.x, a.residual_in, a.residual_out, a.weight, q, a.scales, a.d, a.eps);
  }
  return last_launch_status(kOp.name);
}

// validate_norm refuses a d that is not a multiple of 128; every other d is a multiple of 8, so
// only the 16-byte path exists here.
Status fused_add_rmsnorm_fp8_group_v5(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kFusedAddFp8Group, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  fused_add_rmsnorm_group_quant_v5_kernel<<<unsigned(a.t), row_threads(a.d), 0, stream>>>(
      a.x, a.residual_in, a.residual_out, a.weight, static_cast<uint8_t*>(a.q), a.scales, a.t, a.d,
      a.eps);
  return last_launch_status(kFusedAddFp8Group.name);
}

std::vector<SassFact> facts(const char* quantizer, const char* convert) {
  const std::string vector_kernel =
      std::string("fused_add_rmsnorm_quant_v5_kernel*Li8E*") + quantizer;
  return {{vector_kernel,
           {},
           {"LDG.E.128", "STG.E.128", "STG.E.64"},
           {},
           true,
           "16-byte loads, 16-byte residual stores, 8 codes per 8-byte store; no local memory"},
          {vector_kernel,
           {"sm_89", "sm_90a"},
           {convert},
           {},
           true,
           "the hardware convert to the 8-bit format"},
          {std::string("fused_add_rmsnorm_quant_v5_kernel*Li1E*") + quantizer,
           {},
           {},
           {},
           true,
           "the scalar path: no local memory"}};
}

constexpr const char* kSummary =
    "add + RMSNorm + per-token quant in one kernel: yb stays in registers";
const Register kRegisteredFp8{norm_version(kFusedAddFp8, "v5_fused_add_quant", kSummary,
                                           fused_add_rmsnorm_quant_v5<kFusedAddFp8, Fp8Quant>,
                                           facts("Fp8Quant", "F2FP.SATFINITE.E4M3"))};
const Register kRegisteredFp8Group{norm_version(
    kFusedAddFp8Group, "v5_fused_add_quant",
    "add + RMSNorm + per-group (1 x 128) FP8 quant in one kernel: a half-warp per group",
    fused_add_rmsnorm_fp8_group_v5,
    {{"fused_add_rmsnorm_group_quant_v5_kernel",
      {},
      {"LDG.E.128", "STG.E.128", "STG.E.64"},
      {},
      true,
      "16-byte loads, 16-byte residual stores, 8 codes per 8-byte store; no local memory"},
     {"fused_add_rmsnorm_group_quant_v5_kernel",
      {"sm_89", "sm_90a"},
      {"F2FP.SATFINITE.E4M3"},
      {},
      true,
      "the hardware convert to E4M3"}})};
const Register kRegisteredInt8{norm_version(kFusedAddInt8, "v5_fused_add_quant", kSummary,
                                            fused_add_rmsnorm_quant_v5<kFusedAddInt8, Int8Quant>,
                                            facts("Int8Quant", "F2I.S8"))};

}  // namespace
}  // namespace lkw::rmsnorm
