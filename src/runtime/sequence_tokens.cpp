#include "runtime/sequence_tokens.h"

#include <algorithm>

#include "base/error.h"
#include "runtime/speculative.h"

namespace lily {

SequenceTokens::SequenceTokens(CachedSequence sequence, std::span<const int32_t> prompt)
    : sequence_(std::move(sequence)), tokens_(prompt.begin(), prompt.end()), prompt_length_(int64_t(prompt.size())) {
  const std::vector<int32_t>& held = sequence_.tokens;
  LILY_CHECK(sequence_.state && int64_t(held.size()) == sequence_.state->length(),
             "internal: a cached sequence lists {} tokens for a state of {}", held.size(),
             sequence_.state ? sequence_.state->length() : 0);
  LILY_CHECK(held.size() <= prompt.size() && std::equal(held.begin(), held.end(), prompt.begin()),
             "internal: a cached sequence of {} tokens is not a prefix of the prompt of {}", held.size(),
             prompt.size());
  sequence_.tokens.clear();
}

std::span<const int32_t> SequenceTokens::reply() const {
  return std::span<const int32_t>(tokens_).subspan(size_t(prompt_length_));
}

void SequenceTokens::prefill_to(Backend& backend, int64_t length, bool with_head) {
  LILY_CHECK(in_state() < length && length <= int64_t(tokens_.size()),
             "internal: prefill to {} tokens, with {} in the state and {} known", length, in_state(), tokens_.size());
  if (with_head && length < int64_t(tokens_.size()))
    return prefill_with_head(backend, *sequence_.state, tokens_, length);
  std::vector<float> unused;
  std::span<const int32_t> part(tokens_.data() + in_state(), size_t(length - in_state()));
  backend.forward(*sequence_.state, part, LogitsWanted::none, unused);
}

GenerateResult SequenceTokens::generate(Backend& backend, GenerateRequest request, const TokenCallback& on_token) {
  request.prompt = tokens_;
  GenerateResult result = lily::generate(backend, *sequence_.state, request, on_token);
  append(result.tokens);
  return result;
}

uint64_t SequenceTokens::join(BatchGenerator& batch, GenerateRequest request, TokenCallback on_token,
                              PrefillStop stop) {
  request.prompt = tokens_;
  return batch.add(request, *sequence_.state, std::move(on_token), std::move(stop));
}

void SequenceTokens::append(std::span<const int32_t> ids) {
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  produced_ += int64_t(ids.size());
}

CachedSequence SequenceTokens::take() && {
  sequence_.tokens.assign(tokens_.begin(), tokens_.begin() + in_state());
  return std::move(sequence_);
}

}  // namespace lily
