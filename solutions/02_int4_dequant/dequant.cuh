// Register-level unpack of quantized weights: the functions chapter 02 builds and later chapters
// (06 int4_gemv, 07 w4a16_gemm) call from solutions/.
//
// Every function turns one 32-bit register of packed weights into FP16/BF16 pairs of (q − bias),
// without an integer→float convert: the integer bits are OR-ed into the mantissa of a float whose
// exponent makes the mantissa's last bit worth exactly 1 ("magic number"), and one packed
// subtraction removes the magic value and the bias together.
//   FP16 1024.0 = 0x6400: mantissa ulp 1 → 0x6400 | q reads as 1024 + q  (q < 1024)
//   BF16  128.0 = 0x4300: mantissa ulp 1 → 0x4300 | q reads as  128 + q  (q < 128)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace lkw::int4 {

// lop3.b32 evaluates any three-input boolean function in one instruction; kLut is its truth
// table over the inputs' canonical patterns a = 0xF0, b = 0xCC, c = 0xAA. (a & b) | c is
// (0xF0 & 0xCC) | 0xAA = 0xEA. Written out because the compiler does not always fuse the AND and
// the OR into one LOP3 once the operands come from different places.
template <int kLut>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(r) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return r;
}
constexpr int kAndOr = (0xF0 & 0xCC) | 0xAA;  // (a & b) | c

__device__ __forceinline__ half2 as_half2(uint32_t u) {
  return *reinterpret_cast<const half2*>(&u);
}
__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t u) {
  return *reinterpret_cast<const __nv_bfloat162*>(&u);
}

// The interleaved order the magic unpack needs: nibble position p of a word holds element
// {0, 2, 4, 6, 1, 3, 5, 7}[p] (reference/lkw/int4.py packs it). One mask (0x000F000F) then picks
// elements (0, 1) into the two halves, the next shift by 4 picks (2, 3), and so on: each step
// yields two consecutive elements.

// Eight INT4 of an interleaved word → four half2 of (q − 8) (or of q, with kMinus8 = false, for
// zero points that subtract later), in element order.
// Low nibbles: 0x6400 | q = 1024 + q, minus 0x6408 (1032) = q − 8: one LOP3 + one HSUB2.
// High nibbles (bits 4..7 of each half) read as 1024 + 16q: × 1/16 (0x2C00) + (−72) (0xD480)
// = 64 + q − 72 = q − 8: one LOP3 + one HFMA2. All exact in FP16. Without the bias the constants
// are 0x6400 (1024) and 0xD400 (−64).
template <bool kMinus8 = true>
__device__ __forceinline__ void u4_to_f16_magic(uint32_t q, half2 (&out)[4]) {
  // BEGIN SOLUTION: per byte pair two LOP3 (masks 0x000F000F, 0x00F000F0; magic 0x64006400),
  //   then HSUB2 / HFMA2 with the constants above; q >>= 8 for the second pair.
  constexpr uint32_t kLo = 0x000f000f, kHi = 0x00f000f0, kMagic = 0x64006400;
  const half2 kSub = as_half2(kMinus8 ? 0x64086408u : 0x64006400u),
              kSixteenth = as_half2(0x2c002c00u), kAdd = as_half2(kMinus8 ? 0xd480d480u : 0xd400d400u);
  const uint32_t lo0 = lop3<kAndOr>(q, kLo, kMagic), hi0 = lop3<kAndOr>(q, kHi, kMagic);
  q >>= 8;
  const uint32_t lo1 = lop3<kAndOr>(q, kLo, kMagic), hi1 = lop3<kAndOr>(q, kHi, kMagic);
  out[0] = __hsub2(as_half2(lo0), kSub);
  out[1] = __hfma2(as_half2(hi0), kSixteenth, kAdd);
  out[2] = __hsub2(as_half2(lo1), kSub);
  out[3] = __hfma2(as_half2(hi1), kSixteenth, kAdd);
  // END SOLUTION
}

// Eight INT4 of an interleaved word → four bf162 of (q − 8) (or q). BF16 has 7 mantissa bits:
// 128 + 16q does not fit (16·15 = 240 > 127), so the FP16 high-nibble trick is out; instead one
// mask and a shift by 4 per pair: 0x4300 | q = 128 + q, minus 136 (0x4308) = q − 8 (minus 128,
// 0x4300, = q). Four LOP3 + four HSUB2.
template <bool kMinus8 = true>
__device__ __forceinline__ void u4_to_bf16_magic(uint32_t q, __nv_bfloat162 (&out)[4]) {
  // BEGIN SOLUTION: per pair: LOP3 (mask 0x000F000F, magic 0x43004300), subtract 0x43084308
  //   (136), then q >>= 4.
  constexpr uint32_t kMask = 0x000f000f, kMagic = 0x43004300;
  const __nv_bfloat162 kSub = as_bf162(kMinus8 ? 0x43084308u : 0x43004300u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[i] = __hsub2(as_bf162(lop3<kAndOr>(q, kMask, kMagic)), kSub);
    q >>= 4;
  }
  // END SOLUTION
}

// The same magic without its subtraction: four BF16 pairs of 128 + q, one LOP3 each (chapter 06
// folds the 128 and the −8 into one correction per group, so nothing is subtracted per weight).
__device__ __forceinline__ void u4_to_bf16_plus128(uint32_t q, uint32_t (&out)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[i] = lop3<kAndOr>(q, 0x000f000fu, 0x43004300u);
    q >>= 4;
  }
}

// Four UINT8 (bias 128) → two half2 of (b − 128), in element order. PRMT (byte permute) builds
// both halves in one instruction: bytes (b0, 0x64, b1, 0x64) read as (1024 + b0, 1024 + b1);
// minus 0x6480 (1152) = b − 128. The 8-bit mantissa room of 1024..2047 fits every byte.
__device__ __forceinline__ void u8_to_f16_magic(uint32_t q, half2 (&out)[2]) {
  // BEGIN SOLUTION: __byte_perm(q, 0x64646464, 0x4140) and (…, 0x4342), then HSUB2 with 0x64806480.
  constexpr uint32_t kMagic = 0x64646464;
  const half2 k1152 = as_half2(0x64806480);
  out[0] = __hsub2(as_half2(__byte_perm(q, kMagic, 0x4140)), k1152);
  out[1] = __hsub2(as_half2(__byte_perm(q, kMagic, 0x4342)), k1152);
  // END SOLUTION
}

// Four FP8 E4M3 → two half2 of the same values, by moving bits: byte s.eeee.mmm placed as
// s.0eeee.mmm0000000 in an FP16 reads as the value × 2^(7 − 15); one multiply by 2^8 corrects
// the exponent bias (and FP8 subnormals land on FP16 subnormals, which the multiply normalizes).
// Finite codes only: the E4M3 NaN (S.1111.111) would come out as ±480.
__device__ __forceinline__ void e4m3_to_f16_shift(uint32_t q, half2 (&out)[2]) {
  // BEGIN SOLUTION: PRMT bytes 0,1 (then 2,3) into each half's high byte; keep the sign bit,
  //   shift the rest right by 1; multiply by 256 (0x5C00).
  const half2 k256 = as_half2(0x5c005c00);
  const uint32_t x01 = __byte_perm(q, 0, 0x1404), x23 = __byte_perm(q, 0, 0x3424);
  out[0] = __hmul2(as_half2(lop3<kAndOr>(x01, 0x80008000u, (x01 >> 1) & 0x3f803f80u)), k256);
  out[1] = __hmul2(as_half2(lop3<kAndOr>(x23, 0x80008000u, (x23 >> 1) & 0x3f803f80u)), k256);
  // END SOLUTION
}

// Four FP8 E4M3 → four floats (exact), the BF16 way: s.eeee.mmm placed as s.0000eeee.mmm0000 in
// the top half of an FP32 reads as the value × 2^(7 − 127); × 2^120 corrects it. FP32 keeps FP8
// subnormals exact (BF16 arithmetic may flush them), and the scale multiply that follows is exact
// in FP32 too, so the one rounding is the final BF16 store.
__device__ __forceinline__ void e4m3_to_f32_shift(uint32_t q, float (&out)[4]) {
  const uint32_t x01 = __byte_perm(q, 0, 0x1404), x23 = __byte_perm(q, 0, 0x3424);
  const uint32_t h01 = lop3<kAndOr>(x01, 0x80008000u, (x01 >> 4) & 0x07f007f0u);
  const uint32_t h23 = lop3<kAndOr>(x23, 0x80008000u, (x23 >> 4) & 0x07f007f0u);
  out[0] = __uint_as_float(h01 << 16) * 0x1p120f;
  out[1] = __uint_as_float(h01 & 0xffff0000u) * 0x1p120f;
  out[2] = __uint_as_float(h23 << 16) * 0x1p120f;
  out[3] = __uint_as_float(h23 & 0xffff0000u) * 0x1p120f;
}

}  // namespace lkw::int4
