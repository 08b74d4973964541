// candidate_backends.h: wrapping backends for the tests of generate()'s decode paths. A wrapped
// backend's forward() rows, optionally edited (poisoned, NaN), and Backend::forward_candidates
// either not offered (the whole-row path) or done on the host from that row: what the CUDA
// backend does on the device (top_candidates.cu), the reference its GPU path is compared with.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

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

// Wraps a backend: its forward() rows go through `edit` (the row, and how many forward rows this
// wrapper handed out before it); forward_candidates is offered or not (`mode`) and counted.
class WrappedBackend : public Backend {
 public:
  enum class Mode {
    whole_row,     // forward_candidates is the base's "not offered": generate() takes the row
    candidates,    // selected on the host from the (edited) row, the allowed ids only
    ignores_mask,  // selected on the host, AllowedTokens ignored (a broken backend)
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

  int calls = 0, masked_calls = 0, last_count = 0;

 private:
  Backend& inner_;
  Mode mode_;
  Edit edit_;
  int rows_ = 0;
};

}  // namespace lily::test
