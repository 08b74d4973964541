// grow_only_scratch.h: a device buffer that only grows, for the launchers that keep a scratch of
// their own (the overloads without a caller's scratch, used by tests and tools; the backend
// passes its own). Internal to backend/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace lily::cuda {

class GrowOnlyScratch {
 public:
  // owner names the launcher in errors; zero_fill: zero the buffer whenever it is (re)allocated
  // (for scratch that holds counters which the kernels return to zero themselves).
  GrowOnlyScratch(const char* owner, bool zero_fill) : owner_(owner), zero_fill_(zero_fill) {}
  GrowOnlyScratch(const GrowOnlyScratch&) = delete;
  GrowOnlyScratch& operator=(const GrowOnlyScratch&) = delete;

  // At least `bytes`, stream-ordered on `stream`. Growing during a graph capture is an error (run
  // the launch once before capturing); the old buffer is freed in stream order.
  void* get(size_t bytes, cudaStream_t stream);

 private:
  const char* owner_;
  bool zero_fill_;
  void* buffer_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lily::cuda
