// A kernel launch with more than 48 KB of dynamic shared memory: that needs the kernel's opt-in
// (cudaFuncAttributeMaxDynamicSharedMemorySize), set once per kernel and checked; the launch's own
// status is returned (a configuration error shows up here, not at the next call).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "lkw/status.h"

namespace lkw {

// The kernel's opt-in to `bytes` of dynamic shared memory, made once per kernel.
template <class Kernel>
Status opt_in_smem(Kernel kernel, int bytes, const char* what) {
  static std::mutex mutex;
  static std::vector<const void*> opted_in;
  std::lock_guard<std::mutex> lock(mutex);
  const void* key = reinterpret_cast<const void*>(kernel);
  if (std::find(opted_in.begin(), opted_in.end(), key) != opted_in.end()) return {};
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return error(Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
  }
  opted_in.push_back(key);
  return {};
}

template <class Kernel, class... Params>
Status launch_with_smem(Kernel kernel, dim3 grid, int threads, int bytes, cudaStream_t stream,
                        const char* what, Params... params) {
  const Status s = opt_in_smem(kernel, bytes, what);
  if (!s.ok()) return s;
  kernel<<<grid, threads, bytes, stream>>>(params...);
  return last_launch_status(what);
}

// The same with the grid in clusters of `cluster` CTAs along x (chapter 08's v6: pairs).
struct ClusterLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attr{};
  ClusterLaunch(dim3 grid, unsigned cluster, int threads, int bytes, cudaStream_t stream) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim = {cluster, 1, 1};
    config.gridDim = grid;
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = size_t(bytes);
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points at attr
};

template <class Kernel, class... Params>
Status launch_cluster_with_smem(Kernel kernel, dim3 grid, unsigned cluster, int threads, int bytes,
                                cudaStream_t stream, const char* what, Params... params) {
  if (grid.x % cluster != 0) return error(Code::kInvalidArgument, std::string(what) + ": grid not whole clusters");
  const Status s = opt_in_smem(kernel, bytes, what);
  if (!s.ok()) return s;
  ClusterLaunch l(grid, cluster, threads, bytes, stream);
  const cudaError_t e = cudaLaunchKernelEx(&l.config, kernel, params...);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return error(Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
  }
  return last_launch_status(what);
}

// How many clusters of `cluster` CTAs of this kernel the device runs at once: a persistent grid's
// size (a GPC's SMs need not divide by the cluster, so it can be fewer than SMs / cluster). Asked
// once per kernel; 0 where the device refuses (the launch then says why).
template <class Kernel>
int max_active_clusters(Kernel kernel, unsigned cluster, int threads, int bytes) {
  static std::mutex mutex;
  static std::vector<std::pair<const void*, int>> known;
  const void* key = reinterpret_cast<const void*>(kernel);
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& k : known)
      if (k.first == key) return k.second;
  }
  int clusters = 0;
  if (opt_in_smem(kernel, bytes, "max_active_clusters").ok()) {
    ClusterLaunch l(dim3(cluster), cluster, threads, bytes, nullptr);
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &l.config) != cudaSuccess) {
      cudaGetLastError();
      clusters = 0;
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  known.emplace_back(key, clusters);
  return clusters;
}

}  // namespace lkw
