// Scratch device memory for versions that need more than their op's outputs (a multi-kernel
// baseline's intermediate, a counting sort's counts): one buffer per device and call site, grown
// on demand (after the device has finished with the smaller one) and kept for the process. A plain
// cudaMalloc, no memset. Launches that share it must be ordered (one stream), as a decoder's are.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "lkw/status.h"

namespace lkw {

class Workspace {
 public:
  explicit Workspace(const char* what) : what_(what) {}

  // At least `bytes` on the current device in *out.
  Status get(int64_t bytes, void** out) {
    std::lock_guard<std::mutex> lock(mutex_);
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    Buffer& b = per_device_[device];
    if (e == cudaSuccess && b.bytes < bytes) {
      e = cudaDeviceSynchronize();
      if (e == cudaSuccess && b.data) e = cudaFree(b.data);
      if (e == cudaSuccess) {
        b = {};
        e = cudaMalloc(&b.data, size_t(bytes));
        if (e == cudaSuccess) b.bytes = bytes;
      }
    }
    if (e != cudaSuccess) {
      cudaGetLastError();  // an allocation failure must not surface as the next launch's error
      return error(Code::kCudaError, std::string(what_) + ": " + cudaGetErrorString(e));
    }
    *out = b.data;
    return {};
  }

 private:
  struct Buffer {
    void* data = nullptr;
    int64_t bytes = 0;
  };
  const char* what_;
  std::mutex mutex_;
  std::map<int, Buffer> per_device_;
};

}  // namespace lkw
