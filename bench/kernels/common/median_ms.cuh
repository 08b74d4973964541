// median_ms.cuh: the timer of the kernel workbench programs (bench/kernels/*): the median over
// `timed` calls of f, each between two events on `stream`, after `warmup` untimed calls. f gets
// the call's number (warm-ups included), for programs that rotate over copies of their inputs.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "backend/cuda/common/cuda_check.h"

namespace lily::bench {

inline double median_ms(const std::function<void(int)>& f, int timed = 20, int warmup = 3,
                        cudaStream_t stream = nullptr) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f(i);
  std::vector<float> ms;
  for (int i = 0; i < timed; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    f(warmup + i);
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

inline double median_ms(const std::function<void()>& f, int timed = 20, int warmup = 3, cudaStream_t stream = nullptr) {
  return median_ms([&](int) { f(); }, timed, warmup, stream);
}

}  // namespace lily::bench
