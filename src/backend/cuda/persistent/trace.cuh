// trace.cuh: the persistent decode kernel's optional timing of its tasks (StepArgs::trace, read by
// bench_persistent_step --trace and tools/persistent_trace.py). Thread 0 stamps the global timer at
// a task's marks (step_args.h: begin, ready, staged, products done, done) into the task's row,
// which the kernel points trace_row at before each task (nullptr: no trace, one branch a mark).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lily::cuda::persistent {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__shared__ uint64_t* trace_row;  // the current task's row of StepArgs::trace, or nullptr

// Stamps mark k of the current task (thread 0 only; the others return).
__device__ __forceinline__ void trace_mark(int k) {
  if (threadIdx.x == 0 && trace_row) trace_row[k] = global_ns();
}

}  // namespace lily::cuda::persistent
