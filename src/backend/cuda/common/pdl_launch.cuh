// pdl_launch.cuh: kernel launches with programmatic dependent launch on a stream, for the prefill
// pass (the decode graph gets its programmatic edges from pdl_graph.h instead). While a
// ProgrammaticLaunches scope is on in this thread, launch_after_wait lets the kernel's blocks be
// scheduled while the stream's previous kernel finishes; outside one it is a plain launch. Every
// kernel launched through it begins with pdl_wait() (pdl.cuh), before any load or store, so it
// still runs after all of its predecessor's work. What it saves: the launch gap at each of a
// pass's ~20 kernels a layer. The prefill plan says for which passes (kernel_plan.h).
// Host code in .cu files (cudaLaunchKernelEx's template); the scope is programmatic_launches.h.
#pragma once

#include <utility>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/programmatic_launches.h"

namespace lily::cuda {

template <typename... Params, typename... Args>
void launch_after_wait(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = ProgrammaticLaunches::on() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace lily::cuda
