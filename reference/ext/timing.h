// Host entry points of the extension that need CUDA code of their own (the L2-flushing timer).
#pragma once
#include <cuda_runtime.h>

#include <functional>

#include "lkw/registry.h"

namespace lkw::ext {

struct TimeResult {
  double median_us, min_us, max_us;
  int iters;
};

// Times `launch(i)` (i = launch index, for rotating input sets) with the harness's event timer.
TimeResult time_launches(const std::function<Status(int)>& launch, int warmup, int iters,
                         bool flush_l2);

// Back to back: `iters` batches of `batch` launches with nothing between them, events around
// each batch; the per-launch time of each batch (lkw::Timer::time_back_to_back).
TimeResult time_back_to_back(const std::function<Status(int)>& launch, int warmup, int iters, int batch);

// In a CUDA graph: `batch` launches (launch(i, stream)) captured once, the graph launched `iters`
// times; the per-launch time of each graph launch (lkw::Timer::time_in_graph).
TimeResult time_in_graph(const std::function<Status(int, cudaStream_t)>& launch, int warmup, int iters,
                         int batch);

// One flush kernel (the timer's): dirty lines left in L2 by the previous kernel go to DRAM now.
void flush_l2();

struct DeviceInfo {
  bool present = false;
  std::string name;
  int arch = 0, sms = 0, driver = 0, runtime = 0;
  long long l2_bytes = 0, memory_bytes = 0;
};
DeviceInfo device_info();

}  // namespace lkw::ext
