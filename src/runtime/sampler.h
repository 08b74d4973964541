// sampler.h: turning one row of logits into the next token.
//
// Order of operations (as vLLM and llama.cpp apply them): penalties on the raw logits
// (repetition, then presence and frequency over the generated tokens), temperature, then
// the top-k, top-p and min-p filters, then a draw from the remaining distribution.
// Temperature 0 (or top_k 1) is greedy: the arg max, ties to the lowest id.
// Cost per token at the real vocabulary (248,320): one pass over the logits plus a partial sort
// of only as many candidates as the filters keep; never a sort of the whole vocabulary.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"     // TokenLogit
#include "backend/token_draw.h"  // DrawParams, Penalties

namespace lily {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;       // 0: off
  float top_p = 1.0f;  // 1: off
  float min_p = 0.0f;  // 0: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // 1: off
  std::optional<uint64_t> seed;     // none: a random seed
  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
  DrawParams draw() const { return {temperature, top_p, min_p}; }
  Penalties penalties() const { return {presence_penalty, frequency_penalty, repetition_penalty}; }
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// One token of the distribution a draw is made from, and its probability.
struct TokenProbability {
  int32_t token = 0;
  double probability = 0;
};

class Sampler {
 public:
  // vocab_limit: ids at or above it are never produced (the padded tail of the vocabulary).
  Sampler(const SamplingParams& params, int32_t vocab_limit);

  // Picks the next token from `logits` (modified in place by penalties and filters).
  // `history` holds the tokens generated so far (penalties count only those).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

  // How many of the best logits decide this sampler's draw: 1 when greedy, top_k when top-k is
  // on; 0 when it needs the whole row (penalties change logits first, or no top-k).
  int candidates_needed() const;
  // The same once the penalties are applied to the row (a backend that applies them where the
  // logits are: Backend::chain_tokens): 1 when greedy, top_k when top-k is on, else 0.
  int candidates_after_penalties() const;
  // The same draw as sample() from the row's candidates_needed() best logits, in the order
  // Backend::forward_candidates gives them (descending, ties to the lower id): same tokens for
  // the same seed, with a whole row never leaving the backend.
  int32_t sample_candidates(std::span<const TokenLogit> candidates);

  // The distribution sample() draws from for this row (modified in place by the penalties): the
  // tokens it may pick, with probabilities summing to 1 (greedy: the arg max alone), in the order
  // sample() walks them. Speculative sampling (speculative.h) accepts a draft with its probability
  // here and draws the rejections from what is left of it.
  void distribution(std::span<float> logits, std::span<const int32_t> history, std::vector<TokenProbability>& out);
  // One uniform of the stream (the next draw's): speculative sampling's acceptance test.
  double uniform() { return next_uniform(); }
  // A draw among `choices` by their probabilities (need not sum to 1; one uniform).
  int32_t draw_from(std::span<const TokenProbability> choices);

  // The stream of uniforms the draws take, one per sampled token (draw_uniform(seed(), i) for the
  // i-th; greedy picks take none): a backend that draws where the logits are continues it from
  // draws() (Backend::chain_tokens).
  uint64_t seed() const { return seed_; }
  uint64_t draws() const { return draws_; }

 private:
  int32_t sample_top_k(std::span<const float> logits, int32_t n);
  bool has_penalties() const;
  int32_t sample_whole_vocabulary(std::span<const float> logits, int32_t n);

  SamplingParams params_;
  int32_t vocab_limit_;
  double next_uniform() { return draw_uniform(seed_, draws_++); }

  uint64_t seed_ = 0;
  uint64_t draws_ = 0;
  std::vector<float> weights_;          // exp((logit - max) / temperature) per token (reused)
  std::vector<int32_t> ids_;            // candidate order (reused)
  std::vector<TokenLogit> candidates_;  // (reused)
};

// log softmax of the raw logits for `token`, and the `top` most likely tokens (for the API's logprobs).
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t vocab_limit);
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n, int32_t vocab_limit);

}  // namespace lily
