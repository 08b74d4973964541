// next_token.h: the next token from one row of logits on the GPU: its arg max (the greedy decode
// graph, argmax.cu), or the k largest logits for samplers that need only them
// (Backend::forward_candidates, top_candidates.cu), among the ids a grammar allows when it has a
// mask: k (value, id) pairs leave the device instead of the row; or the token drawn from those
// on the GPU (Backend::chain_tokens, choose_token.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "backend/backend.h"  // kMaxChainLogprobs
#include "backend/token_draw.h"

namespace lily::cuda {

// out[0] = argmax over logits[0 : vocab_limit) (ties to the lowest id, NaN never), written as
// int32: the next decode step reads its token from there.
void argmax(const float* logits, int vocab_limit, int32_t* out, cudaStream_t stream);

constexpr int kMaxTopCandidates = 256;

struct Candidate {
  float value;
  int32_t id;  // INT32_MAX: no candidate (NaN logits, fewer than k ids)
};

// Device scratch that top_candidates needs for a row of n logits, in bytes.
size_t top_candidates_scratch_bytes(int n);

// out[0 .. k) = the k largest of logits[0 .. n) in descending order, ties to the lower id; NaN
// logits are never candidates (their slots, and any past n, hold id INT32_MAX, value -inf).
// allowed: null, or a device bitmask of ceil(n / 64) words (bit i % 64 of word i / 64: token i
// allowed; a grammar's mask); the ids it leaves out are never candidates either, like NaN ones.
// 1 <= k <= kMaxTopCandidates. out: device memory for k candidates. Several launches, no sync.
void top_candidates(const float* logits, int n, int k, const uint64_t* allowed, void* scratch, Candidate* out,
                    cudaStream_t stream);

// The tokens a chain generated, for its penalties (device): counts [vocab] int32 (zeroed at
// the start), seen [vocab] int32 (the distinct ids, in order of first use), seen_count [1] int32.
struct TokenCounts {
  int32_t* counts = nullptr;
  int32_t* seen = nullptr;
  int32_t* seen_count = nullptr;
};

// The log-partition of a row, in parts: block b of kPartitionBlocks writes (m_b, s_b) to
// partials[2b, 2b + 1], m_b the largest non-NaN logit of its share of logits[0 .. n) (-inf if
// none), s_b = sum of exp(l - m_b) over its share in double. log Z = M + log(sum_b s_b
// exp(m_b - M)), M the largest m_b (choose_token reduces them). One launch, no sync.
constexpr int kPartitionBlocks = 64;
void log_partition_partials(const float* logits, int n, double* partials, cudaStream_t stream);

// The log-probabilities choose_token writes with its pick (ChainedToken's), of the raw row: the
// logits before the penalties and the mask.
struct ChooseLogprobs {
  int top = -1;                        // -1: none; else the alternatives (<= kMaxChainLogprobs)
  const float* logits = nullptr;       // the row the pick was made on (raw where not penalized)
  const float* raw = nullptr;          // [vocab] the penalized tokens' raw logits, or null
  const double* partials = nullptr;    // log_partition_partials of the raw row
  const Candidate* raw_top = nullptr;  // [top] top_candidates of the raw row
  float* logprob = nullptr;            // out: the pick's log-probability
  Candidate* top_out = nullptr;        // out [top]: (log-probability, id); padding as raw_top's
};

// How choose_token picks among `count` candidates: the first when count is 1, else token_draw.h's
// draw with `draw` and the uniform draw_uniform(seed, index); the pick counted in `counts` when
// its pointers are set. usable_only: candidates at -inf are left out too (under a grammar's mask,
// as the host sampler leaves them out). logprobs: written with the pick when logprobs.top >= 0.
struct ChooseArgs {
  int count = 1;
  DrawParams draw;
  uint64_t seed = 0;
  uint64_t index = 0;
  TokenCounts counts;
  bool usable_only = false;
  ChooseLogprobs logprobs;
};

// The chosen candidate's id into *token (the next decode step's input; 0 when there is none) and
// *chosen (-1 when there is none: every logit NaN, or every allowed one NaN or -inf). candidates: top_candidates'
// output, `count` of them. One launch, no sync.
void choose_token(const Candidate* candidates, const ChooseArgs& args, int32_t* token, int32_t* chosen,
                  cudaStream_t stream);

// Counts tokens[0 .. n) (device, ids < vocab) in `counts`: a chain's history before its first
// step. One launch of one thread (the history is a few tokens), no sync.
void count_tokens(const int32_t* tokens, int n, const TokenCounts& counts, cudaStream_t stream);

// logits[t] = penalized_logit(logits[t], counts[t], p) (token_draw.h) for every t seen so far, in
// place, before the candidates are selected; raw[t] = the logit before, when raw is not null
// ([vocab]: for the logprobs of the raw row). One launch, no sync.
void penalize_logits(float* logits, const TokenCounts& counts, const Penalties& p, float* raw, cudaStream_t stream);

}  // namespace lily::cuda
