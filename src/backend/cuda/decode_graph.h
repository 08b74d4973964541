// decode_graph.h: the decode step as a CUDA graph: captured once per sequence (its KV cache and
// state are baked into the graph), its kernel-to-kernel edges made programmatic (PDL, pdl.cuh),
// replayed for every token. The greedy pick (argmax) is part of the graph and writes the next
// step's input on the GPU, so greedy decoding chains steps without the host; samplers get the
// row of logits or its best candidates (selected on the GPU), or chain steps with the token drawn
// on the GPU (choose_token), the host reading each token a step behind.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/decode_step.h"
#include "backend/cuda/sampling/next_token.h"
#include "backend/cuda/sequence_state.h"

namespace lily::cuda {

class DecodeGraph {
 public:
  // pdl: programmatic edges between the kernels (without them: plain graph edges).
  DecodeGraph(DecodeStep& step, int vocab_size, bool pdl, cudaStream_t stream);
  ~DecodeGraph();
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;

  // One step of s after `token`; the logits row into host_logits (nullptr: none). Synchronizes.
  void step(CudaSequenceState& s, int32_t token, float* host_logits);
  // One step after `token`, then the `count` best logits below vocab_limit, selected on the GPU
  // (Backend::forward_candidates' contract), among the ids `allowed` allows when not null: its
  // mask is filled on the host while the step runs (the graph launch returns at once), straight
  // into a pinned buffer, then copied to the device in stream order ahead of the selection.
  // Synchronizes.
  void step_candidates(CudaSequenceState& s, int32_t token, int count, int32_t vocab_limit,
                       const AllowedTokens* allowed, std::vector<TokenLogit>& out);
  // `count` greedy steps after first_token, chained on the GPU: each step's arg max is the next
  // step's input; up to kRing steps in flight, the tokens copied back asynchronously.
  std::vector<int32_t> greedy(CudaSequenceState& s, int32_t first_token, int count);
  // Up to `steps` steps after `token`, each step's token chosen on the GPU from its candidates
  // (top_candidates, then choose_token; among a grammar's allowed ids, its mask filled on the
  // host while the step computes) and read by the next step there (Backend::chain_tokens'
  // contract): the chain launches the step that appends a token before it waits for that token,
  // so the GPU runs a step while the host handles the token before it.
  std::unique_ptr<TokenChain> chain(CudaSequenceState& s, int32_t token, int64_t steps, const ChainChoice& choice);

 private:
  class Chain;
  static constexpr int kRing = 8;
  size_t mask_words() const { return (size_t(vocab_size_) + 63) / 64; }  // of a mask over the vocabulary
  void write_token(int32_t token);
  void reserve_host_mask(size_t words);
  void reserve_logprobs();
  void launch(CudaSequenceState& s);  // captures s's graph on first use
  cudaGraphExec_t instantiate(cudaGraph_t graph) const;

  DecodeStep& step_;
  const int vocab_size_;
  const bool pdl_;
  cudaStream_t stream_;
  DeviceBuffer next_token_;  // int32 [1]: the greedy pick of the last step
  DeviceBuffer candidates_, candidate_scratch_;
  // A chain's generated tokens for its penalties (TokenCounts), allocated by the first chain
  // with penalties: counts and seen int32 [vocab], seen_count int32 [1]; history int32 [n], the
  // tokens generated before the chain (grown as needed).
  DeviceBuffer counts_, seen_, seen_count_, history_;
  size_t history_capacity_ = 0;
  // A chain's logprobs (ChooseLogprobs), allocated by the first chain that asks: the log-partition's
  // parts (double [2 kPartitionBlocks]), the raw row's best (Candidate [kMaxChainLogprobs]), the
  // penalized tokens' raw logits (float [vocab]); out through pinned rings, kRing slots.
  DeviceBuffer partials_, raw_top_, raw_logits_;
  float* host_logprob_ring_ = nullptr;    // pinned [kRing]
  Candidate* host_top_ring_ = nullptr;    // pinned [kRing, kMaxChainLogprobs]
  DeviceBuffer mask_;                     // uint64 [ceil(vocab / 64)]: the allowed ids of this step
  uint64_t* host_mask_ = nullptr;         // pinned [host_mask_words_]: the mask on its way in,
  size_t host_mask_words_ = 0;            // rewritten only after the step that read it synchronized
  int32_t* host_token_ = nullptr;         // pinned: the step's input on its way in
  int32_t* host_ring_ = nullptr;          // pinned [kRing]: greedy tokens on their way out, a
                                          // chain's picks (choose_token writes them there)
  Candidate* host_candidates_ = nullptr;  // pinned [kMaxTopCandidates]
  float* host_logits_ = nullptr;          // pinned [vocab]: one row (a device-to-pageable copy
                                          // is staged by the driver at a fraction of the bandwidth)
};

}  // namespace lily::cuda
