// decode_token.h: what the decode loops share about one token (generate.cpp's loop of one
// request, batch_generate.cpp's steps of several): the checks of a request against its state,
// the draw from a row of logits (logprobs of the raw row, the grammar's mask, the sampler, the
// grammar advanced) and the hand-over of each token to the caller.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "runtime/generate.h"

namespace lily::decode_token {

// The request's preconditions on `state` and the backend (a prompt not yet processed, room for
// max_new_tokens, a grammar that covers the ids sampled and has not ended); throws with the
// reason. Returns the ids sampled over: [0, vocab limit).
int32_t check_request(const Backend& backend, const SequenceState& state, const GenerateRequest& request);

// Sets the logits the grammar does not allow next to -inf; returns the seconds it took. mask:
// reused scratch.
double mask_logits(grammar::GrammarMatcher& grammar, std::vector<uint64_t>& mask, std::span<float> logits);
// Advances the grammar by the token sampled from its masked logits or allowed candidates. A
// token it refuses means the sampler drew outside the mask: no allowed logit was a number (NaN
// or -inf everywhere), or a backend's candidates ignored the mask.
void advance(grammar::GrammarMatcher& grammar, int32_t token);

// The next token from a whole row of logits (modified in place): logprobs of the raw row when
// asked, the grammar's forbidden ids at -inf, the sampler's draw (penalties over result.tokens),
// the grammar advanced by it (a token it refuses: no allowed logit was usable). mask: reused
// scratch; the grammar's time goes to result.grammar_seconds.
GeneratedToken sample_row(Sampler& sampler, std::vector<float>& logits, const GenerateRequest& request, int32_t limit,
                          std::vector<uint64_t>& mask, GenerateResult& result);

// The next token from the backend's best candidates (Backend::forward_candidates) where they
// decide the draw: under a grammar those at -inf are left out (none left: no allowed token has a
// usable logit) and the grammar is advanced by the token.
GeneratedToken sample_candidates(Sampler& sampler, std::vector<TokenLogit>& candidates, const GenerateRequest& request);

// Hands a generated token to the caller; false when the generation ends with it (a stop token,
// the grammar's end, the caller's refusal), result.finish then set.
bool deliver(const GeneratedToken& token, const GenerateRequest& request, const TokenCallback& on_token,
             GenerateResult& result);

}  // namespace lily::decode_token
