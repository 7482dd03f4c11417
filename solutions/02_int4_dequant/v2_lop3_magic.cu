// v2_lop3_magic — FP16 magic numbers: no integer→float convert at all.
//
// Since v1: the unpack is dequant.cuh's u4_to_f16_magic — per word two LOP3 per byte pair put
// the nibbles into the mantissa of 1024.0 (0x6400), one HSUB2 (low nibbles) or one HFMA2 (high
// nibbles) removes 1024 + 8 — then one HMUL2 by the scale: about 1.5 instructions per pair of
// weights instead of two converts, a subtract and a multiply. It reads the weights in the
// interleaved order (repacked once, offline: reference/lkw/int4.py), so each mask yields two
// consecutive elements.
// Expect: the convert gone from the SASS (no I2F), LOP3 present; at the write bandwidth.
#include "dequant.cuh"
#include "int4_dequant.cuh"

namespace lkw::int4 {
namespace {

struct Int4MagicF16 {
  using Pair = half2;
  static constexpr int kPerWord = 8;
  static constexpr bool kZeroPoints = false;
  __device__ void operator()(uint32_t word, half2 s, half2, half2* out) const {
    half2 q[4];
    u4_to_f16_magic(word, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __hmul2(q[j], s);  // (q − 8)·s: one rounding
  }
};

Status dequant_v2(const DequantArgs& a, cudaStream_t stream) {
  return launch_units<Int4MagicF16>(kInt4iF16, a, stream);
}

const Register kRegistered{dequant_version(
    kInt4iF16, "v2_lop3_magic", "FP16 magic 0x6400: LOP3 + HSUB2/HFMA2, interleaved weights",
    dequant_v2,
    {{"dequant_units_kernel*Int4MagicF16", {}, {"LOP3", "HFMA2", "STG.E.128"},
      {"I2F", "I2FP"}, true, "LOP3 + HFMA2 unpack, no integer→float convert"}})};

}  // namespace
}  // namespace lkw::int4
