// Status: what every launcher returns. A launcher validates its arguments before it touches the
// GPU, so a bad call comes back as a message, never as an out-of-bounds write or a hang.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace lkw {

enum class Code { kOk, kInvalidArgument, kUnsupportedArch, kNoDevice, kCudaError };

inline const char* code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kUnsupportedArch: return "unsupported architecture";
    case Code::kNoDevice: return "no CUDA device";
    case Code::kCudaError: return "CUDA error";
  }
  return "?";
}

struct Status {
  Code code = Code::kOk;
  std::string message;

  static Status ok_status() { return {}; }
  bool ok() const { return code == Code::kOk; }
  std::string str() const { return ok() ? "ok" : std::string(code_name(code)) + ": " + message; }
};

inline Status error(Code code, std::string message) { return Status{code, std::move(message)}; }

// The status of the launch just made (configuration errors show up here, not later).
inline Status last_launch_status(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return error(Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

// Compute capability of the current device as 10*major+minor (90 for an H200), or -1 without one.
inline int device_arch() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return -1;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return major * 10 + minor;
}

// Argument checks, written as one chain at the top of a launcher:
//   Status s = Check().not_null(src, "src").positive(n, "n").aligned(src, 16, "src").status();
// The first failed check wins; the arch check comes last so bad arguments are reported (and
// tested) on machines without a GPU.
class Check {
 public:
  Check& that(bool cond, const std::string& what) {
    if (status_.ok() && !cond) status_ = error(Code::kInvalidArgument, what);
    return *this;
  }
  Check& not_null(const void* p, const char* name) {
    return that(p != nullptr, std::string(name) + " is a null pointer");
  }
  Check& positive(int64_t v, const char* name) {
    return that(v > 0, std::string(name) + " must be > 0 (got " + std::to_string(v) + ")");
  }
  Check& multiple_of(int64_t v, int64_t m, const char* name) {
    return that(v % m == 0, std::string(name) + " = " + std::to_string(v) +
                                " must be a multiple of " + std::to_string(m));
  }
  Check& aligned(const void* p, int bytes, const char* name) {
    return that(reinterpret_cast<uintptr_t>(p) % bytes == 0,
                std::string(name) + " must be " + std::to_string(bytes) + "-byte aligned");
  }
  Check& disjoint(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes,
                  const char* what) {
    auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
    bool apart = a0 + a_bytes <= b0 || b0 + b_bytes <= a0;
    return that(apart, std::string(what) + " must not overlap");
  }
  // Minimum compute capability (80, 89, 90); the device is only asked if all else passed.
  Check& arch_at_least(int min_arch) {
    if (!status_.ok()) return *this;
    int arch = device_arch();
    if (arch < 0) {
      status_ = error(Code::kNoDevice, "no CUDA device is available");
    } else if (arch < min_arch) {
      status_ = error(Code::kUnsupportedArch, "needs sm_" + std::to_string(min_arch) +
                                                  " or newer, device is sm_" +
                                                  std::to_string(arch));
    }
    return *this;
  }
  Status status() const { return status_; }

 private:
  Status status_;
};

}  // namespace lkw
