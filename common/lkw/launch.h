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

template <class Kernel, class... Params>
Status launch_with_smem(Kernel kernel, dim3 grid, int threads, int bytes, cudaStream_t stream,
                        const char* what, Params... params) {
  static std::mutex mutex;
  static std::vector<const void*> opted_in;
  {
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
  }
  kernel<<<grid, threads, bytes, stream>>>(params...);
  return last_launch_status(what);
}

}  // namespace lkw
