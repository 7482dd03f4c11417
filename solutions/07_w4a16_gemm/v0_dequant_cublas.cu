// v0_dequant_cublas — the naive split: dequantize the weights to BF16 in HBM, then cuBLAS.
//
// Two kernels. The first reads the INT4 words, the scales (and zero points) and writes W_hat =
// BF16(s·(q − z)) [N, K] to a workspace (chapter 02's dequantization, [K/G, N] scales); the
// second is cuBLAS's BF16 GEMM on that copy. Nothing is wrong with either kernel: the cost is the
// round trip. Per weight, 0.5 byte is read, 2 bytes written and 2 bytes read again by cuBLAS:
// 4.5 bytes where the fused versions move 0.5.
// Expect: at small M about 9× the fused bound (slower than cuBLAS on BF16 weights that already
// exist); at large M the GEMM dominates and the dequantization is a fixed tax of the weights'
// size. Two kernels per launch.
#include <algorithm>
#include <mutex>

#include "00_roofline/cublas_gemm.h"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

constexpr int kThreads = 256;

// One thread per word: 8 natural-order nibbles of a row at k = 8j .. 8j + 7, one scale.
__global__ void __launch_bounds__(kThreads)
    dequant_kernel(const uint32_t* __restrict__ w, const __nv_bfloat16* __restrict__ scales,
                   const uint8_t* __restrict__ zeros, __nv_bfloat16* __restrict__ w_hat, int64_t n,
                   int64_t k, int group_shift) {
  const int64_t j = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (j >= k / 8) return;
  for (int64_t row = blockIdx.y; row < n; row += gridDim.y) {  // gridDim.y ≤ 65535
    const uint32_t word = w[row * (k / 8) + j];  // (N, K/8)
    const __nv_bfloat162 s2 = scale_pair(scales, (8 * j) >> group_shift, row, n);
    const uint32_t bias = zero_bias_at(zeros, (8 * j) >> group_shift, row, n);  // 128 + z
    uint32_t pairs[4];
    // BEGIN SOLUTION: byte p of the word is k = 8j + 2p, + 1: its BF16 pair (q − z), times the
    //   scale.
#pragma unroll
    for (int p = 0; p < 4; ++p)
      pairs[p] = bits_of(__hmul2(nibble_pair_minus_zero(word >> (8 * p), bias), s2));
    // STUB: for (int p = 0; p < 4; ++p) pairs[p] = 0u;
    // END SOLUTION
    *reinterpret_cast<uint4*>(w_hat + row * k + 8 * j) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);  // (N, K)
  }
}

// The BF16 copy of the weights, grown (never shrunk) for the process. Launches that share it must
// be ordered (one stream).
Status workspace(int64_t elements, __nv_bfloat16** out) {
  static std::mutex mutex;
  static __nv_bfloat16* buffer = nullptr;
  static int64_t have = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (elements > have) {
    cudaFree(buffer);
    buffer = nullptr;
    have = 0;
    if (cudaMalloc(&buffer, elements * sizeof(__nv_bfloat16)) != cudaSuccess)
      return error(Code::kCudaError,
                   std::string("v0 workspace: ") + cudaGetErrorString(cudaGetLastError()));
    have = elements;
  }
  *out = buffer;
  return {};
}

Status gemm_v0(const GemmArgs& a, cudaStream_t stream) {
  Status s = validate_gemm(kW4a16Gemm, a);
  if (!s.ok()) return s;
  __nv_bfloat16* w_hat = nullptr;
  s = workspace(a.n * a.k, &w_hat);
  if (!s.ok()) return s;
  const dim3 grid(unsigned((a.k / 8 + kThreads - 1) / kThreads), unsigned(std::min<int64_t>(a.n, 65535)));
  dequant_kernel<<<grid, kThreads, 0, stream>>>(a.w, a.scales, a.zeros, w_hat, a.n, a.k,
                                                group_shift_of(a.group, a.k));
  s = last_launch_status(kW4a16Gemm.name);
  if (!s.ok()) return s;
  return roofline::gemm_bf16_cublas(a.x, w_hat, a.y, a.m, a.n, a.k, stream);
}

const Register kRegistered{gemm_version(
    kW4a16Gemm, "v0_dequant_cublas", "dequantize to BF16 in HBM, then cuBLAS: 4.5 bytes per weight",
    gemm_v0, {{"dequant_kernel", {}, {"LOP3"}, {"I2F", "I2FP"}, true, "magic unpack, no integer→float convert"}},
    Kind::kVersion, 2)};

}  // namespace
}  // namespace lkw::w4a16
