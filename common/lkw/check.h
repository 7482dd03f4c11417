// CUDA error checks that carry the failing expression, file, line and the driver's message.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "lkw/status.h"

namespace lkw {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess) {
    throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                    cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
}

inline void status_check(const Status& s, const char* expr, const char* file, int line) {
  if (!s.ok()) {
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                             " returned " + s.str());
  }
}

inline bool has_device() { return device_arch() > 0; }

}  // namespace lkw

#define LKW_CUDA_CHECK(expr) ::lkw::cuda_check((expr), #expr, __FILE__, __LINE__)
#define LKW_STATUS_CHECK(expr) ::lkw::status_check((expr), #expr, __FILE__, __LINE__)
