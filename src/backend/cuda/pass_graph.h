// pass_graph.h: short prefill passes as CUDA graphs (a draft's verification, a chat turn's or a
// tool result's few tokens): the pass of T tokens (prefill_pass.h, recorded from device tokens
// to device logits) captured once per sequence, T and first row of logits, between a copy of
// the tokens in and a copy of the logits out through pinned memory, then replayed. A pass of a
// few tokens is ~350 launches of a few microseconds each: replayed as a graph the host launches
// none of them. The graph bakes in the sequence's caches and state, as the decode step's does
// (its position lives on the device); the plan's pass_graphs_up_to says which T take it.
#pragma once

#include <cstdint>
#include <map>
#include <span>

#include "backend/cuda/batch_rows.h"
#include "backend/cuda/prefill_pass.h"
#include "backend/cuda/sequence_state.h"

namespace lily::cuda {

class PassGraph {
 public:
  PassGraph(PrefillPass& pass, const ModelConfig& c, int max_tokens, cudaStream_t stream);
  ~PassGraph();
  PassGraph(const PassGraph&) = delete;
  PassGraph& operator=(const PassGraph&) = delete;

  // tokens [T] (host, T <= max_tokens) through the model, appended to s; the logits of rows
  // [first_row, T) into host_logits ([T - first_row, V]; first_row == T: none). Synchronizes.
  void run(CudaSequenceState& s, const int32_t* tokens, int T, int first_row, float* host_logits);

  // A batch step (PrefillPass::record_batch): tokens[r] appended to *states[r], each row's logits
  // into host_logits [N, V]; the graph of N rows, captured once, reads the rows' tables (their
  // copy in is its first node), so it serves any N sequences. Synchronizes.
  void run_batch(std::span<CudaSequenceState* const> states, const int32_t* tokens, float* host_logits);

 private:
  // The tokens' and the tables' copies in, `record`, the logits' copy out (rows of them).
  template <typename Record>
  cudaGraphExec_t capture(int T, int logit_rows, bool tables, const Record& record);

  PrefillPass& pass_;
  const int vocab_size_, max_tokens_;
  cudaStream_t stream_;
  int32_t* host_tokens_ = nullptr;               // pinned [max_tokens]
  float* host_logits_ = nullptr;                 // pinned [max_tokens, V]
  BatchRows rows_;                               // a batch step's tables
  std::map<int, cudaGraphExec_t> batch_graphs_;  // by rows
};

}  // namespace lily::cuda
