// pass_graph.cpp: see pass_graph.h.
#include "backend/cuda/pass_graph.h"

#include <cstring>

#include "backend/cuda/common/cuda_check.h"

namespace lily::cuda {

PassGraph::PassGraph(PrefillPass& pass, int vocab_size, int max_tokens, cudaStream_t stream)
    : pass_(pass), vocab_size_(vocab_size), max_tokens_(max_tokens), stream_(stream) {
  LILY_CHECK(max_tokens >= 1 && max_tokens <= PrefillPass::kLogitRows, "pass graphs of up to {} tokens (1 to {})",
             max_tokens, PrefillPass::kLogitRows);
  CUDA_CHECK(cudaMallocHost(&host_tokens_, size_t(max_tokens) * 4));
  CUDA_CHECK(cudaMallocHost(&host_logits_, size_t(max_tokens) * size_t(vocab_size) * 4));
}

PassGraph::~PassGraph() {
  cudaFreeHost(host_tokens_);
  cudaFreeHost(host_logits_);
}

void PassGraph::run(CudaSequenceState& s, const int32_t* tokens, int T, int first_row, float* host_logits) {
  LILY_CHECK(T >= 1 && T <= max_tokens_ && first_row >= 0 && first_row <= T,
             "a pass graph of {} tokens (1 to {}), logits from row {}", T, max_tokens_, first_row);
  cudaGraphExec_t& graph = s.pass_graphs[{T, first_row}];
  if (!graph) graph = capture(s, T, first_row);
  std::memcpy(host_tokens_, tokens, size_t(T) * 4);
  CUDA_CHECK(cudaGraphLaunch(graph, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  s.advance_host(T);
  if (first_row < T) std::memcpy(host_logits, host_logits_, size_t(T - first_row) * size_t(vocab_size_) * 4);
}

// tokens in, the pass, logits out: the launches as the stream would run them (the pass's own
// programmatic launches become programmatic edges).
cudaGraphExec_t PassGraph::capture(CudaSequenceState& s, int T, int first_row) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  try {
    CUDA_CHECK(
        cudaMemcpyAsync(pass_.device_tokens(), host_tokens_, size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
    pass_.record(s, T, first_row, stream_);
    if (first_row < T)
      CUDA_CHECK(cudaMemcpyAsync(host_logits_, pass_.device_logits(),
                                 size_t(T - first_row) * size_t(vocab_size_) * 4, cudaMemcpyDeviceToHost, stream_));
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);  // leave the stream usable
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(e);
  return exec;
}

}  // namespace lily::cuda
