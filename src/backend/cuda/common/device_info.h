// device_info.h: what the launchers and the kernel plan ask of the device, queried once (one
// device per process). Internal to backend/cuda.
#pragma once

#include "backend/cuda/common/cuda_check.h"

namespace lily::cuda {

// An attribute of the current device.
inline int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, n = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&n, attribute, device));
  return n;
}

// The current device's multiprocessor count: grids of one block per SM, split counts.
inline int multiprocessor_count() {
  static const int count = device_attribute(cudaDevAttrMultiProcessorCount);
  return count;
}

// The most dynamic shared memory a block of the current device may ask for (opt-in).
inline int max_dynamic_shared_bytes() {
  static const int bytes = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return bytes;
}

// The device properties the kernel plan decides by (kernel_plan.h). Tests describe a device of
// their own, so the plan can be checked without one.
struct DeviceLimits {
  int multiprocessors = 132;    // the H200's
  int compute_capability = 90;  // major * 10 + minor: 90 has wgmma (the build targets sm_90a)
};

inline DeviceLimits current_device_limits() {
  return DeviceLimits{multiprocessor_count(), 10 * device_attribute(cudaDevAttrComputeCapabilityMajor) +
                                                  device_attribute(cudaDevAttrComputeCapabilityMinor)};
}

}  // namespace lily::cuda
