// device_info.h: what the launchers and the kernel plan ask of the device, queried once (one
// device per process). Internal to backend/cuda.
#pragma once

#include <algorithm>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/device_profile.h"

namespace lily::cuda {

// An attribute of the current device.
inline int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, n = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&n, attribute, device));
  return n;
}

// The current device as queried: cudaGetDeviceProperties and the memory clock (device_info.cpp).
DeviceProfile query_device_profile();

// The profile the kernels run under (one device per process): the device as queried until a
// backend sets its own (CudaBackendOptions::device_profile: a forced profile's SM count and
// shared-memory limit then hold for every launcher). Host-only tests set one to size workspaces
// without a device.
const DeviceProfile& current_device_profile();
void set_current_device_profile(const DeviceProfile& profile);

// The multiprocessor count grids are sized by (one block per SM, split counts): the profile's (the
// card's own unless forced; a forced one has at most as many).
inline int multiprocessor_count() { return current_device_profile().multiprocessors; }

// The most dynamic shared memory a block may ask for (opt-in): the profile's.
inline int max_dynamic_shared_bytes() { return current_device_profile().shared_per_block; }

// Refused (naming `what`) where a launch would ask for more dynamic shared memory than the
// profile allows: no kernel asks for more than the profile's card has.
inline void check_dynamic_shared(size_t bytes, const char* what) {
  LILY_CHECK(bytes <= size_t(max_dynamic_shared_bytes()),
             "{} needs {} bytes of shared memory a block; the device profile {} allows {}", what, bytes,
             current_device_profile().name, max_dynamic_shared_bytes());
}

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes), checked as above.
template <typename Kernel>
void allow_dynamic_shared(Kernel kernel, size_t bytes, const char* what) {
  check_dynamic_shared(bytes, what);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// For launchers whose launches ask for up to `most` bytes (each launch then checked with
// check_dynamic_shared): the attribute set to `most`, or to the profile's limit where it is lower.
template <typename Kernel>
void allow_dynamic_shared_up_to(Kernel kernel, size_t most, const char* what) {
  allow_dynamic_shared(kernel, std::min(most, size_t(max_dynamic_shared_bytes())), what);
}

// The plan's older name for the profile (tests and bench/kernels describe devices with it).
using DeviceLimits = DeviceProfile;
inline DeviceLimits current_device_limits() { return current_device_profile(); }

}  // namespace lily::cuda
