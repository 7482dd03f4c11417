// Host side of the tensor-memory accelerator: the CUtensorMap a TMA copy reads its box through.
// The encoder is a driver function; it is fetched once through the runtime (no -lcuda link).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "lkw/status.h"

namespace lkw {

// A row-major matrix [rows, cols] of `type` (elem_bytes each) read in boxes of box_rows ×
// box_cols; boxes past the matrix's edge arrive zero-filled. TMA's own rules, checked here: a
// 16-byte aligned base, a row pitch that is a multiple of 16 bytes, boxes of at most 256 per side
// (and 128 bytes across under the 128-byte swizzle).
inline Status tensor_map_2d(CUtensorMap* map, const void* base, CUtensorMapDataType type,
                            int elem_bytes, int64_t rows, int64_t cols, int box_rows, int box_cols,
                            CUtensorMapSwizzle swizzle) {
  const std::string what = "a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] tensor map";
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0 || (cols * elem_bytes) % 16 != 0)
    return error(Code::kInvalidArgument, what + " needs a 16-byte aligned base and row pitch");
  if (rows < 1 || cols < 1 || box_rows < 1 || box_rows > 256 || box_cols < 1 || box_cols > 256)
    return error(Code::kInvalidArgument, what + ": empty, or a box side outside 1..256");
  if (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && box_cols * elem_bytes > 128)
    return error(Code::kInvalidArgument, what + ": a 128-byte swizzled box is at most 128 bytes across");
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not the next launch's error
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return error(Code::kCudaError, "the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};  // innermost first
  const cuuint64_t pitch[1] = {cuuint64_t(cols) * elem_bytes};      // bytes from row to row
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t step[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<void*>(base), dims, pitch, box, step,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return error(Code::kCudaError,
                 "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for " + what);
  return {};
}

// BF16 [rows, cols] in boxes of box_rows × 64 (128 bytes: one 128-byte swizzle span, the layout
// that wgmma's K-major operand descriptor names).
inline Status tensor_map_bf16_sw128(CUtensorMap* map, const void* base, int64_t rows, int64_t cols,
                                    int box_rows) {
  return tensor_map_2d(map, base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, cols, box_rows, 64,
                       CU_TENSOR_MAP_SWIZZLE_128B);
}

// One-byte elements (FP8, INT8) [rows, cols] in boxes of box_rows × 128: the same 128-byte swizzle
// span, here 128 values of k (an FP8 wgmma operand).
inline Status tensor_map_u8_sw128(CUtensorMap* map, const void* base, int64_t rows, int64_t cols,
                                  int box_rows) {
  return tensor_map_2d(map, base, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, cols, box_rows, 128,
                       CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace lkw
