// Peers of chapter 00: what the vendor libraries reach on the same machine in the same run.
//   copy/cuda_memcpy  cudaMemcpyAsync device-to-device: the copy our kernels must match.
//   gemm_bf16/cublas  cuBLAS BF16 GEMM with FP32 accumulation: the matrix-unit ceiling.
#include <cublas_v2.h>

#include "cublas_gemm.h"
#include "roofline.cuh"

namespace lkw::roofline {
namespace {

Status copy_cuda_memcpy(const uint32_t* src, uint32_t* dst, int64_t n, cudaStream_t stream) {
  Status s = validate_copy(src, dst, n, 4);
  if (!s.ok()) return s;
  cudaError_t e = cudaMemcpyAsync(dst, src, 4 * n, cudaMemcpyDeviceToDevice, stream);
  return e == cudaSuccess ? Status{} : error(Code::kCudaError, cudaGetErrorString(e));
}

// One handle per thread, made on first use (handle creation is far too slow to time).
cublasHandle_t cublas_handle() {
  thread_local cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    cublasCreate(&h);
    return h;
  }();
  return handle;
}

}  // namespace

// Row-major C[M,N] = A[M,K] · B[N,K]^T is column-major C^T = B · A^T: cuBLAS sees
// op(B) = transposed (K×N stored, ld K) and A^T (K×M stored, ld K); at M = 1 it picks its GEMV
// kernels.
Status gemm_bf16_cublas(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* c,
                        int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  Status s = Check()
                 .not_null(a, "A").not_null(b, "B").not_null(c, "C")
                 .aligned(a, 2, "A").aligned(b, 2, "B").aligned(c, 2, "C")
                 .positive(m, "M").positive(n, "N").positive(k, "K")
                 .that(m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31), "dims must fit int32")
                 .disjoint(c, 2 * m * n, a, 2 * m * k, "C and A")
                 .disjoint(c, 2 * m * n, b, 2 * n * k, "C and B")
                 .arch_at_least(80)
                 .status();
  if (!s.ok()) return s;
  cublasHandle_t h = cublas_handle();
  if (!h) return error(Code::kCudaError, "cublasCreate failed");
  cublasSetStream(h, stream);
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b,
                                   CUDA_R_16BF, int(k), a, CUDA_R_16BF, int(k), &beta, c,
                                   CUDA_R_16BF, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    return error(Code::kCudaError, std::string("cublasGemmEx: ") + cublasGetStatusString(st));
  return {};
}

Version gemm_bf16_peer(const char* chapter, const char* op, const char* summary,
                       const char* a_name, const char* b_name, const char* c_name) {
  Version v = version_of(chapter, op, "cublas", summary, Kind::kPeer, {});
  v.kernels_per_launch = 0;  // a library call: not mapped in the ncu pass
  const std::string names = std::string(a_name) + ", " + b_name + " and " + c_name;
  v.launch = [op = std::string(op), names](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 2 && a.outputs.size() == 1, op + " takes " + names)
                   .status();
    if (!s.ok()) return s;
    const TensorRef &A = a.inputs[0], &B = a.inputs[1], &C = a.outputs[0];
    s = Check()
            .that(A.dtype == DType::kBF16 && B.dtype == DType::kBF16 && C.dtype == DType::kBF16,
                  op + " takes bfloat16 " + names)
            .that(A.shape.size() == 2 && B.shape.size() == 2 && C.shape.size() == 2,
                  names + " are matrices")
            .status();
    if (!s.ok()) return s;
    s = Check()
            .that(A.dim(1) == B.dim(1), "[M,K] · [N,K]^T: K differs")
            .that(C.dim(0) == A.dim(0) && C.dim(1) == B.dim(0), "the output must be [M,N]")
            .status();
    if (!s.ok()) return s;
    return gemm_bf16_cublas(static_cast<const __nv_bfloat16*>(A.data),
                            static_cast<const __nv_bfloat16*>(B.data),
                            static_cast<__nv_bfloat16*>(C.data), A.dim(0), B.dim(0), A.dim(1),
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

namespace {

Version memcpy_peer() {
  Version v = copy_version("cuda_memcpy", "cudaMemcpyAsync device-to-device", copy_cuda_memcpy, {},
                           Kind::kPeer);
  v.kernels_per_launch = 0;
  return v;
}

const Register kMemcpy{memcpy_peer()};
const Register kGemm{gemm_bf16_peer(
    kChapter, "gemm_bf16", "cuBLAS BF16 GEMM, FP32 accumulation: the matrix-unit ceiling", "A", "B",
    "C")};

}  // namespace
}  // namespace lkw::roofline
