// pdl_graph.h: host-side edits of a captured CUDA graph for programmatic dependent launch
// (pdl.cuh has the device side). Used by the decode graph (decode_graph.cpp) and the workbench
// (bench/kernels/decode_chain); internal to backend/cuda.
#pragma once

#include <cuda_runtime.h>

namespace lily::cuda {

// Every edge between two kernel nodes becomes a programmatic dependency: the downstream kernel
// is launched once all upstream blocks have called pdl_launch_dependents (or exited), and its
// pdl_wait() returns when the upstream kernel has finished, its writes visible. Other edges
// (memory copies) stay as they are.
void make_edges_programmatic(cudaGraph_t graph);

}  // namespace lily::cuda
