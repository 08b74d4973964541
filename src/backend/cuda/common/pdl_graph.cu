// pdl_graph.cu: see pdl_graph.h.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/pdl_graph.h"

#include <vector>

namespace lily::cuda {

void make_edges_programmatic(cudaGraph_t graph) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType a, b;
    CUDA_CHECK(cudaGraphNodeGetType(from[i], &a));
    CUDA_CHECK(cudaGraphNodeGetType(to[i], &b));
    if (a != cudaGraphNodeTypeKernel || b != cudaGraphNodeTypeKernel) continue;
    cudaGraphEdgeData programmatic{};
    programmatic.from_port = cudaGraphKernelNodePortProgrammatic;
    programmatic.type = cudaGraphDependencyTypeProgrammatic;
    CUDA_CHECK(cudaGraphRemoveDependencies(graph, &from[i], &to[i], &data[i], 1));
    CUDA_CHECK(cudaGraphAddDependencies(graph, &from[i], &to[i], &programmatic, 1));
  }
}

}  // namespace lily::cuda
