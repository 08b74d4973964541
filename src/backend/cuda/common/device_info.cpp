// device_info.cpp: the device profile as queried, and the one the kernels run under.
#include "backend/cuda/common/device_info.h"

#include <deque>
#include <mutex>

namespace lily::cuda {

DeviceProfile query_device_profile() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceProfile p;
  p.name = "device", p.card = prop.name;
  p.compute_capability = 10 * prop.major + prop.minor;
  p.multiprocessors = prop.multiProcessorCount;
  p.shared_per_block = int(prop.sharedMemPerBlockOptin);
  p.l2_bytes = prop.l2CacheSize;
  p.memory_bytes = int64_t(prop.totalGlobalMem);
  // Double data rate: two transfers a clock over the bus (kHz x bits -> GB/s).
  const double clock_khz = device_attribute(cudaDevAttrMemoryClockRate);
  const double bus_bits = device_attribute(cudaDevAttrGlobalMemoryBusWidth);
  p.bandwidth_gbs = 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9;
  p.sm90a_code = build_has_sm90a();
  return p;
}

namespace {
// Every profile ever set stays (a reference from current_device_profile() never dangles).
std::mutex profile_mutex;
std::deque<DeviceProfile> profiles;
}  // namespace

const DeviceProfile& current_device_profile() {
  std::lock_guard<std::mutex> lock(profile_mutex);
  if (profiles.empty()) profiles.push_back(query_device_profile());
  return profiles.back();
}

void set_current_device_profile(const DeviceProfile& profile) {
  std::lock_guard<std::mutex> lock(profile_mutex);
  profiles.push_back(profile);
}

}  // namespace lily::cuda
