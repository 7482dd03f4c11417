// Chapter 08's host planning and tile schedule, apart from the kernel bodies: which output tiles a
// persistent block takes, in which order, and how many blocks run.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace lkw::fp8 {

// The SMs of the current device (a persistent grid has one block per SM), 132 on an H200.
inline int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  return std::max(sms, 1);
}

// Output tiles of block_m × block_n, numbered M-fastest: the blocks that run at once take
// neighbouring tiles, which share their B rows (a weight tile is read from HBM once and then from
// L2 by the other blocks of its column). Block b takes tiles b, b + grid, b + 2·grid, ...
struct TileSchedule {
  int tiles_m, tiles_n, block_m, block_n;

  __host__ __device__ int count() const { return tiles_m * tiles_n; }
  __device__ void origin(int tile, int* m0, int* n0) const {
    *m0 = (tile % tiles_m) * block_m;
    *n0 = (tile / tiles_m) * block_n;
  }
};

inline TileSchedule plan_tiles(int64_t m, int64_t n, int block_m, int block_n) {
  return {int((m + block_m - 1) / block_m), int((n + block_n - 1) / block_n), block_m, block_n};
}

// One block per SM, or per tile when there are fewer tiles.
inline int persistent_grid(const TileSchedule& s) { return std::min(s.count(), sm_count()); }

}  // namespace lkw::fp8
