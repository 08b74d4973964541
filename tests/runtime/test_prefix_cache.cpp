// The session cache on a fake backend whose "state" is the list of tokens it has seen: the
// cache must always hand back a state whose content equals its token list and is a prefix of
// the prompt; plus LRU order and the byte budget.
#include <gtest/gtest.h>

#include "runtime/prefix_cache.h"

#include "model/config.h"

namespace lily {
namespace {

struct FakeSnapshot final : RecurrentSnapshot {
  std::vector<int32_t> seen;
  int64_t length() const override { return int64_t(seen.size()); }
  uint64_t memory_bytes() const override { return 10; }
};

struct FakeState final : SequenceState {
  std::vector<int32_t> seen;
  int64_t cap = 1000;
  int64_t length() const override { return int64_t(seen.size()); }
  int64_t capacity() const override { return cap; }
  uint64_t memory_bytes() const override { return 100 + uint64_t(seen.size()); }
  std::unique_ptr<SequenceState> clone() const override { return std::make_unique<FakeState>(*this); }
  std::unique_ptr<RecurrentSnapshot> snapshot() const override {
    auto s = std::make_unique<FakeSnapshot>();
    s->seen = seen;
    return s;
  }
  void restore(const RecurrentSnapshot& snapshot) override { seen = dynamic_cast<const FakeSnapshot&>(snapshot).seen; }
  void reset() override { seen.clear(); }
};

struct FakeBackend final : Backend {
  ModelConfig c;
  std::string name() const override { return "fake"; }
  const ModelConfig& config() const override { return c; }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override {
    auto s = std::make_unique<FakeState>();
    s->cap = capacity;
    return s;
  }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted, std::vector<float>&) override {
    auto& s = dynamic_cast<FakeState&>(state);
    s.seen.insert(s.seen.end(), tokens.begin(), tokens.end());
  }
};

// Runs `tokens` through a sequence, snapshotting at each length in `points`.
void extend(FakeBackend& b, CachedSequence& seq, const std::vector<int32_t>& tokens, std::vector<int64_t> points) {
  std::vector<float> unused;
  for (size_t i = seq.tokens.size(); i < tokens.size(); ++i) {
    if (std::find(points.begin(), points.end(), int64_t(i)) != points.end()) seq.snapshot_here();
    b.forward(*seq.state, std::span<const int32_t>(&tokens[i], 1), LogitsWanted::none, unused);
    seq.tokens.push_back(tokens[i]);
  }
}

const std::vector<int32_t>& seen(const CachedSequence& seq) { return dynamic_cast<const FakeState&>(*seq.state).seen; }

TEST(PrefixCache, EmptyCacheGivesAFreshSequence) {
  FakeBackend b;
  PrefixCache cache(b, 64, 1 << 20);
  CachedSequence seq = cache.acquire(std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(seq.state->length(), 0);
  EXPECT_EQ(seq.state->capacity(), 64);
}

TEST(PrefixCache, ResumesAWholeStateThatThePromptExtends) {
  FakeBackend b;
  PrefixCache cache(b, 64, 1 << 20);
  CachedSequence seq = cache.fresh();
  extend(b, seq, {1, 2, 3, 4}, {});
  cache.release(std::move(seq));
  CachedSequence got = cache.acquire(std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(seen(got), got.tokens);
  EXPECT_EQ(cache.stats().sequences, 0u);  // taken out while in use
}

TEST(PrefixCache, LeavesAtLeastOneTokenToCompute) {
  FakeBackend b;
  PrefixCache cache(b, 64, 1 << 20);
  CachedSequence seq = cache.fresh();
  extend(b, seq, {1, 2, 3, 4}, {2});
  cache.release(std::move(seq));
  // The same prompt again: the whole state would leave nothing to compute; the snapshot at 2 is used.
  CachedSequence got = cache.acquire(std::vector<int32_t>{1, 2, 3, 4});
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(seen(got), got.tokens);
}

TEST(PrefixCache, RollsBackToTheLastSnapshotBeforeTheDivergence) {
  FakeBackend b;
  PrefixCache cache(b, 64, 1 << 20);
  CachedSequence seq = cache.fresh();
  extend(b, seq, {1, 2, 3, 4, 5, 6, 7, 8}, {2, 4, 6});
  cache.release(std::move(seq));
  CachedSequence got = cache.acquire(std::vector<int32_t>{1, 2, 3, 4, 5, 9, 9});
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(seen(got), got.tokens);
  // Snapshots beyond the resume point are gone; those at or before it remain.
  ASSERT_EQ(got.snapshots.size(), 2u);
  EXPECT_EQ(got.snapshots.back()->length(), 4);
}

TEST(PrefixCache, PicksTheSequenceThatResumesMost) {
  FakeBackend b;
  PrefixCache cache(b, 64, 1 << 20);
  for (std::vector<int32_t> t : {std::vector<int32_t>{1, 2, 3}, {1, 2, 7, 8, 9}, {5, 5}}) {
    CachedSequence seq = cache.fresh();
    extend(b, seq, t, {});
    cache.release(std::move(seq));
  }
  CachedSequence got = cache.acquire(std::vector<int32_t>{1, 2, 7, 8, 9, 10});
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{1, 2, 7, 8, 9}));
  EXPECT_EQ(cache.stats().sequences, 2u);
  // No common usable point: a fresh sequence, the cached ones stay.
  CachedSequence none = cache.acquire(std::vector<int32_t>{4, 4, 4});
  EXPECT_EQ(none.tokens.size(), 0u);
  EXPECT_EQ(cache.stats().sequences, 2u);
}

TEST(PrefixCache, DropsTheLeastRecentlyUsedOverBudget) {
  FakeBackend b;
  // Each sequence of 3 tokens costs 103 bytes: room for two.
  PrefixCache cache(b, 64, 250);
  for (int32_t first : {1, 2, 3}) {
    CachedSequence seq = cache.fresh();
    extend(b, seq, {first, 0, 0}, {});
    cache.release(std::move(seq));
  }
  EXPECT_EQ(cache.stats().sequences, 2u);
  EXPECT_LE(cache.stats().bytes, 250u);
  EXPECT_EQ(cache.acquire(std::vector<int32_t>{1, 0, 0, 5}).tokens.size(), 0u);  // evicted
  CachedSequence two = cache.acquire(std::vector<int32_t>{2, 0, 0, 5});
  EXPECT_EQ(two.tokens.size(), 3u);
  cache.release(std::move(two));  // now the most recent
  CachedSequence four = cache.fresh();
  extend(b, four, {4, 0, 0}, {});
  cache.release(std::move(four));  // evicts 3, the least recently used
  EXPECT_EQ(cache.acquire(std::vector<int32_t>{3, 0, 0, 5}).tokens.size(), 0u);
  EXPECT_EQ(cache.acquire(std::vector<int32_t>{2, 0, 0, 5}).tokens.size(), 3u);
}

TEST(PrefixCache, ZeroBudgetKeepsNothing) {
  FakeBackend b;
  PrefixCache cache(b, 64, 0);
  CachedSequence seq = cache.fresh();
  extend(b, seq, {1, 2}, {});
  cache.release(std::move(seq));
  EXPECT_EQ(cache.stats().sequences, 0u);
}

TEST(PrefixCache, KeepsABoundedNumberOfSnapshots) {
  FakeBackend b;
  PrefixCache cache(b, 64, 1 << 20);
  CachedSequence seq = cache.fresh();
  std::vector<int32_t> t(40, 1);
  std::vector<int64_t> points;
  for (int64_t i = 1; i < 40; i += 2) points.push_back(i);
  extend(b, seq, t, points);
  EXPECT_EQ(seq.snapshots.size(), PrefixCache::kMaxSnapshotsPerSequence);
  EXPECT_EQ(seq.snapshots.back()->length(), 39);
}

// Issue 17 (12): the session cache could grow to 4 GiB whatever the model (130 full states of
// lily-tiny). Its budget comes from the model's state size and the free memory.
TEST(PrefixCache, regression_budget_follows_the_models_state_size_17) {
  FakeBackend b;
  b.c = load_model_config(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  // 2 attention layers x 4096 tokens x (k, v) x 256; 6 DeltaNet layers x (conv 1024 x 4 +
  // state 4 x 128 x 128) x (the state + 8 snapshots); fp32.
  const uint64_t state = 4 * (2ull * 4096 * 2 * 256 + 6ull * (1024 * 4 + 4 * 128 * 128) * 9);
  EXPECT_EQ(SessionCacheBudget::state_bytes(b.c, 4096), state);
  EXPECT_EQ(SessionCacheBudget::limit(b.c, 4096, 0), 8 * state);
  EXPECT_EQ(SessionCacheBudget::limit(b.c, 4096, 400ull << 20), 100ull << 20);  // a quarter of what is free
  PrefixCache four_gib(b, 4096, 4ull << 30);
  EXPECT_EQ(four_gib.stats().budget_bytes, 8 * state);
  PrefixCache automatic(b, 4096, PrefixCache::kAutoBudget);
  EXPECT_EQ(automatic.stats().budget_bytes, 8 * state);
  PrefixCache small(b, 4096, 1 << 20);  // a smaller budget asked for is kept
  EXPECT_EQ(small.stats().budget_bytes, 1u << 20);
  // The fake config without layers has no state size: the budget is what was asked.
  FakeBackend unknown;
  EXPECT_EQ(PrefixCache(unknown, 64, 4ull << 30).stats().budget_bytes, 4ull << 30);
  EXPECT_GT(available_host_memory(), 0u);
}

}  // namespace
}  // namespace lily
