// The peer of chapter 06: what the same product costs with BF16 weights.
//   bf16_gemv/cublas  cuBLAS y[M, N] = x[M, K] · W[N, K]^T, BF16 in and out, FP32 accumulation.
// It reads N·K·2 bytes of weights where the INT4 versions read N·K/2 (+ scales): at M = 1 the
// ratio of the two times is the speed-up weight-only quantization buys, up to ~3.9×.
#include <cublas_v2.h>

#include "int4_gemv.cuh"

namespace lkw::gemv {
namespace {

// One handle per thread, made on first use (handle creation is far too slow to time).
cublasHandle_t cublas_handle() {
  thread_local cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    cublasCreate(&h);
    return h;
  }();
  return handle;
}

// Row-major y[M,N] = x[M,K] · W[N,K]^T is column-major y^T = W · x^T: cuBLAS sees op(W) = W^T of
// the stored K×N (ld K) and x^T (K×M, ld K); cuBLAS picks its GEMV kernels at M = 1.
Status bf16_gemv_cublas(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                        int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  Status s = Check()
                 .not_null(x, "x").not_null(w, "W").not_null(y, "y")
                 .aligned(x, 2, "x").aligned(w, 2, "W").aligned(y, 2, "y")
                 .positive(m, "M").positive(n, "N").positive(k, "K")
                 .that(m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31), "dims must fit int32")
                 .disjoint(y, 2 * m * n, x, 2 * m * k, "y and x")
                 .disjoint(y, 2 * m * n, w, 2 * n * k, "y and W")
                 .arch_at_least(80)
                 .status();
  if (!s.ok()) return s;
  cublasHandle_t h = cublas_handle();
  if (!h) return error(Code::kCudaError, "cublasCreate failed");
  cublasSetStream(h, stream);
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, w,
                                   CUDA_R_16BF, int(k), x, CUDA_R_16BF, int(k), &beta, y,
                                   CUDA_R_16BF, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    return error(Code::kCudaError, std::string("cublasGemmEx: ") + cublasGetStatusString(st));
  return {};
}

Version cublas_peer() {
  Version v = version_of(kChapter, "bf16_gemv", "cublas",
                         "cuBLAS BF16 GEMV/GEMM, FP32 accumulation: the BF16-weight baseline",
                         Kind::kPeer, {});
  v.kernels_per_launch = 0;  // a library call: not mapped in the ncu pass
  v.launch = [](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 2 && a.outputs.size() == 1,
                         "bf16_gemv takes x, W and y")
                   .status();
    if (!s.ok()) return s;
    const TensorRef &x = a.inputs[0], &w = a.inputs[1], &y = a.outputs[0];
    s = Check()
            .that(x.dtype == DType::kBF16 && w.dtype == DType::kBF16 && y.dtype == DType::kBF16,
                  "bf16_gemv takes bfloat16 x, W, y")
            .that(x.shape.size() == 2 && w.shape.size() == 2 && y.shape.size() == 2,
                  "x, W and y are matrices")
            .status();
    if (!s.ok()) return s;
    s = Check()
            .that(x.dim(1) == w.dim(1), "x is [M,K] and W is [N,K]: K differs")
            .that(y.dim(0) == x.dim(0) && y.dim(1) == w.dim(0), "y must be [M,N]")
            .status();
    if (!s.ok()) return s;
    return bf16_gemv_cublas(static_cast<const __nv_bfloat16*>(x.data),
                            static_cast<const __nv_bfloat16*>(w.data),
                            static_cast<__nv_bfloat16*>(y.data), x.dim(0), w.dim(0), x.dim(1),
                            stream);
  };
  v.bytes = [](const Args& a) {
    return double(a.inputs.at(0).bytes() + a.inputs.at(1).bytes() + a.outputs.at(0).bytes());
  };
  v.flops = [](const Args& a) {
    return 2.0 * a.inputs.at(0).dim(0) * a.inputs.at(1).dim(0) * a.inputs.at(0).dim(1);
  };
  return v;
}

const Register kCublas{cublas_peer()};

}  // namespace
}  // namespace lkw::gemv
