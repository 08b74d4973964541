// pass_graph.cpp: see pass_graph.h.
#include "backend/cuda/pass_graph.h"

#include <cstring>

#include "backend/cuda/common/cuda_check.h"

namespace lily::cuda {

PassGraph::PassGraph(PrefillPass& pass, const ModelConfig& c, int max_tokens, cudaStream_t stream)
    : pass_(pass), vocab_size_(c.vocab_size), max_tokens_(max_tokens), stream_(stream), rows_(c) {
  LILY_CHECK(max_tokens >= 1 && max_tokens <= PrefillPass::kLogitRows, "pass graphs of up to {} tokens (1 to {})",
             max_tokens, PrefillPass::kLogitRows);
  CUDA_CHECK(cudaMallocHost(&host_tokens_, size_t(max_tokens) * 4));
  CUDA_CHECK(cudaMallocHost(&host_logits_, size_t(max_tokens) * size_t(vocab_size_) * 4));
}

PassGraph::~PassGraph() {
  for (auto& [rows, graph] : batch_graphs_) cudaGraphExecDestroy(graph);
  cudaFreeHost(host_tokens_);
  cudaFreeHost(host_logits_);
}

void PassGraph::run(CudaSequenceState& s, const int32_t* tokens, int T, int first_row, float* host_logits) {
  LILY_CHECK(T >= 1 && T <= max_tokens_ && first_row >= 0 && first_row <= T,
             "a pass graph of {} tokens (1 to {}), logits from row {}", T, max_tokens_, first_row);
  cudaGraphExec_t& graph = s.pass_graphs[{T, first_row}];
  if (!graph) graph = capture(T, T - first_row, false, [&] { pass_.record(s, T, first_row, stream_); });
  std::memcpy(host_tokens_, tokens, size_t(T) * 4);
  CUDA_CHECK(cudaGraphLaunch(graph, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  s.advance_host(T);
  if (first_row < T) std::memcpy(host_logits, host_logits_, size_t(T - first_row) * size_t(vocab_size_) * 4);
}

void PassGraph::run_batch(std::span<CudaSequenceState* const> states, const int32_t* tokens, float* host_logits) {
  const int N = int(states.size());
  LILY_CHECK(N >= 1 && N <= std::min(max_tokens_, kMaxBatchRows), "a batch graph of {} rows (1 to {})", N,
             std::min(max_tokens_, kMaxBatchRows));
  cudaGraphExec_t& graph = batch_graphs_[N];
  if (!graph) graph = capture(N, N, true, [&] { pass_.record_batch(rows_, N, stream_); });
  rows_.fill(states);
  std::memcpy(host_tokens_, tokens, size_t(N) * 4);
  CUDA_CHECK(cudaGraphLaunch(graph, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (CudaSequenceState* s : states) s->advance_host(1);
  std::memcpy(host_logits, host_logits_, size_t(N) * size_t(vocab_size_) * 4);
}

// The launches as the stream would run them (the pass's own programmatic launches become
// programmatic edges).
template <typename Record>
cudaGraphExec_t PassGraph::capture(int T, int logit_rows, bool tables, const Record& record) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  try {
    CUDA_CHECK(cudaMemcpyAsync(pass_.device_tokens(), host_tokens_, size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
    if (tables) rows_.upload(stream_);
    record();
    if (logit_rows > 0)
      CUDA_CHECK(cudaMemcpyAsync(host_logits_, pass_.device_logits(), size_t(logit_rows) * size_t(vocab_size_) * 4,
                                 cudaMemcpyDeviceToHost, stream_));
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
