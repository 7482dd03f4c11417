// Mutants of chapter 06, each a plausible slip the golden cases must catch
// (tests/cpp/golden_main.cu runs each on every case of its op and wants at least one failure):
//   int4i_gemv/mutant_scale_group     every word takes the scale of the next group
//   int4i_gemv/mutant_no_tail         only whole 256-k blocks: the K tail is dropped (caught by
//                                     the cases with K % 256 != 0)
//   int4i_zp_gemv/mutant_zero_point   the zero point of the next group
//   int4t_gemv/mutant_rows_order      the tiled words read as if they were rows (the layout
//                                     forgotten; every read stays inside the padded tensor)
// One small kernel (a warp per column, as v1) with the slip chosen at compile time; otherwise
// exact: W = q·s − zs with zs = BF16(z·s), or zs = 8·s without zero points.
#include "02_int4_dequant/dequant.cuh"
#include "int4_gemv.cuh"

namespace lkw::gemv {
namespace {

enum class Slip { kScaleOfNextGroup, kNoTail, kZeroPointOfNextGroup, kTiledReadAsRows };

template <Slip kSlip, bool kZp>
__global__ void gemv_mutant_kernel(const __nv_bfloat16* __restrict__ x,
                                   const uint32_t* __restrict__ w,
                                   const __nv_bfloat16* __restrict__ scales,
                                   const uint32_t* __restrict__ zeros,
                                   __nv_bfloat16* __restrict__ y, int m_rows, int64_t n, int64_t k,
                                   int group_shift) {
  const int lane = threadIdx.x % 32;
  const int64_t col = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (col >= n) return;
  const int64_t groups = k >> group_shift;
  const int64_t words = kSlip == Slip::kNoTail ? k / 256 * 32 : k / 8;
  float acc[kMaxM] = {};
  for (int64_t i = lane; i < words; i += 32) {
    const int64_t group = (8 * i) >> group_shift;
    const int64_t next = (group + 1) % groups;
    const int64_t sg = kSlip == Slip::kScaleOfNextGroup ? next : group;
    const float s = bf16_to_f32(scales[col * groups + sg]);
    float zs = 8.0f * s;
    if constexpr (kZp) {
      const int64_t zg = kSlip == Slip::kZeroPointOfNextGroup ? next : group;
      const uint32_t z = (zeros[col * (groups / 8) + zg / 8] >> (4 * (zg % 8))) & 0xfu;
      zs = bf16_to_f32(__float2bfloat16_rn(float(z) * s));
    }
    __nv_bfloat162 pairs[4];
    int4::u4_to_bf16_magic<false>(w[col * (k / 8) + i], pairs);  // int4t_gemv: the slip itself
    for (int m = 0; m < m_rows; ++m) {
      float xq = 0.0f, xsum = 0.0f;
      for (int j = 0; j < 4; ++j) {
        const uint32_t xp = *reinterpret_cast<const uint32_t*>(x + m * k + 8 * i + 2 * j);
        xq = fmaf(bf16_lo_to_f32(bits_of(pairs[j])), bf16_lo_to_f32(xp), xq);
        xq = fmaf(bf16_hi_to_f32(bits_of(pairs[j])), bf16_hi_to_f32(xp), xq);
        xsum += bf16_lo_to_f32(xp) + bf16_hi_to_f32(xp);
      }
      acc[m] += s * xq - zs * xsum;
    }
  }
  for (int m = 0; m < m_rows; ++m) {
    const float sum = warp_sum(acc[m]);
    if (lane == 0) y[m * n + col] = __float2bfloat16_rn(sum);
  }
}

template <const GemvOp& kOp, Slip kSlip>
Status mutant(const GemvArgs& a, cudaStream_t stream) {
  Status s = validate_gemv(kOp, a, 4);
  if (!s.ok()) return s;
  gemv_mutant_kernel<kSlip, kOp.zero_points><<<unsigned((a.n + 3) / 4), 128, 0, stream>>>(
      a.x, a.w, a.scales, a.zeros, a.y, int(a.m), a.n, a.k, log2_of(a.group));
  return last_launch_status("gemv_mutant_kernel");
}

const Register kScaleGroup{gemv_version(kInt4iGemv, "mutant_scale_group",
                                        "the scale of the next group",
                                        mutant<kInt4iGemv, Slip::kScaleOfNextGroup>, {},
                                        Kind::kMutant)};
const Register kNoTail{gemv_version(kInt4iGemv, "mutant_no_tail",
                                    "whole 256-k blocks only: the K tail dropped",
                                    mutant<kInt4iGemv, Slip::kNoTail>, {}, Kind::kMutant)};
const Register kRowsOrder{gemv_version(kInt4tGemv, "mutant_rows_order",
                                       "the tiled words read as rows",
                                       mutant<kInt4tGemv, Slip::kTiledReadAsRows>, {}, Kind::kMutant)};
const Register kZeroPoint{gemv_version(kInt4iZpGemv, "mutant_zero_point",
                                       "the zero point of the next group",
                                       mutant<kInt4iZpGemv, Slip::kZeroPointOfNextGroup>, {},
                                       Kind::kMutant)};

}  // namespace
}  // namespace lkw::gemv
