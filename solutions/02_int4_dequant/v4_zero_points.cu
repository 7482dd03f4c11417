// v4_zero_points — asymmetric weights: W = q·s − z·s, the zero point folded into one FMA.
//
// Since v2/v3: a group now has a zero point z (4 bits, packed 8 to a word along the groups)
// instead of the fixed 8. The unpack yields q itself (1024 or 128 removed, no bias), and one
// HFMA2 per pair computes q·s + (−z·s) with z·s made once per group. That precomputed product is
// rounded, so W can differ from s·(q − z) in the last bit: the reference rounds at the same point.
// Expect: as many instructions per pair as v2/v3 (the FMA replaces the multiply); no I2F in the
// unpack.
#include "dequant.cuh"
#include "int4_dequant.cuh"

namespace lkw::int4 {
namespace {

struct Int4ZeroPointF16 {
  using Pair = half2;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = true;
  __device__ void operator()(uint32_t word, half2 s, half2 neg_zs, half2* out) const {
    half2 q[4];
    u4_to_f16_magic<false>(word, q);
    // BEGIN SOLUTION: one HFMA2 per pair: q·s + (−z·s).
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __hfma2(q[j], s, neg_zs);
    // END SOLUTION
  }
};
struct Int4ZeroPointBf16 {
  using Pair = __nv_bfloat162;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = true;
  __device__ void operator()(uint32_t word, __nv_bfloat162 s, __nv_bfloat162 neg_zs,
                             __nv_bfloat162* out) const {
    __nv_bfloat162 q[4];
    u4_to_bf16_magic<false>(word, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __hfma2(q[j], s, neg_zs);
  }
};

template <const DequantOp& kOp, class Unpack>
Status dequant_v4(const DequantArgs& a, cudaStream_t stream) {
  return launch_units<Unpack>(kOp, a, stream);
}

constexpr const char* kSummary = "zero points: magic unpack + one FMA q·s − z·s";
const Register kRegisteredF16{dequant_version(
    kInt4iZpF16, "v4_zero_points", kSummary, dequant_v4<kInt4iZpF16, Int4ZeroPointF16>,
    {{"dequant_units_kernel*Int4ZeroPointF16", {}, {"LOP3", "HFMA2"}, {}, true,
      "LOP3 + HFMA2 unpack"}})};
const Register kRegisteredBf16{dequant_version(
    kInt4iZpBf16, "v4_zero_points", kSummary, dequant_v4<kInt4iZpBf16, Int4ZeroPointBf16>,
    {{"dequant_units_kernel*Int4ZeroPointBf16", {}, {"LOP3"}, {}, true, "LOP3 unpack"}})};

}  // namespace
}  // namespace lkw::int4
