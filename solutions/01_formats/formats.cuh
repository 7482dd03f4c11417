// Chapter 01 — formats: BF16, FP16, FP8 (E4M3, E5M2) at the bit level, and the casts between them.
//
// ops (one element in, one element out; n elements, any n ≥ 1):
//   f32_to_bf16   float32 → bfloat16, round to nearest even               4 B read, 2 B written
//   bf16_to_f32   bfloat16 → float32, exact                               2 B read, 4 B written
//   f32_to_e4m3   float32 → float8_e4m3fn, RNE + satfinite (±448, NaN kept)  4 B read, 1 B written
//   f32_to_e5m2   float32 → float8_e5m2, RNE + satfinite (±57344)          4 B read, 1 B written
//   e4m3_to_bf16  float8_e4m3fn → bfloat16, exact                         1 B read, 2 B written
//   e5m2_to_bf16  float8_e5m2 → bfloat16, exact                           1 B read, 2 B written
//
// versions: v0_software_bits (integer bit manipulation: the sm_80 path, and what the hardware
// does spelled out) → v1_hardware_cvt (one cvt per element) → v2_vec16 (16-byte accesses and
// paired cvt: the bandwidth version). formats_bits.cuh holds the bit functions, built for host
// and device, so the host tests check them exhaustively without a GPU.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "lkw/registry.h"

namespace lkw::formats {

constexpr const char* kChapter = "01_formats";

// Element types of each op, as stored (narrow floats travel as their raw bits).
struct CastOp {
  const char* name;
  DType in, out;
};
constexpr CastOp kF32ToBf16{"f32_to_bf16", DType::kF32, DType::kBF16};
constexpr CastOp kBf16ToF32{"bf16_to_f32", DType::kBF16, DType::kF32};
constexpr CastOp kF32ToE4m3{"f32_to_e4m3", DType::kF32, DType::kE4M3};
constexpr CastOp kF32ToE5m2{"f32_to_e5m2", DType::kF32, DType::kE5M2};
constexpr CastOp kE4m3ToBf16{"e4m3_to_bf16", DType::kE4M3, DType::kBF16};
constexpr CastOp kE5m2ToBf16{"e5m2_to_bf16", DType::kE5M2, DType::kBF16};

// Every cast launcher: raw device pointers (bits of the op's element types), count, stream.
using CastLaunch = Status (*)(const void* src, void* dst, int64_t n, cudaStream_t stream);

// The checks every cast launcher starts with; `align_in`/`align_out` are the widths it relies on.
inline Status validate_cast(const CastOp& op, const void* src, void* dst, int64_t n, int align_in,
                            int align_out, int min_arch = 80) {
  const int in_size = dtype_size(op.in), out_size = dtype_size(op.out);
  return Check()
      .not_null(src, "src")
      .not_null(dst, "dst")
      .positive(n, "n")
      .aligned(src, align_in > in_size ? align_in : in_size, "src")
      .aligned(dst, align_out > out_size ? align_out : out_size, "dst")
      .disjoint(src, n * in_size, dst, n * out_size, "src and dst")
      .arch_at_least(min_arch)
      .status();
}

inline Version cast_version(const CastOp& op, const char* id, const char* summary,
                            CastLaunch launch, std::vector<SassFact> sass = {},
                            Kind kind = Kind::kVersion) {
  Version v = version_of(kChapter, op.name, id, summary, kind, std::move(sass));
  v.launch = [op, launch](const Args& a, cudaStream_t stream) -> Status {
    Status s = Check()
                   .that(a.inputs.size() == 1 && a.outputs.size() == 1, "a cast takes src and dst")
                   .status();
    if (!s.ok()) return s;
    const TensorRef &src = a.inputs[0], &dst = a.outputs[0];
    s = Check()
            .that(src.dtype == op.in, std::string(op.name) + ": src must be " + dtype_name(op.in))
            .that(dst.dtype == op.out, std::string(op.name) + ": dst must be " + dtype_name(op.out))
            .that(src.numel() == dst.numel(), "src and dst differ in element count")
            .status();
    if (!s.ok()) return s;
    return launch(src.data, dst.data, src.numel(), stream);
  };
  v.bytes = [](const Args& a) {
    return double(a.inputs.at(0).bytes() + a.outputs.at(0).bytes());
  };
  v.flops = [](const Args&) { return 0.0; };
  return v;
}

// Grid for one thread per `per_thread` elements.
inline int64_t blocks_for(int64_t n, int per_thread, int threads) {
  const int64_t work = (n + per_thread - 1) / per_thread;
  return (work + threads - 1) / threads;
}

}  // namespace lkw::formats
