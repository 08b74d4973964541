// sequence_tokens.h: the one record of which tokens a completion's sequence state holds.
//
// A completion's tokens are its prompt, then its reply: every token generated. The state runs
// behind that list: a sequence resumed from the cache holds only a prefix of the prompt, and the
// last token generated (a stop token, the grammar's end, the last of max_tokens) is never fed
// back. Whatever the state holds is always tokens()[0 : in_state()]: each round hands generate()
// the whole list as its prompt (generate.h's contract) and appends what it generated. The
// cache's own list (CachedSequence::tokens) is cut from it when the sequence goes back, not kept
// beside it.
//
// Only this class advances the state, so the list and the state cannot drift apart.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/batch_generate.h"
#include "runtime/generate.h"
#include "runtime/prefix_cache.h"

namespace lily {

class SequenceTokens {
 public:
  // `sequence` holds a prefix of `prompt` (what PrefixCache::acquire and fresh() give; checked).
  SequenceTokens(CachedSequence sequence, std::span<const int32_t> prompt);

  const std::vector<int32_t>& tokens() const { return tokens_; }  // the prompt, then the reply
  std::span<const int32_t> reply() const;
  int64_t prompt_length() const { return prompt_length_; }
  int64_t in_state() const { return sequence_.state->length(); }
  // Reply tokens generated so far: what max_tokens is spent by.
  int64_t produced() const { return produced_; }

  // Computes tokens()[in_state() : length] into the state without logits (a point of the
  // prompt worth a snapshot); with_head: the MTP head fed beside it (prefill_with_head,
  // speculative.h), for a speculative generation to resume from.
  void prefill_to(Backend& backend, int64_t length, bool with_head = false);
  // One generation round: prefills what the state lacks, decodes, appends what was generated.
  // request.prompt is set here.
  GenerateResult generate(Backend& backend, GenerateRequest request, const TokenCallback& on_token);
  // The same round in a batch (batch_generate.h): joins `batch` with tokens() as the prompt and
  // returns the request's id; its outcome's tokens come back through finish_round(). The state
  // belongs to the batch until then.
  uint64_t join(BatchGenerator& batch, GenerateRequest request, TokenCallback on_token, PrefillStop stop = {});
  void finish_round(const GenerateResult& result) { append(result.tokens); }
  // A snapshot of the state as it is now (CachedSequence::snapshot_here).
  void snapshot_here() { sequence_.snapshot_here(); }

  // The sequence for the cache, its token list what the state holds. This object is spent.
  CachedSequence take() &&;

 private:
  void append(std::span<const int32_t> ids);

  CachedSequence sequence_;  // its `tokens` stay empty until take(): tokens_ is the record
  std::vector<int32_t> tokens_;
  int64_t prompt_length_;
  int64_t produced_ = 0;
};

}  // namespace lily
