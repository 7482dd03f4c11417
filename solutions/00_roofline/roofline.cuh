// Chapter 00 — roofline: measuring the ceilings every later chapter is judged against.
//
// op "copy":      dst[i] = src[i] for n 4-byte words. Bytes: 4 read + 4 written per word.
// op "gemm_bf16": C[M,N] = A[M,K] · B[N,K]^T in BF16 with FP32 accumulation (cuBLAS, a peer):
//                 the matrix-unit ceiling. FLOPs 2·M·N·K.
//
// The copy versions: v0 one 4-byte word per thread → v1 16-byte vectors → v2 several 16-byte
// loads in flight per thread. The best copy measured in a run is that run's bandwidth ceiling.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "lkw/registry.h"

namespace lkw::roofline {

constexpr const char* kChapter = "00_roofline";

// Every copy launcher has this signature: raw device pointers, a word count and a stream.
using CopyLaunch = Status (*)(const uint32_t* src, uint32_t* dst, int64_t n, cudaStream_t stream);

// The checks every copy launcher starts with; `align` is the access width it relies on.
inline Status validate_copy(const uint32_t* src, uint32_t* dst, int64_t n, int align) {
  return Check()
      .not_null(src, "src")
      .not_null(dst, "dst")
      .positive(n, "n")
      .aligned(src, align, "src")
      .aligned(dst, align, "dst")
      .disjoint(src, 4 * n, dst, 4 * n, "src and dst")
      .arch_at_least(80)
      .status();
}

inline bool is_word(DType t) { return dtype_size(t) == 4; }

inline Version copy_version(const char* id, const char* summary, CopyLaunch launch,
                            std::vector<SassFact> sass = {}, Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, "copy", id, summary, kind, std::move(sass));
  v.launch = [launch](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 1 && a.outputs.size() == 1, "copy takes src and dst")
                   .status();
    if (!s.ok()) return s;
    const TensorRef &src = a.inputs[0], &dst = a.outputs[0];
    s = Check()
            .that(is_word(src.dtype) && src.dtype == dst.dtype, "copy moves 4-byte words")
            .that(src.numel() == dst.numel(), "src and dst differ in size")
            .status();
    if (!s.ok()) return s;
    return launch(static_cast<const uint32_t*>(src.data), static_cast<uint32_t*>(dst.data),
                  src.numel(), stream);
  };
  v.bytes = [](const Args& a) { return 2.0 * a.inputs.at(0).bytes(); };
  v.flops = [](const Args&) { return 0.0; };
  return v;
}

}  // namespace lkw::roofline
