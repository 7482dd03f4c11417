// DeviceBuffer: RAII device memory with a guard band behind the data. Outputs are poisoned
// before a launch (so an element the kernel never wrote fails the comparison) and the guard is
// checked after it (so a write past the end fails even without compute-sanitizer).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "lkw/check.h"

namespace lkw {

class DeviceBuffer {
 public:
  static constexpr size_t kGuardBytes = 256;
  static constexpr uint8_t kGuardByte = 0xA5;

  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    LKW_CUDA_CHECK(cudaMalloc(&data_, bytes_ + kGuardBytes));
    LKW_CUDA_CHECK(cudaMemset(static_cast<uint8_t*>(data_) + bytes_, kGuardByte, kGuardBytes));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  void upload(const void* host) { LKW_CUDA_CHECK(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice)); }
  void download(void* host) const {
    LKW_CUDA_CHECK(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost));
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(bytes_);
    download(out.data());
    return out;
  }
  // Fill with one byte: 0xFF is NaN in every float format we use and -1 / 255 in integers.
  void poison(uint8_t byte = 0xFF) { LKW_CUDA_CHECK(cudaMemset(data_, byte, bytes_)); }

  bool guard_intact() const {
    std::vector<uint8_t> guard(kGuardBytes);
    LKW_CUDA_CHECK(cudaMemcpy(guard.data(), static_cast<uint8_t*>(data_) + bytes_, kGuardBytes,
                              cudaMemcpyDeviceToHost));
    for (uint8_t b : guard)
      if (b != kGuardByte) return false;
    return true;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace lkw
