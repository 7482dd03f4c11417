#include "lkw/timer.cuh"
#include "timing.h"

namespace lkw::ext {

Timer& timer() {
  static Timer t;  // owns the 2×L2 flush buffer; made once
  return t;
}

void flush_l2() {
  timer().flush();
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
}

TimeResult time_launches(const std::function<Status(int)>& launch, int warmup, int iters,
                         bool flush_l2) {
  TimerOptions opt;
  opt.warmup = warmup;
  opt.iters = iters;
  opt.flush_l2 = flush_l2;
  const Timing t = timer().time(launch, opt);
  return {t.median_us, t.min_us, t.max_us, t.iters};
}

TimeResult time_back_to_back(const std::function<Status(int)>& launch, int warmup, int iters, int batch) {
  const Timing t = timer().time_back_to_back(launch, warmup, iters, batch);
  return {t.median_us, t.min_us, t.max_us, t.iters};
}

TimeResult time_in_graph(const std::function<Status(int, cudaStream_t)>& launch, int warmup, int iters,
                         int batch) {
  const Timing t = timer().time_in_graph(launch, warmup, iters, batch);
  return {t.median_us, t.min_us, t.max_us, t.iters};
}

DeviceInfo device_info() {
  DeviceInfo info;
  if (!has_device()) return info;
  int dev = 0;
  cudaDeviceProp prop{};
  LKW_CUDA_CHECK(cudaGetDevice(&dev));
  LKW_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  info.present = true;
  info.name = prop.name;
  info.arch = prop.major * 10 + prop.minor;
  info.sms = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.memory_bytes = static_cast<long long>(prop.totalGlobalMem);
  cudaDriverGetVersion(&info.driver);
  cudaRuntimeGetVersion(&info.runtime);
  return info;
}

}  // namespace lkw::ext
