// generate.h: the prefill-then-decode loop of one request.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "runtime/sampler.h"

namespace lily::grammar {
class GrammarMatcher;
}

namespace lily {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // the whole prompt; the state may already hold a prefix of it
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // generation ends after one of these
  int32_t vocab_limit = 0;           // ids >= this are never sampled (0: the model's vocab_size)
  int top_logprobs = -1;             // -1: no logprobs; 0: the chosen token's; n: and the n most likely
  // Constrained decoding (grammar/matcher.h), or none. Each step the sampler draws among the
  // tokens the grammar allows: the logits it forbids become -inf before the sampler sees them
  // (its penalties, temperature and filters then act on the allowed tokens only), or, when the
  // sampler needs only the best few (Sampler::candidates_needed), the backend selects them among
  // the allowed ids (Backend::chain_tokens or forward_candidates with AllowedTokens; the same
  // draw). The token
  // drawn advances the grammar, and the grammar's end (must_stop, or a stop token it accepted)
  // ends the generation with FinishReason::stop. Logprobs stay the model's own (whole row).
  grammar::GrammarMatcher* grammar = nullptr;
  // Speculative decoding (speculative.h): drafts of the model's MTP head a step, 1 to
  // kMaxSpeculate; 0: plain decoding. The same tokens (greedy) or the same distribution
  // (sampling) either way; a backend without the head is refused (Backend::mtp_unavailable).
  int speculate = 0;
};

constexpr int kMaxSpeculate = 8;  // most drafts a step (a verify of 9 rows)

// What speculation did (GenerateRequest::speculate > 0): per draft position k (0-based), the
// drafts made and accepted there; and the verify steps (each yields 1 to drafts + 1 tokens).
struct SpeculationStats {
  std::vector<int64_t> drafted, accepted;  // [speculate]
  int64_t steps = 0;
  int64_t step_tokens = 0;  // tokens the steps yielded (the first, from the prefill, not among them)
  int64_t replays = 0;      // steps cut back by restoring a snapshot and replaying (no rewind)
  void add(const SpeculationStats& other);
};

struct GeneratedToken {
  int32_t id = 0;
  std::optional<TokenLogprob> logprob;
  std::vector<TokenLogprob> top;
};

enum class FinishReason { stop, length, cancelled };
const char* to_string(FinishReason reason);

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated, the stop token included
  FinishReason finish = FinishReason::length;
  int64_t prompt_tokens = 0;  // the whole prompt
  int64_t cached_tokens = 0;  // prompt tokens already in the state (not recomputed)
  double prefill_seconds = 0, decode_seconds = 0;
  // Of decode_seconds: filling and applying the grammar's masks (on the candidates path the mask
  // is filled while the backend's step runs on the GPU: time the step may hide).
  double grammar_seconds = 0;
  SpeculationStats speculation;
};

// Called for every generated token; return false to stop (client gone, stop string seen). It
// must not touch the sequence's state after the first token: the next step may be running.
using TokenCallback = std::function<bool(const GeneratedToken&)>;

// Prefills prompt[state.length():] and decodes. The caller guarantees that the tokens already
// in `state` are prompt[0 : state.length()].
//
// The first token comes from the prefill's logits, delivered before any decode step runs. The
// steps after it run on a chain of the backend's when it offers one and its choice is the
// sampler's (a sampler that needs only the best few logits once its penalties are applied, at
// most kMaxChainLogprobs logprobs; a grammar's mask filled for each step while it computes:
// Backend::chain_tokens; on the GPU the host then streams each token while the next step runs),
// else one at a time. Afterwards the state holds the prompt and the generated tokens fed to a
// step, state.length() of them in all: one at a time, every token but the last; on a chain, also
// the last when a stop token, the grammar's end or on_token ended the generation (the chain
// runs a step ahead). With request.speculate > 0 the decode is speculative_generate()'s
// (speculative.h): every token but the last, too, and the MTP head's cache beside it.
GenerateResult generate(Backend& backend, SequenceState& state, const GenerateRequest& request,
                        const TokenCallback& on_token);

}  // namespace lily
