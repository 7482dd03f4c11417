// The peer of chapter 06: what the same product costs with BF16 weights.
//   bf16_gemv/cublas  cuBLAS y[M, N] = x[M, K] · W[N, K]^T, BF16 in and out, FP32 accumulation
//                     (chapter 00's cuBLAS call, 00_roofline/cublas_gemm.h, under this op's name).
// It reads N·K·2 bytes of weights where the INT4 versions read N·K/2 (+ scales): at M = 1 the
// ratio of the two times is the speed-up weight-only quantization buys, up to ~3.9×.
#include "00_roofline/cublas_gemm.h"
#include "int4_gemv.cuh"

namespace lkw::gemv {
namespace {

const Register kCublas{roofline::gemm_bf16_peer(
    kChapter, "bf16_gemv", "cuBLAS BF16 GEMV/GEMM, FP32 accumulation: the BF16-weight baseline",
    "x", "W", "y")};

}  // namespace
}  // namespace lkw::gemv
