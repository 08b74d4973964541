// decode_graph.cpp: see decode_graph.h.
#include "backend/cuda/decode_graph.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "backend/cuda/common/pdl_graph.h"

namespace lily::cuda {

DecodeGraph::DecodeGraph(DecodeStep& step, int vocab_size, bool pdl, cudaStream_t stream)
    : step_(step), vocab_size_(vocab_size), pdl_(pdl), stream_(stream) {
  next_token_ = DeviceBuffer(4);
  candidates_ = DeviceBuffer(kMaxTopCandidates * sizeof(Candidate));
  candidate_scratch_ = DeviceBuffer(top_candidates_scratch_bytes(vocab_size));
  mask_ = DeviceBuffer(mask_words() * 8);
  host_mask_words_ = mask_words();
  CUDA_CHECK(cudaMallocHost(&host_mask_, host_mask_words_ * 8));
  CUDA_CHECK(cudaMallocHost(&host_token_, 4));
  CUDA_CHECK(cudaMallocHost(&host_ring_, kRing * 4));
  CUDA_CHECK(cudaMallocHost(&host_candidates_, kMaxTopCandidates * sizeof(Candidate)));
  CUDA_CHECK(cudaMallocHost(&host_logits_, size_t(vocab_size) * 4));
}

DecodeGraph::~DecodeGraph() {
  cudaFreeHost(host_token_);
  cudaFreeHost(host_ring_);
  cudaFreeHost(host_candidates_);
  cudaFreeHost(host_logits_);
  cudaFreeHost(host_mask_);
}

void DecodeGraph::step(CudaSequenceState& s, int32_t token, float* host_logits) {
  write_token(token);
  launch(s);
  if (host_logits)
    CUDA_CHECK(cudaMemcpyAsync(host_logits_, step_.logits(), size_t(vocab_size_) * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (host_logits) std::memcpy(host_logits, host_logits_, size_t(vocab_size_) * 4);
  s.advance_host(1);
}

void DecodeGraph::step_candidates(CudaSequenceState& s, int32_t token, int count, int32_t vocab_limit,
                                  const AllowedTokens* allowed, std::vector<TokenLogit>& out) {
  LILY_CHECK(count >= 1 && count <= kMaxTopCandidates, "{} candidates (1 to {})", count, kMaxTopCandidates);
  const int n = std::min(vocab_limit, vocab_size_);
  if (allowed) {
    LILY_CHECK(allowed->fill && allowed->words * 64 >= size_t(n),
               "an allowed-token mask of {} words does not cover the {} ids selected over", allowed->words, n);
    // Before the launch: freeing pinned memory would wait for the step. The last step that read
    // this buffer synchronized, so nothing reads it now.
    if (allowed->words > host_mask_words_) {
      CUDA_CHECK(cudaFreeHost(host_mask_));
      host_mask_ = nullptr, host_mask_words_ = 0;
      CUDA_CHECK(cudaMallocHost(&host_mask_, allowed->words * 8));
      host_mask_words_ = allowed->words;
    }
  }
  write_token(token);
  launch(s);
  const uint64_t* mask = nullptr;
  if (allowed) {
    try {
      allowed->fill(std::span(host_mask_, allowed->words));  // while the GPU runs the step
    } catch (...) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // the step happened: keep the host's count
      s.advance_host(1);
      throw;
    }
    // The words of the ids below vocab_size (what the selection reads; a grammar's vocabulary
    // may be longer), after the step in stream order.
    const size_t words = std::min(allowed->words, mask_words());
    CUDA_CHECK(cudaMemcpyAsync(mask_.get(), host_mask_, words * 8, cudaMemcpyHostToDevice, stream_));
    mask = mask_.as<uint64_t>();
  }
  top_candidates(step_.logits(), n, count, mask, candidate_scratch_.get(), candidates_.as<Candidate>(), stream_);
  CUDA_CHECK(cudaMemcpyAsync(host_candidates_, candidates_.get(), size_t(count) * sizeof(Candidate),
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  s.advance_host(1);
  out.clear();
  for (int i = 0; i < count; ++i)
    if (host_candidates_[i].id != INT32_MAX) out.push_back({host_candidates_[i].id, host_candidates_[i].value});
}

std::vector<int32_t> DecodeGraph::greedy(CudaSequenceState& s, int32_t first_token, int count) {
  write_token(first_token);
  std::vector<int32_t> out;
  std::vector<cudaEvent_t> events(kRing);
  for (auto& e : events) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  int64_t issued = 0, received = 0;
  // Keep up to kRing steps in flight; the host only waits for a token when the ring is full.
  while (received < count) {
    while (issued < count && issued - received < kRing) {
      launch(s);  // writes the arg max into the step's input slot for the next step
      CUDA_CHECK(cudaMemcpyAsync(host_ring_ + issued % kRing, next_token_.get(), 4, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaEventRecord(events[size_t(issued % kRing)], stream_));
      ++issued;
    }
    CUDA_CHECK(cudaEventSynchronize(events[size_t(received % kRing)]));
    out.push_back(host_ring_[received % kRing]);
    ++received;
  }
  for (auto& e : events) cudaEventDestroy(e);
  s.advance_host(count);
  return out;
}

// `token` into the step's input slot, through pinned memory, in stream order.
void DecodeGraph::write_token(int32_t token) {
  *host_token_ = token;
  CUDA_CHECK(cudaMemcpyAsync(step_.token(), host_token_, 4, cudaMemcpyHostToDevice, stream_));
}

// The step, then argmax into next_token and next_token into the step's input slot: the graph of
// s, captured the first time.
void DecodeGraph::launch(CudaSequenceState& s) {
  if (!s.step_graph) {
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    step_.record(s, stream_);
    argmax(step_.logits(), vocab_size_, next_token_.as<int32_t>(), stream_);
    CUDA_CHECK(cudaMemcpyAsync(step_.token(), next_token_.get(), 4, cudaMemcpyDeviceToDevice, stream_));
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    if (step_.observer()) step_.observer()->captured(graph);
    s.step_graph = instantiate(graph);
    CUDA_CHECK(cudaGraphDestroy(graph));
  }
  CUDA_CHECK(cudaGraphLaunch(s.step_graph, stream_));
}

// The captured step with programmatic kernel-to-kernel edges (pdl_graph.h); if the driver refuses
// that graph, the plain one.
cudaGraphExec_t DecodeGraph::instantiate(cudaGraph_t graph) const {
  cudaGraphExec_t exec = nullptr;
  if (pdl_) {
    cudaGraph_t programmatic = nullptr;
    CUDA_CHECK(cudaGraphClone(&programmatic, graph));
    make_edges_programmatic(programmatic);
    const cudaError_t e = cudaGraphInstantiate(&exec, programmatic, 0);
    CUDA_CHECK(cudaGraphDestroy(programmatic));
    if (e == cudaSuccess) return exec;
    (void)cudaGetLastError();
    static bool warned = false;
    if (!warned)
      std::fprintf(stderr, "lily: the decode graph with programmatic edges failed (%s); plain graph\n",
                   cudaGetErrorString(e));
    warned = true;
  }
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  return exec;
}

}  // namespace lily::cuda
