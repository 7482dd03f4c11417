// Host planning of v5's split-K, kept apart from the kernel: how many splits of K a launch takes,
// and the workspace the splits meet in. Host-tested (tests/cpp/07_w4a16_gemm/host_checks.cu).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "lkw/launch.h"  // kernel_fit
#include "lkw/status.h"

namespace lkw::w4a16 {

constexpr int64_t kMinKTilesPerSplit = 4;  // a split streams at least 256 k: its ring must fill

// Splits of K for `tiles` output tiles of `k_tiles` stages on `sms` SMs holding `blocks_per_sm`
// blocks each: none once the tiles alone fill every resident slot (large M); else as many as fill
// the slots, each split keeping at least kMinKTilesPerSplit stages. At M = 1 on 8192 × 28672 the
// 32 tiles would leave 100 of 132 SMs idle; twelve splits put a block on every slot.
inline int splits_for(int64_t tiles, int64_t k_tiles, int sms, int blocks_per_sm) {
  const int64_t slots = int64_t(sms) * std::max(blocks_per_sm, 1);
  if (tiles >= slots) return 1;
  const int64_t by_slots = slots / tiles, by_k = k_tiles / kMinKTilesPerSplit;
  return int(std::max<int64_t>(1, std::min(by_slots, by_k)));
}

// An even cut of k_tiles stages into S splits: each gets `base`, the first `extra` one more. The
// division happens here, on the host: in a kernel it would cost a convert-and-iterate sequence.
struct SplitCut {
  int64_t base;
  int extra;
};
inline SplitCut split_cut(int64_t k_tiles, int splits) { return {k_tiles / splits, int(k_tiles % splits)}; }

// The stages [begin, end) of split s.
__host__ __device__ inline void split_range(SplitCut cut, int s, int64_t* begin, int64_t* end) {
  *begin = s * cut.base + (s < cut.extra ? s : cut.extra);
  *end = *begin + cut.base + (s < cut.extra ? 1 : 0);
}

// The split-K workspace: FP32 partial tiles and per-tile arrival counters, allocated on first need
// and grown (never shrunk) for the process. The counters are zeroed here once and every launch
// leaves them at zero. Launches that share it must be ordered (one stream).
inline Status split_workspace(int64_t floats, int64_t tiles, float** partials, unsigned** arrivals) {
  static std::mutex mutex;
  static float* partials_gl = nullptr;
  static unsigned* arrivals_gl = nullptr;
  static int64_t have_floats = 0, have_tiles = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (floats > have_floats) {
    cudaFree(partials_gl);
    have_floats = 0;
    if (cudaMalloc(&partials_gl, floats * sizeof(float)) != cudaSuccess)
      return error(Code::kCudaError, std::string("split-K workspace: ") + cudaGetErrorString(cudaGetLastError()));
    have_floats = floats;
  }
  if (tiles > have_tiles) {
    cudaFree(arrivals_gl);
    have_tiles = 0;
    if (cudaMalloc(&arrivals_gl, tiles * sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(arrivals_gl, 0, tiles * sizeof(unsigned)) != cudaSuccess)
      return error(Code::kCudaError, std::string("split-K counters: ") + cudaGetErrorString(cudaGetLastError()));
    have_tiles = tiles;
  }
  *partials = partials_gl;
  *arrivals = arrivals_gl;
  return {};
}

}  // namespace lkw::w4a16
