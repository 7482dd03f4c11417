// Mutants of chapter 02, each a plausible slip the tests must catch:
//   int4i_f16/mutant_swapped_nibbles    the two nibbles of each byte read in swapped order
//   int4i_f16/mutant_high_constant      high nibbles with −64 (0xD400) instead of −72: q, not q − 8
//   int4i_zp_f16/mutant_zero_point_8    the zero point ignored (always 8)
//   int4_f16/mutant_scale_group         the scale of the wrong group (k / (G/2))
#include "dequant.cuh"
#include "int4_dequant.cuh"

namespace lkw::int4 {
namespace {

struct SwappedNibbles {
  using Pair = half2;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
    const uint32_t swapped = ((word & 0x0f0f0f0fu) << 4) | ((word >> 4) & 0x0f0f0f0fu);
    half2 q[4];
    u4_to_f16_magic(swapped, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __hmul2(q[j], s);
  }
};
struct HighConstant {
  using Pair = half2;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
    half2 q[4];
    u4_to_f16_magic(word, q);
    const half2 eight = as_half2(0x48004800);
    out[0] = __hmul2(q[0], s);
    out[1] = __hmul2(__hadd2(q[1], eight), s);
    out[2] = __hmul2(q[2], s);
    out[3] = __hmul2(__hadd2(q[3], eight), s);
  }
};
struct ZeroPointEight {
  using Pair = half2;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = true;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
    half2 q[4];
    u4_to_f16_magic(word, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __hmul2(q[j], s);
  }
};

__global__ void wrong_group_kernel(const uint32_t* packed, const half* scales, half* out,
                                   int64_t n, int64_t k, int group) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= n * k) return;
  const int64_t row = idx / k, col = idx % k;
  const int q = (packed[row * (k / 8) + col / 8] >> (4 * (col % 8))) & 0xf;
  const int64_t g = (col / (group / 2)) % (k / group);  // wrong: half-size groups, wrapped
  out[idx] = __hmul(__int2half_rn(q - 8), scales[row * (k / group) + g]);
}

Status wrong_group(const DequantArgs& a, cudaStream_t stream) {
  Status s = validate_dequant(kInt4F16, a, 4);
  if (!s.ok()) return s;
  wrong_group_kernel<<<(a.n * a.k + 255) / 256, 256, 0, stream>>>(
      static_cast<const uint32_t*>(a.weights), static_cast<const half*>(a.scales),
      static_cast<half*>(a.out), a.n, a.k, a.group);
  return last_launch_status("wrong_group_kernel");
}

template <const DequantOp& kOp, class Unpack>
Status mutant(const DequantArgs& a, cudaStream_t stream) {
  return launch_units<Unpack>(kOp, a, stream);
}

const Register kSwapped{dequant_version(kInt4iF16, "mutant_swapped_nibbles", "nibbles of a byte swapped",
                                        mutant<kInt4iF16, SwappedNibbles>, {}, Kind::kMutant)};
const Register kHigh{dequant_version(kInt4iF16, "mutant_high_constant", "high nibbles without the −8",
                                     mutant<kInt4iF16, HighConstant>, {}, Kind::kMutant)};
const Register kZp{dequant_version(kInt4iZpF16, "mutant_zero_point_8", "ignores the zero point",
                                   mutant<kInt4iZpF16, ZeroPointEight>, {}, Kind::kMutant)};
const Register kGroup{dequant_version(kInt4F16, "mutant_scale_group", "scale of the wrong group",
                                      wrong_group, {}, Kind::kMutant)};

}  // namespace
}  // namespace lkw::int4
