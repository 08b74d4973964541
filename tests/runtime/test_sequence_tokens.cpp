// SequenceTokens on a fake backend whose "state" is the list of tokens it was fed and whose
// model always predicts the last token + 1: after every step of a reply (rounds ending at a
// stop token or at max_tokens, a round after a round) the state holds exactly
// tokens()[0 : in_state()], and the sequence handed back to the cache lists what its state holds.
#include <gtest/gtest.h>

#include "runtime/sequence_tokens.h"

#include "base/error.h"

namespace lily {
namespace {

constexpr int32_t kVocab = 64;

struct FakeSnapshot final : RecurrentSnapshot {
  std::vector<int32_t> seen;
  int64_t length() const override { return int64_t(seen.size()); }
  uint64_t memory_bytes() const override { return 1; }
};

struct FakeState final : SequenceState {
  std::vector<int32_t> seen;
  int64_t length() const override { return int64_t(seen.size()); }
  int64_t capacity() const override { return 1000; }
  uint64_t memory_bytes() const override { return 1; }
  std::unique_ptr<SequenceState> clone() const override { return std::make_unique<FakeState>(*this); }
  std::unique_ptr<RecurrentSnapshot> snapshot() const override {
    auto s = std::make_unique<FakeSnapshot>();
    s->seen = seen;
    return s;
  }
  void restore(const RecurrentSnapshot& s) override { seen = dynamic_cast<const FakeSnapshot&>(s).seen; }
  void reset() override { seen.clear(); }
};

struct CountingBackend final : Backend {
  ModelConfig c;
  CountingBackend() { c.vocab_size = kVocab; }
  std::string name() const override { return "counting"; }
  const ModelConfig& config() const override { return c; }
  std::unique_ptr<SequenceState> new_sequence(int64_t) override { return std::make_unique<FakeState>(); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    auto& s = dynamic_cast<FakeState&>(state);
    s.seen.insert(s.seen.end(), tokens.begin(), tokens.end());
    if (wanted == LogitsWanted::none) return;
    logits.assign(kVocab, 0.0f);
    logits[size_t((s.seen.back() + 1) % kVocab)] = 1.0f;
  }
};

CachedSequence empty_sequence(CountingBackend& b) {
  CachedSequence s;
  s.state = b.new_sequence(1000);
  return s;
}

// What the fake state was fed.
std::vector<int32_t> state_tokens(CachedSequence& s) { return dynamic_cast<FakeState&>(*s.state).seen; }

GenerateRequest greedy(int64_t max_new_tokens, std::vector<int32_t> stop) {
  GenerateRequest g;
  g.max_new_tokens = max_new_tokens;
  g.sampling.temperature = 0;
  g.stop_tokens = std::move(stop);
  return g;
}

bool any_token(const GeneratedToken&) { return true; }

TEST(SequenceTokens, ARoundLeavesItsStopTokenOutOfTheState) {
  CountingBackend b;
  const std::vector<int32_t> prompt{1, 2, 3};
  SequenceTokens seq(empty_sequence(b), prompt);
  GenerateResult r = seq.generate(b, greedy(10, {6}), any_token);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(seq.tokens(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(std::vector<int32_t>(seq.reply().begin(), seq.reply().end()), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(seq.in_state(), 5);  // 6 was never fed back
  CachedSequence back = std::move(seq).take();
  EXPECT_EQ(back.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(state_tokens(back), back.tokens);
}

TEST(SequenceTokens, ASecondRoundComputesTheLastTokenOfTheFirst) {
  CountingBackend b;
  SequenceTokens seq(empty_sequence(b), std::vector<int32_t>{1, 2, 3});
  seq.generate(b, greedy(2, {}), any_token);  // 4 5, 5 not fed (the last of max_new_tokens)
  EXPECT_EQ(seq.in_state(), 4);
  GenerateResult r = seq.generate(b, greedy(3, {}), any_token);
  EXPECT_EQ(r.cached_tokens, 4);
  EXPECT_EQ(r.prompt_tokens, 5);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(seq.produced(), 5);
  EXPECT_EQ(seq.in_state(), 7);
  CachedSequence back = std::move(seq).take();
  EXPECT_EQ(back.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(state_tokens(back), back.tokens);
}

TEST(SequenceTokens, PrefillToASnapshotPointResumesLater) {
  CountingBackend b;
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5};
  SequenceTokens seq(empty_sequence(b), prompt);
  seq.prefill_to(b, 3);
  seq.snapshot_here();
  EXPECT_EQ(seq.in_state(), 3);
  EXPECT_THROW(seq.prefill_to(b, 3), Error);  // nothing to compute
  EXPECT_THROW(seq.prefill_to(b, 6), Error);  // past what is known
  GenerateResult r = seq.generate(b, greedy(1, {}), any_token);
  EXPECT_EQ(r.cached_tokens, 3);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{6}));
  CachedSequence back = std::move(seq).take();
  EXPECT_EQ(back.tokens, prompt);
  ASSERT_EQ(back.snapshots.size(), 1u);
  EXPECT_EQ(back.snapshots[0]->length(), 3);
}

TEST(SequenceTokens, AResumedSequenceMustHoldAPrefixOfThePrompt) {
  CountingBackend b;
  auto resumed = [&](std::vector<int32_t> held) {
    CachedSequence s = empty_sequence(b);
    std::vector<float> unused;
    b.forward(*s.state, held, LogitsWanted::none, unused);
    s.tokens = held;
    return s;
  };
  SequenceTokens ok(resumed({1, 2}), std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(ok.in_state(), 2);
  EXPECT_EQ(ok.tokens(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_THROW((void)SequenceTokens(resumed({1, 9}), std::vector<int32_t>{1, 2, 3}), Error);
  CachedSequence out_of_step = resumed({1, 2});
  out_of_step.tokens.pop_back();  // lists fewer tokens than its state holds
  EXPECT_THROW((void)SequenceTokens(std::move(out_of_step), std::vector<int32_t>{1, 2, 3}), Error);
}

}  // namespace
}  // namespace lily
