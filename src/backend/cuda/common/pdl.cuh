// pdl.cuh: programmatic dependent launch (PDL) inside the decode graph.
//
// The decode step is ~250 small dependent kernels, each a few microseconds long: the gap
// between one kernel's last block and the next kernel's first useful load (launch, block
// scheduling, the first memory latency) is a large part of the step. decode_graph.cpp turns the
// kernel-to-kernel edges of the captured step into programmatic edges, so a kernel's blocks are
// launched while its predecessor is still running. Every kernel that can be in the graph
// therefore begins with
//     [loads that depend on nothing the predecessors write: weight prefetches]
//     pdl_wait();               // the predecessor has finished and its writes are visible
//     pdl_launch_dependents();  // let the successor's blocks be scheduled now
// The prefill pass launches its kernels with programmatic stream serialization instead
// (pdl_launch.cuh), each kernel waiting before it reads anything. Without a programmatic edge
// (tests, PDL off) both are no-ops.
//
// The launch-order contract, for every kernel of the step:
//   - what the direct predecessor writes is read only after pdl_wait();
//   - what a kernel two or more launches back wrote may be read before it: a kernel's blocks are
//     launched only once every block of its predecessor has passed that predecessor's
//     pdl_wait(), which returns when the kernel two back has finished. Read such data through L2
//     (__ldcg): this SM's L1 may still hold an older step's copy;
//   - pdl_launch_dependents() comes right after pdl_wait(), never before it (the rule above
//     holds only then).
// moe/moe_decode.h lists what the MoE's three launches read on which side of their wait.
// Below sm_90 (no griddepcontrol) both are no-ops: the kernel plan launches nothing with a
// programmatic edge there (device_profile.h), so every kernel starts after its predecessor ends.
#pragma once

#include "backend/cuda/common/arch.cuh"

namespace lily::cuda {

#if LILY_SM90_CODE
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#else
__device__ __forceinline__ void pdl_wait() {}
__device__ __forceinline__ void pdl_launch_dependents() {}
#endif

// The 128-byte line at p into L2 (weights the kernel will stream; safe before pdl_wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

}  // namespace lily::cuda
