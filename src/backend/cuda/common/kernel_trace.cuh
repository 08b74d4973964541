// kernel_trace.cuh: the device side of kernel_trace.h. In a kernel:
//     trace::BlockTrace trace(trace::kind_prefetch_gemv);   // first statement
//     ...; trace.mark(1);  ...  trace.mark(4);               // its phases (t[1..4])
// and the destructor stamps the end and writes the block's record. Thread (0, 0, 0) of the block
// does all of it: one atomic at the start (its result is needed only at the end), a timer read
// per mark, one 64-byte store at the end. Without LILY_KERNEL_TRACE all of it is empty.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/kernel_trace.h"

namespace lily::cuda::trace {

#ifdef LILY_KERNEL_TRACE

namespace {
// This translation unit's copy of the log pointer (no relocatable device code: each .cu file has
// its own), set by Session through the setter registered below.
__device__ Log* g_log = nullptr;
void set_log(Log* log) { cudaMemcpyToSymbol(g_log, &log, sizeof log); }
[[maybe_unused]] const int g_registered = register_log_setter(&set_log);
}  // namespace

__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool block_leader() { return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0; }

class BlockTrace {
 public:
  __device__ explicit BlockTrace(Kind kind) : kind_(kind) {
    if (!block_leader()) return;
    t_[0] = now();
#pragma unroll
    for (int i = 1; i < kMarks; ++i) t_[i] = 0;
    log_ = g_log;
    slot_ = log_ ? atomicAdd(&log_->count, 1u) : ~0u;
  }
  __device__ void mark(int i) {
    if (block_leader()) t_[i] = now();
  }
  __device__ ~BlockTrace() {
    if (!block_leader() || !log_ || slot_ >= log_->capacity) return;
    t_[kMarks - 1] = now();
    Record& r = log_->records[slot_];
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    r.kind = kind_, r.sm = sm, r.unused = 0;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
#pragma unroll
    for (int i = 0; i < kMarks; ++i) r.t[i] = t_[i];
  }

 private:
  uint64_t t_[kMarks];
  Log* log_ = nullptr;
  uint32_t slot_ = ~0u;
  Kind kind_;
};

#else

class BlockTrace {
 public:
  __device__ explicit BlockTrace(Kind) {}
  __device__ void mark(int) {}
};

#endif

}  // namespace lily::cuda::trace
