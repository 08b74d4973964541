// test_speculative_backend.h: the random fixture tiny-a on the reference backend, and a backend
// decorating it whose MTP drafts are forced right or wrong at chosen positions, and whose states
// offer keep_row_states / rewind (or refuse them), for the speculative loop's tests.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../model/fixture.h"
#include "backend/backend.h"
#include "base/error.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"
#include "runtime/generate.h"

namespace lily::test {

inline const std::string kTinyA = fixture_dir("tiny-a");

// tiny-a's hf-fused checkpoint (with mtp.*) or its mlx-q4 conversion with the head from hf-fused.
struct TinyModel {
  std::shared_ptr<ModelWeights> weights;
  std::unique_ptr<Backend> backend;
  std::vector<int32_t> ids;  // reference.json's prompt ids
};

inline TinyModel load_tiny(const std::string& layout = "hf-fused") {
  TinyModel t;
  LoadOptions options;
  if (layout != "hf-fused") options.mtp_dir = kTinyA + "/hf-fused";
  t.weights = load_model(kTinyA + "/" + layout, options);
  t.backend = make_cpu_backend(t.weights);
  t.ids = read_json(kTinyA + "/reference.json")["ids"].get<std::vector<int32_t>>();
  return t;
}

inline GenerateResult run_generate(Backend& backend, const GenerateRequest& request, int64_t capacity = 256) {
  auto state = backend.new_sequence(capacity);
  return generate(backend, *state, request, [](const GeneratedToken&) { return true; });
}

// A state over a real one that offers keep_row_states / rewind (offer = true) the way a backend
// that keeps each row's recurrent state would, built from the real state's snapshots: at
// keep_row_states it snapshots, and rewind(length, mtp_length) restores that snapshot and runs
// the kept part of the next forward again. It checks the contract's limits: rewind only after the
// one forward that keep_row_states covers, to a length within its last `rows` rows, and (this
// double's own limit) to the head's length at keep_row_states.
class RewindState : public SequenceState {
 public:
  RewindState(std::unique_ptr<SequenceState> inner, Backend& backend, bool offer)
      : inner_(std::move(inner)), backend_(backend), offer_(offer) {}
  SequenceState& inner() { return *inner_; }

  int64_t length() const override { return inner_->length(); }
  int64_t capacity() const override { return inner_->capacity(); }
  uint64_t memory_bytes() const override { return inner_->memory_bytes(); }
  int64_t mtp_length() const override { return inner_->mtp_length(); }
  std::unique_ptr<SequenceState> clone() const override {
    return std::make_unique<RewindState>(inner_->clone(), backend_, offer_);
  }
  std::unique_ptr<RecurrentSnapshot> snapshot() const override { return inner_->snapshot(); }
  void restore(const RecurrentSnapshot& s) override { spend(), inner_->restore(s); }
  void reset() override { spend(), inner_->reset(); }

  bool keep_row_states(int rows) override {
    if (!offer_) return false;
    LILY_CHECK(rows >= 1, "keep_row_states({})", rows);
    rows_ = rows, armed_ = true, covered_ = false;
    kept_ = inner_->snapshot();
    kept_mtp_ = inner_->mtp_length();
    ++keeps;
    return true;
  }
  bool rewind(int64_t length, int64_t mtp_length) override {
    if (!offer_) return false;
    LILY_CHECK(covered_, "rewind({}, {}) without a forward covered by keep_row_states", length, mtp_length);
    const int64_t end = before_ + int64_t(tokens_.size());
    const int64_t first = std::max(before_ + 1, end - rows_ + 1);
    LILY_CHECK(first <= length && length <= end, "rewind to {}: the kept rows reach {} .. {}", length, first, end);
    LILY_CHECK(mtp_length == kept_mtp_ && mtp_length <= inner_->mtp_length(),
               "rewind's MTP length {}: this double cuts the head only to {}, its length at keep_row_states",
               mtp_length, kept_mtp_);
    inner_->restore(*kept_);
    std::vector<float> none;
    backend_.forward(*inner_, std::span<const int32_t>(tokens_).first(size_t(length - before_)), LogitsWanted::none,
                     none);
    spend();
    ++rewinds;
    return true;
  }

  // The backend's forward calls on this state: the first after keep_row_states is covered.
  void before_forward(std::span<const int32_t> tokens) {
    covered_ = armed_;
    armed_ = false;
    before_ = inner_->length();
    tokens_.assign(tokens.begin(), tokens.end());
  }

  int keeps = 0, rewinds = 0;

 private:
  void spend() { armed_ = covered_ = false; }

  std::unique_ptr<SequenceState> inner_;
  Backend& backend_;
  bool offer_;
  int rows_ = 0;
  bool armed_ = false, covered_ = false;
  std::unique_ptr<RecurrentSnapshot> kept_;
  int64_t kept_mtp_ = 0, before_ = 0;
  std::vector<int32_t> tokens_;
};

// A backend over a real one: its states are RewindStates (offer: keep_row_states / rewind
// offered), and where `truth` is set, the head's draft logits are replaced by a point at the
// token plain decoding gives (right) or beside it (wrong) per `accepts`: in the s-th step (its
// first draft's row), drafts 0 .. accepts(s) - 1 right and draft accepts(s) wrong. `steps`
// records the sequence's length at each step's first draft.
class ForcedDraftBackend : public Backend {
 public:
  ForcedDraftBackend(Backend& inner, bool offer) : inner_(inner), offer_(offer) {}

  std::vector<int32_t> truth;           // the prompt then plain decoding's tokens; empty: drafts as they come
  std::function<int(int64_t)> accepts;  // step -> the drafts forced right before the first wrong one
  std::vector<int64_t> steps;           // the sequence's length at each step's first draft

  std::string name() const override { return inner_.name(); }
  const ModelConfig& config() const override { return inner_.config(); }
  std::string mtp_unavailable() const override { return inner_.mtp_unavailable(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override {
    return std::make_unique<RewindState>(inner_.new_sequence(capacity), inner_, offer_);
  }

  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    RewindState& s = dynamic_cast<RewindState&>(state);
    s.before_forward(tokens);
    inner_.forward(s.inner(), tokens, wanted, logits);
  }
  void forward_hidden(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
                      std::vector<float>& logits, LogitsWanted hidden_rows, std::vector<float>& hidden) override {
    RewindState& s = dynamic_cast<RewindState&>(state);
    s.before_forward(tokens);
    inner_.forward_hidden(s.inner(), tokens, wanted, logits, hidden_rows, hidden);
  }
  void forward_mtp(SequenceState& state, std::span<const float> hidden, std::span<const int32_t> tokens,
                   LogitsWanted wanted, std::vector<float>& logits, std::vector<float>& mtp_hidden) override {
    RewindState& s = dynamic_cast<RewindState&>(state);
    const int64_t first = s.mtp_length(), length = s.length();
    inner_.forward_mtp(s.inner(), hidden, tokens, wanted, logits, mtp_hidden);
    if (wanted != LogitsWanted::last) return;
    const int64_t p = first + int64_t(tokens.size()) - 1;  // the row's position: it predicts x_{p+2}
    const int64_t k = p - (length - 1);                    // its draft's place in the step
    if (k == 0) steps.push_back(length);
    if (truth.empty() || !accepts || size_t(p + 2) >= truth.size()) return;
    const int a = accepts(int64_t(steps.size()) - 1);
    const int32_t V = config().vocab_size;
    const int32_t right = truth[size_t(p + 2)];
    const int32_t forced = k < a ? right : k == a ? (right + 1) % V : right;
    std::fill(logits.begin(), logits.end(), -10.0f);
    logits[size_t(forced)] = 10.0f;
  }

 private:
  Backend& inner_;
  bool offer_;
};

}  // namespace lily::test
