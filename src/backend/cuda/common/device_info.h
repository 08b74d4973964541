// device_info.h: what the launchers ask of the device, queried once (one device per process).
// Internal to backend/cuda.
#pragma once

#include "backend/cuda/common/cuda_check.h"

namespace lily::cuda {

// The current device's multiprocessor count: grids of one block per SM, split counts.
inline int multiprocessor_count() {
  static const int count = [] {
    int device = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
}

}  // namespace lily::cuda
