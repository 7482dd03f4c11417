// The cuBLAS BF16 GEMM peer, shared by every chapter that compares a kernel with BF16 weights:
// row-major C[M, N] = A[M, K] · B[N, K]^T, BF16 in and out, FP32 accumulation. Chapter 00
// registers it as gemm_bf16/cublas (the matrix-unit ceiling), chapter 06 as bf16_gemv/cublas
// (what a decode GEMV costs with BF16 weights). Defined in 00_roofline/peers.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "lkw/registry.h"

namespace lkw::roofline {

Status gemm_bf16_cublas(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* c,
                        int64_t m, int64_t n, int64_t k, cudaStream_t stream);

// The registry entry of that call under `chapter`/`op`/cublas, inputs (A [M,K], B [N,K]) and
// output C [M,N] named in the checks' messages as `names` (e.g. "x, W and y").
Version gemm_bf16_peer(const char* chapter, const char* op, const char* summary,
                       const char* a_name, const char* b_name, const char* c_name);

}  // namespace lkw::roofline
