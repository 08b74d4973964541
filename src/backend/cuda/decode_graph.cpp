// decode_graph.cpp: see decode_graph.h.
#include "backend/cuda/decode_graph.h"

#include <algorithm>
#include <array>
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
  cudaFreeHost(host_logprob_ring_);
  cudaFreeHost(host_top_ring_);
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
    reserve_host_mask(allowed->words);
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

// A chain of steps (DecodeGraph::chain). Step i (from 1) is its graph, which appends token i - 1
// (read from the step's input slot), and its selection: penalties, top_candidates, choose_token
// writing token i into the input slot and into the pinned ring's slot (i - 1) % kRing, then an
// event. next() for token i launches step i + 1's graph before it waits for step i's event, so
// at most two steps are in flight, and the one still running when the host stops appends the
// last token the host received. Without a grammar a step's selection is enqueued with its graph;
// under one, when next() is called for its token: the mask needs the grammar advanced by the
// token before, and the graph runs meanwhile. With penalties the tokens generated (the history,
// then each pick) are counted on the GPU.
class DecodeGraph::Chain final : public TokenChain {
 public:
  Chain(DecodeGraph& g, CudaSequenceState& s, int32_t token, int64_t steps, const ChainChoice& choice)
      : g_(g), s_(s), steps_(steps), choice_(choice), n_(std::min(choice.vocab_limit, g.vocab_size_)) {
    if (choice_.allowed) g_.reserve_host_mask(choice_.allowed->words);  // before anything runs
    if (choice_.top_logprobs >= 0) g_.reserve_logprobs();
    for (auto& e : events_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (choice_.penalties.any()) count_history();
    g_.write_token(token);
    launch_graph();
    if (!choice_.allowed) select();
  }

  ~Chain() override {
    // The steps in flight finish; the host's count then takes every graph launched.
    const cudaError_t e = cudaStreamSynchronize(g_.stream_);
    if (e != cudaSuccess) std::fprintf(stderr, "lily: a decode chain's last steps failed: %s\n", cudaGetErrorString(e));
    s_.advance_host(graphs_);
    for (auto& ev : events_) cudaEventDestroy(ev);
  }

  ChainedToken next() override {
    LILY_CHECK(returned_ < steps_, "a chain of {} steps asked for token {}", steps_, returned_ + 1);
    if (choice_.allowed) select();  // this token's step: its mask from the grammar as it is now
    if (graphs_ < steps_) {         // the step that appends the token returned below
      launch_graph();
      if (!choice_.allowed) select();
    }
    const int slot = int(returned_ % kRing);
    CUDA_CHECK(cudaEventSynchronize(events_[size_t(slot)]));
    ++returned_;
    ChainedToken out;
    out.id = g_.host_ring_[slot];
    LILY_CHECK(out.id >= 0, "decode step {} of a chain has no token to choose: every logit it may choose is NaN{}",
               returned_,
               choice_.allowed ? " or -inf (the model gave no usable logit for any token the grammar allows)" : "");
    if (choice_.top_logprobs >= 0) {
      out.logprob = g_.host_logprob_ring_[slot];
      const Candidate* top = g_.host_top_ring_ + size_t(slot) * kMaxChainLogprobs;
      for (int j = 0; j < choice_.top_logprobs && top[j].id != INT32_MAX; ++j)
        out.top.push_back({top[j].id, top[j].value});
    }
    return out;
  }

 private:
  // The next step's graph: it appends the token in the input slot.
  void launch_graph() {
    g_.launch(s_);
    ++graphs_;
  }

  // The selection of the next step whose token is not chosen yet: the grammar's mask (filled now,
  // uploaded in stream order), the penalties, the candidates, the pick into the input slot and
  // straight into its pinned ring slot (mapped: one address space), read after the event.
  void select() {
    const uint64_t* mask = nullptr;
    if (choice_.allowed) {
      choice_.allowed->fill(std::span(g_.host_mask_, choice_.allowed->words));
      const size_t words = std::min(choice_.allowed->words, g_.mask_words());
      CUDA_CHECK(cudaMemcpyAsync(g_.mask_.get(), g_.host_mask_, words * 8, cudaMemcpyHostToDevice, g_.stream_));
      mask = g_.mask_.as<uint64_t>();
    }
    const int slot = int(selected_ % kRing);
    float* logits = g_.step_.logits();
    ChooseLogprobs logprobs;
    if (choice_.top_logprobs >= 0) {  // of the raw row: before the penalties change it
      log_partition_partials(logits, n_, g_.partials_.as<double>(), g_.stream_);
      if (choice_.top_logprobs > 0)
        top_candidates(logits, n_, choice_.top_logprobs, nullptr, g_.candidate_scratch_.get(),
                       g_.raw_top_.as<Candidate>(), g_.stream_);
      logprobs = {choice_.top_logprobs,
                  logits,
                  choice_.penalties.any() ? g_.raw_logits_.as<float>() : nullptr,
                  g_.partials_.as<double>(),
                  g_.raw_top_.as<Candidate>(),
                  g_.host_logprob_ring_ + slot,
                  g_.host_top_ring_ + size_t(slot) * kMaxChainLogprobs};
    }
    float* raw = choice_.top_logprobs >= 0 && choice_.penalties.any() ? g_.raw_logits_.as<float>() : nullptr;
    if (choice_.penalties.any()) penalize_logits(logits, counts_, choice_.penalties, raw, g_.stream_);
    top_candidates(logits, n_, choice_.count, mask, g_.candidate_scratch_.get(), g_.candidates_.as<Candidate>(),
                   g_.stream_);
    const ChooseArgs args{choice_.count,
                          choice_.draw,
                          choice_.seed,
                          choice_.first_draw + uint64_t(selected_),
                          choice_.penalties.any() ? counts_ : TokenCounts{},
                          choice_.allowed != nullptr,
                          logprobs};
    choose_token(g_.candidates_.as<Candidate>(), args, g_.step_.token(), g_.host_ring_ + slot, g_.stream_);
    CUDA_CHECK(cudaEventRecord(events_[size_t(slot)], g_.stream_));
    ++selected_;
  }

  // Zeroed counts, then the history's tokens counted, ahead of the first step in stream order.
  void count_history() {
    const size_t V = size_t(g_.vocab_size_), n = choice_.history.size();
    if (!g_.counts_.get()) {
      g_.counts_ = DeviceBuffer(V * 4);
      g_.seen_ = DeviceBuffer(V * 4);
      g_.seen_count_ = DeviceBuffer(4);
    }
    if (n > g_.history_capacity_) {
      g_.history_ = DeviceBuffer(n * 4);
      g_.history_capacity_ = n;
    }
    counts_ = {g_.counts_.as<int32_t>(), g_.seen_.as<int32_t>(), g_.seen_count_.as<int32_t>()};
    CUDA_CHECK(cudaMemsetAsync(counts_.counts, 0, V * 4, g_.stream_));
    CUDA_CHECK(cudaMemsetAsync(counts_.seen_count, 0, 4, g_.stream_));
    if (n == 0) return;
    // A pageable copy returns once the bytes are staged: the vector may go after it.
    CUDA_CHECK(cudaMemcpyAsync(g_.history_.get(), choice_.history.data(), n * 4, cudaMemcpyHostToDevice, g_.stream_));
    count_tokens(g_.history_.as<int32_t>(), int(n), counts_, g_.stream_);
  }

  DecodeGraph& g_;
  CudaSequenceState& s_;
  const int64_t steps_;
  const ChainChoice choice_;
  const int n_;  // ids selected over
  TokenCounts counts_;
  std::array<cudaEvent_t, kRing> events_{};
  int64_t graphs_ = 0, selected_ = 0, returned_ = 0;
};

std::unique_ptr<TokenChain> DecodeGraph::chain(CudaSequenceState& s, int32_t token, int64_t steps,
                                               const ChainChoice& choice) {
  LILY_CHECK(steps >= 1, "a decode chain of {} steps", steps);
  LILY_CHECK(choice.count >= 1 && choice.count <= kMaxTopCandidates, "a decode chain choosing among {} (1 to {})",
             choice.count, kMaxTopCandidates);
  LILY_CHECK(choice.vocab_limit >= 1, "a decode chain choosing below id {}", choice.vocab_limit);
  LILY_CHECK(choice.top_logprobs <= kMaxChainLogprobs, "a decode chain with {} logprobs a token (at most {})",
             choice.top_logprobs, kMaxChainLogprobs);
  LILY_CHECK(!choice.allowed || (choice.allowed->fill &&
                                 choice.allowed->words * 64 >= size_t(std::min(choice.vocab_limit, vocab_size_))),
             "a decode chain's allowed-token mask of {} words does not cover the ids selected over",
             choice.allowed ? choice.allowed->words : 0);
  for (int32_t t : choice.history)
    LILY_CHECK(t >= 0 && t < vocab_size_, "a decode chain's history holds token {}, outside the vocabulary [0, {})", t,
               vocab_size_);
  return std::make_unique<Chain>(*this, s, token, steps, choice);
}

// The buffers of a chain's logprobs, allocated once.
void DecodeGraph::reserve_logprobs() {
  if (partials_.get()) return;
  partials_ = DeviceBuffer(2 * kPartitionBlocks * sizeof(double));
  raw_top_ = DeviceBuffer(kMaxChainLogprobs * sizeof(Candidate));
  raw_logits_ = DeviceBuffer(size_t(vocab_size_) * 4);
  CUDA_CHECK(cudaMallocHost(&host_logprob_ring_, kRing * sizeof(float)));
  CUDA_CHECK(cudaMallocHost(&host_top_ring_, kRing * kMaxChainLogprobs * sizeof(Candidate)));
}

// Room for a mask of `words` in the pinned staging buffer. Called before a launch: freeing pinned
// memory would wait for the step. The last step that read this buffer synchronized, so nothing
// reads it now.
void DecodeGraph::reserve_host_mask(size_t words) {
  if (words <= host_mask_words_) return;
  CUDA_CHECK(cudaFreeHost(host_mask_));
  host_mask_ = nullptr, host_mask_words_ = 0;
  CUDA_CHECK(cudaMallocHost(&host_mask_, words * 8));
  host_mask_words_ = words;
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
