// v0_naive — one output element per thread: shift, mask, integer→float convert, subtract 8, scale.
//
// The direct reading of W = s·(q − 8). Each thread re-reads the 32-bit word that holds its nibble
// (eight neighbours read the same word: the L1 catches it), converts q with I2F, subtracts the
// bias and multiplies by its group's scale, and stores 2 bytes. Narrow stores and one convert per
// element are what the later versions remove.
// Expect: far from the bound (2-byte stores); SASS: an I2F-family convert in the kernel.
#include "int4_dequant.cuh"

namespace lkw::int4 {
namespace {

template <class Scalar>
__device__ __forceinline__ Scalar int_to(int x);
template <>
__device__ __forceinline__ half int_to<half>(int x) { return __int2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 int_to<__nv_bfloat16>(int x) { return __int2bfloat16_rn(x); }

template <class Scalar>
__global__ void dequant_v0_naive_kernel(const uint32_t* __restrict__ packed,
                                        const Scalar* __restrict__ scales,
                                        Scalar* __restrict__ out, int64_t n, int64_t k,
                                        int group) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= n * k) return;
  const int64_t row = idx / k, col = idx % k;
  // BEGIN SOLUTION: nibble col % 8 of word (row, col / 8); convert it, subtract 8, multiply
  //   by scale (row, col / group).
  const uint32_t word = packed[row * (k / 8) + col / 8];          // (N, K/8)
  const int q = (word >> (4 * (col % 8))) & 0xf;
  const Scalar s = scales[row * (k / group) + col / group];       // (N, K/G)
  out[idx] = __hmul(__hsub(int_to<Scalar>(q), int_to<Scalar>(8)), s);  // q − 8 is exact
  // END SOLUTION
}

template <const DequantOp& kOp, class Scalar>
Status dequant_v0_naive(const DequantArgs& a, cudaStream_t stream) {
  Status s = validate_dequant(kOp, a, 4);
  if (!s.ok()) return s;
  constexpr int kThreads = 256;
  dequant_v0_naive_kernel<Scalar><<<(a.n * a.k + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      static_cast<const uint32_t*>(a.weights), static_cast<const Scalar*>(a.scales),
      static_cast<Scalar*>(a.out), a.n, a.k, a.group);
  return last_launch_status(kOp.name);
}

std::vector<SassFact> converts(const char* scalar) {
  return {{std::string("dequant_v0_naive_kernel*") + scalar, {}, {"I2F"}, {}, true,
           "the integer→float convert (I2F) per element"}};
}

constexpr const char* kSummary = "one element per thread: shift, mask, I2F, sub, mul";
const Register kRegisteredF16{dequant_version(kInt4F16, "v0_naive", kSummary,
                                              dequant_v0_naive<kInt4F16, half>, converts("half"))};
const Register kRegisteredBf16{dequant_version(kInt4Bf16, "v0_naive", kSummary,
                                               dequant_v0_naive<kInt4Bf16, __nv_bfloat16>,
                                               converts("bfloat16"))};

}  // namespace
}  // namespace lkw::int4
