// A kernel launch with more than 48 KB of dynamic shared memory: that needs the kernel's opt-in
// (cudaFuncAttributeMaxDynamicSharedMemorySize), set once per kernel and checked; the launch's own
// status is returned (a configuration error shows up here, not at the next call). And what a split
// or persistent plan asks of the device about a kernel (kernel_fit).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lkw/status.h"

namespace lkw {

// The kernel's opt-in to `bytes` of dynamic shared memory, asked of the runtime once per kernel.
template <class Kernel>
Status opt_in_smem(Kernel kernel, int bytes, const char* what) {
  static std::mutex mutex;
  static std::vector<const void*> opted_in;
  std::lock_guard<std::mutex> lock(mutex);
  const void* key = reinterpret_cast<const void*>(kernel);
  if (std::find(opted_in.begin(), opted_in.end(), key) == opted_in.end()) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return error(Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
    }
    opted_in.push_back(key);
  }
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

namespace detail {
// cudaLaunchKernelEx with `attrs` (none, PDL, a cluster shape); a refused launch's error is cleared
// and returned, then the launch's own status.
template <class... Expected, class... Params>
Status launch_ex(void (*kernel)(Expected...), dim3 grid, int threads, int bytes, cudaStream_t stream,
                 cudaLaunchAttribute* attrs, unsigned num_attrs, const char* what, Params&&... params) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = num_attrs;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Params>(params)...);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return error(Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
  }
  return last_launch_status(what);
}

// The launch attribute of clusters of `cluster` CTAs along x.
inline cudaLaunchAttribute cluster_shape(unsigned cluster) {
  cudaLaunchAttribute dims{};
  dims.id = cudaLaunchAttributeClusterDimension;
  dims.val.clusterDim.x = cluster, dims.val.clusterDim.y = 1, dims.val.clusterDim.z = 1;
  return dims;
}
}  // namespace detail

// launch_with_smem's launch as a programmatic dependent of the kernel ahead in the stream (PDL:
// it may start before that one ends; its griddepcontrol.wait orders what it reads) where `pdl` is
// on and the device is sm_90 or later, else a plain launch.
template <class... Expected, class... Params>
Status launch_dependent(void (*kernel)(Expected...), dim3 grid, int threads, int bytes, bool pdl,
                        cudaStream_t stream, const char* what, Params&&... params) {
  if (bytes > 0) {  // a kernel of static shared memory only needs no opt-in
    const Status s = opt_in_smem(kernel, bytes, what);
    if (!s.ok()) return s;
  }
  static const bool can_depend = device_arch() >= 90;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  const bool on = pdl && can_depend;
  return detail::launch_ex(kernel, grid, threads, bytes, stream, on ? &dependent : nullptr, on ? 1 : 0, what,
                           std::forward<Params>(params)...);
}

// launch_with_smem's launch with the grid in clusters of `cluster` CTAs along x (chapter 08's v5
// pairs two CTAs that share an operand by TMA multicast).
template <class... Expected, class... Params>
Status launch_cluster(void (*kernel)(Expected...), dim3 grid, unsigned cluster, int threads, int bytes,
                      cudaStream_t stream, const char* what, Params&&... params) {
  if (grid.x % cluster != 0) return error(Code::kInvalidArgument, std::string(what) + ": grid not whole clusters");
  const Status s = opt_in_smem(kernel, bytes, what);
  if (!s.ok()) return s;
  cudaLaunchAttribute dims = detail::cluster_shape(cluster);
  return detail::launch_ex(kernel, grid, threads, bytes, stream, &dims, 1, what, std::forward<Params>(params)...);
}

// How many clusters of `cluster` CTAs of kKernel the device runs at once: a persistent grid's size
// in clusters (a GPC's SMs need not divide by the cluster, so it can be fewer than SMs / cluster).
// Asked once per kernel, after its opt-in; 0 where the device refuses (the launch then says why).
template <auto kKernel>
int max_active_clusters(unsigned cluster, int threads, int bytes) {
  static const int clusters = [cluster, threads, bytes] {
    int n = 0;
    cudaLaunchAttribute dims = detail::cluster_shape(cluster);
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(cluster);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = bytes;
    config.attrs = &dims;
    config.numAttrs = 1;
    if (!opt_in_smem(kKernel, bytes, "max_active_clusters").ok() ||
        cudaOccupancyMaxActiveClusters(&n, kKernel, &config) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return clusters;
}

// The current device's SM count (at least 1), asked once per process: the grid of a persistent
// kernel, the tiles a split plan must fill.
inline int sm_count() {
  static const int sms = [] {
    int dev = 0, count = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      cudaGetLastError();  // a refused query leaves 1, not an error for the next launch to report
    return std::max(count, 1);
  }();
  return sms;
}

// The device's SM count and how many blocks of kKernel (`threads` threads, `bytes` of dynamic
// shared memory) one SM holds at once: what a plan needs to fill the GPU. Asked once per kernel
// (each instantiation of kKernel is its own template argument, hence its own static), after the
// kernel's opt-in to `bytes` of shared memory, without which the occupancy query counts none.
struct KernelFit {
  int sms = 1, per_sm = 1;
};
template <auto kKernel>
const KernelFit& kernel_fit(int threads, int bytes) {
  static const KernelFit fit = [threads, bytes] {
    KernelFit f;
    f.sms = sm_count();
    if (cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.per_sm, kKernel, threads, bytes) !=
            cudaSuccess)
      cudaGetLastError();  // a refused query leaves one block, not an error for the launch
    f.per_sm = std::max(f.per_sm, 1);
    return f;
  }();
  return fit;
}

}  // namespace lkw
