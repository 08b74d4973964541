// candidate_backends.h: wrapping backends for the tests of generate()'s decode paths. A wrapped
// backend's forward() rows, optionally edited (poisoned, NaN), and Backend::forward_candidates
// either not offered (the whole-row path) or done on the host from that row: what the CUDA
// backend does on the device (top_candidates.cu), the reference its GPU path is compared with;
// and Backend::chain_tokens the same way (HostChain: what the CUDA backend's chain does).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/token_draw.h"
#include "base/error.h"
#include "runtime/sampler.h"  // top_logprobs, token_logprob: the whole row's logprobs

namespace lily::test {

// Backend::forward_candidates' selection: the `count` largest of row[0, vocab_limit) in
// descending order, ties to the lower id, NaN never; only ids whose bit is set in `mask` when
// it is not empty (bit i % 64 of word i / 64).
inline std::vector<TokenLogit> select_candidates(std::span<const float> row, int count, int32_t vocab_limit,
                                                 std::span<const uint64_t> mask = {}) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < vocab_limit; ++i) {
    const bool allowed = mask.empty() || ((mask[size_t(i) >> 6] >> (i & 63)) & 1);
    if (allowed && !std::isnan(row[size_t(i)])) ids.push_back(i);
  }
  const size_t k = std::min(size_t(count), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
    return row[size_t(a)] > row[size_t(b)] || (row[size_t(a)] == row[size_t(b)] && a < b);
  });
  std::vector<TokenLogit> out;
  for (size_t i = 0; i < k; ++i) out.push_back({ids[i], row[size_t(ids[i])]});
  return out;
}

// The token a chain's step chooses from its candidates (Backend::chain_tokens' ChainChoice): the
// first, or the draw of token_draw.h with the chain's index-th uniform.
inline int32_t choose_candidate(std::span<const TokenLogit> candidates, const ChainChoice& choice, uint64_t index) {
  LILY_CHECK(!candidates.empty(), "a chained step has no candidates (every logit NaN?)");
  if (choice.count == 1) return candidates[0].token;
  std::vector<double> w(candidates.size());
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = candidate_weight(candidates[i].logit, candidates[0].logit, choice.draw.temperature);
  const double u = draw_uniform(choice.seed, choice.first_draw + index);
  return candidates[size_t(pick_weighted(w.data(), int(w.size()), choice.draw, u))].token;
}

// Backend::chain_tokens on the host, one step ahead as the contract says: the step that appends a
// token runs before next() returns it (unless it was the last of `steps`), and a step's choice is
// made when next() is called for its token (under a grammar, its mask filled then): the logprobs
// of the raw row when asked, the penalties on the row, the selection, -inf candidates left out
// under a mask, the draw.
class HostChain final : public TokenChain {
 public:
  HostChain(Backend& backend, SequenceState& state, int32_t token, int64_t steps, const ChainChoice& choice)
      : backend_(backend), state_(state), steps_(steps), choice_(choice) {
    LILY_CHECK(steps >= 1, "a chain of {} steps", steps);
    for (int32_t t : choice.history) ++counts_[t];
    step(token);
  }
  ChainedToken next() override {
    LILY_CHECK(returned_ < steps_, "a chain of {} steps asked for token {}", steps_, returned_ + 1);
    std::vector<float> raw;  // the row before the penalties, for its logprobs
    if (choice_.top_logprobs >= 0) raw = row_;
    ChainedToken out;
    out.id = choose();
    if (choice_.top_logprobs >= 0) {
      out.logprob = token_logprob(raw, out.id, choice_.vocab_limit).logprob;
      for (const TokenLogprob& t : top_logprobs(raw, choice_.top_logprobs, choice_.vocab_limit))
        out.top.push_back({t.token, t.logprob});
    }
    if (++returned_ < steps_) step(out.id);
    return out;
  }

 private:
  void step(int32_t token) { backend_.forward(state_, std::span<const int32_t>(&token, 1), LogitsWanted::last, row_); }
  int32_t choose() {
    if (choice_.penalties.any())
      for (auto [id, count] : counts_) row_[size_t(id)] = penalized_logit(row_[size_t(id)], count, choice_.penalties);
    std::vector<uint64_t> mask;
    if (choice_.allowed) {
      mask.assign(choice_.allowed->words, 0xA5A5A5A5A5A5A5A5u);  // poisoned: fill must write every word
      choice_.allowed->fill(mask);
    }
    std::vector<TokenLogit> candidates = select_candidates(row_, choice_.count, choice_.vocab_limit, mask);
    if (choice_.allowed) std::erase_if(candidates, [](const TokenLogit& c) { return !(c.logit > -INFINITY); });
    const int32_t chosen = choose_candidate(candidates, choice_, uint64_t(chosen_++));
    ++counts_[chosen];
    return chosen;
  }

  Backend& backend_;
  SequenceState& state_;
  const int64_t steps_;
  const ChainChoice choice_;
  int64_t returned_ = 0, chosen_ = 0;
  std::vector<float> row_;         // the last step's logits, its choice not made yet
  std::map<int32_t, int> counts_;  // the generated tokens: history, then the chain's
};

// Wraps a backend: its forward() rows go through `edit` (the row, and how many forward rows this
// wrapper handed out before it); forward_candidates is offered or not (`mode`) and counted.
class WrappedBackend : public Backend {
 public:
  enum class Mode {
    whole_row,     // forward_candidates is the base's "not offered": generate() takes the row
    candidates,    // selected on the host from the (edited) row, the allowed ids only
    ignores_mask,  // selected on the host, AllowedTokens ignored (a broken backend)
    chained,       // candidates, and chain_tokens on the host (HostChain), masks included
  };
  using Edit = std::function<void(std::span<float> row, int rows_before)>;

  WrappedBackend(Backend& inner, Mode mode, Edit edit = {}) : inner_(inner), mode_(mode), edit_(std::move(edit)) {}

  std::string name() const override { return "wrapped(" + inner_.name() + ")"; }
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return inner_.new_sequence(capacity); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    inner_.forward(state, tokens, wanted, logits);
    const size_t V = size_t(config().vocab_size);
    if (edit_)
      for (size_t r = 0; r + V <= logits.size(); r += V) edit_(std::span(logits.data() + r, V), rows_++);
  }
  bool forward_candidates(SequenceState& state, int32_t token, int count, int32_t vocab_limit,
                          const AllowedTokens* allowed, std::vector<TokenLogit>& out) override {
    if (mode_ == Mode::whole_row) return false;
    ++calls;
    last_count = count;
    std::vector<uint64_t> mask;
    if (allowed) {
      ++masked_calls;
      mask.assign(allowed->words, 0xA5A5A5A5A5A5A5A5u);  // poisoned: fill must write every word
      allowed->fill(mask);
      if (mode_ == Mode::ignores_mask) mask.clear();
    }
    std::vector<float> row;
    forward(state, std::span<const int32_t>(&token, 1), LogitsWanted::last, row);
    out = select_candidates(row, count, vocab_limit, mask);
    return true;
  }

  std::unique_ptr<TokenChain> chain_tokens(SequenceState& state, int32_t token, int64_t steps,
                                           const ChainChoice& choice) override {
    if (mode_ != Mode::chained) return nullptr;
    ++chains;
    if (choice.allowed) ++masked_chains;
    last_choice = choice;
    return std::make_unique<HostChain>(*this, state, token, steps, choice);
  }

  int calls = 0, masked_calls = 0, last_count = 0, chains = 0, masked_chains = 0;
  ChainChoice last_choice;

 private:
  Backend& inner_;
  Mode mode_;
  Edit edit_;
  int rows_ = 0;
};

}  // namespace lily::test
