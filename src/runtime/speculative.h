// speculative.h: decoding with drafts of the model's own MTP head (spec §6; docs/speculative.md).
//
// Each step drafts K tokens by chaining the head (Backend::forward_mtp, its post-norm row m fed
// back with the drafted token), verifies them in one forward of the main model over the last
// token and the K drafts (Backend::forward_hidden: the logits and hidden rows of every row), and
// keeps the longest prefix that plain decoding would have produced, then the main model's own
// token after it: 1 to K + 1 tokens a step.
//
//   greedy    draft k is kept iff it is the token sample() picks from verify row k - 1
//   sampling  draft d (a point mass of the head's, q(d) = 1) is kept with probability p(d), p the
//             sampler's processed distribution of its row (penalties, temperature, top-k/p, min-p,
//             the grammar's mask: Sampler::distribution); else the token is drawn from p without
//             d, renormalized, which is normalize(max(0, p - q)). Either way the token has
//             probability p, so the output is plain sampling's in distribution (not draw for
//             draw: the uniforms are spent differently; still one stream per seed)
//
// The state after a step is the one plain decoding would leave: the sequence holds the prompt and
// every token but the last (rewound with SequenceState::keep_row_states / rewind, or, where the
// state refuses, restored to a snapshot and the kept tokens replayed), and the head's cache holds
// the teacher-forced rows 0 .. length - 1: row i = (h_i of the main model, x_{i+1}), the last with
// the last token, never a chained row. So the next step, the next turn of a conversation (the
// session cache) and a snapshot taken at a token all find the head where it belongs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "runtime/generate.h"

namespace lily {

// generate() with request.speculate drafts a step (1 to kMaxSpeculate): the same tokens as plain
// decoding (greedy), the same distribution (sampling), the same stop tokens, grammar, logprobs,
// max_new_tokens and on_token; result.speculation says what the drafts did. A backend or model
// without the head is refused with Backend::mtp_unavailable() before anything runs.
GenerateResult speculative_generate(Backend& backend, SequenceState& state, const GenerateRequest& request,
                                    const TokenCallback& on_token);

// speculative_generate() a round at a time, for a caller that runs several requests (the batch
// generator): start() appends the rest of the prompt (the state holds a prefix of it, the head
// fed as prefill_with_head leaves it), draws and delivers the first token; step() runs one
// draft-verify-cut step. Each returns false once the request has ended (a stop token, the
// grammar's end, max_new_tokens, on_token saying stop); result() then holds what
// speculative_generate() returns, less decode_seconds (the caller times its rounds). The request
// is checked when constructed (as speculative_generate() checks it); the decoder keeps copies of
// it and of on_token, and the state and the request's grammar must outlive it.
class SpeculativeDecoder {
 public:
  SpeculativeDecoder(Backend& backend, SequenceState& state, const GenerateRequest& request, TokenCallback on_token);
  ~SpeculativeDecoder();
  SpeculativeDecoder(const SpeculativeDecoder&) = delete;
  SpeculativeDecoder& operator=(const SpeculativeDecoder&) = delete;

  bool start();
  bool step();
  GenerateResult& result();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws, naming --speculate, unless `drafts` is in [0, kMaxSpeculate] and, when it is not 0,
// the backend runs the MTP head (its mtp_unavailable() sentence). For the commands, before they
// load anything else or run.
void check_speculate(const Backend& backend, int drafts);

// Appends tokens[0 : count] of a prompt to `state`, which holds tokens[0 : state.length()], with
// the MTP head fed beside it: its cache ends with row count - 1 = (h_{count-1}, tokens[count]),
// so tokens.size() > count. A prefill that speculative decoding resumes from (a snapshot point
// of the session cache) without a gap in the head's cache.
void prefill_with_head(Backend& backend, SequenceState& state, std::span<const int32_t> tokens, int64_t count);

}  // namespace lily
