// device_buffer.h: device memory owned by one object, freed on destruction. Internal to
// backend/cuda (host code).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "backend/cuda/common/cuda_check.h"

namespace lily::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(uint64_t bytes) : bytes_(bytes) { CUDA_CHECK(cudaMalloc(&p_, std::max<uint64_t>(bytes, 16))); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  uint64_t bytes() const { return bytes_; }
  // Every byte zero (stream-ordered on the legacy stream; the caller synchronizes as needed).
  void zero() const { CUDA_CHECK(cudaMemset(p_, 0, std::max<uint64_t>(bytes_, 16))); }

 private:
  void* p_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace lily::cuda
