// The sampler (src/runtime/sampler.h): greedy choice and its ties, the vocabulary limit, the
// filters (top-k, top-p, min-p) on distributions whose answer is known, penalties, seeded
// reproducibility, draw frequencies against the softmax, the whole-vocabulary path at the
// real vocabulary size, where the nucleus is found without sorting everything (checked against
// a full sort), and rows masked by a grammar (-inf but for a few tokens) at every setting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "runtime/sampler.h"

namespace lily {
namespace {

SamplingParams params(float temperature, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f, uint64_t seed = 7) {
  SamplingParams p;
  p.temperature = temperature, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.seed = seed;
  return p;
}

// Draw counts of `draws` samples (the logits are copied for every draw: sample() edits them).
std::map<int32_t, int> histogram(const SamplingParams& p, const std::vector<float>& logits, int draws,
                                 int32_t vocab_limit = 0) {
  Sampler s(p, vocab_limit > 0 ? vocab_limit : int32_t(logits.size()));
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> l = logits;
    ++counts[s.sample(l, {})];
  }
  return counts;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += p[i] = std::exp((logits[i] - m) / temperature);
  for (auto& v : p) v /= total;
  return p;
}

TEST(Sampler, GreedyTakesTheFirstLargest) {
  std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  for (auto p : {params(0.0f), params(0.8f, 1)}) {  // temperature 0, or top_k 1
    Sampler s(p, 5);
    std::vector<float> copy = l;
    EXPECT_EQ(s.sample(copy, {}), 1);
  }
}

TEST(Sampler, NeverSamplesPastTheVocabularyLimit) {
  std::vector<float> l = {0.0f, 0.1f, 0.2f, 50.0f, 60.0f};  // the two best are padding
  {
    Sampler s(params(0.0f), 3);
    std::vector<float> copy = l;
    EXPECT_EQ(s.sample(copy, {}), 2);
  }
  for (auto p : {params(1.0f), params(1.0f, 2), params(1.0f, 0, 0.9f), params(1.0f, 0, 1.0f, 0.5f)}) {
    for (auto [token, count] : histogram(p, l, 300, 3)) EXPECT_LT(token, 3) << count;
  }
}

// p = (0.6, 0.3, 0.1) at temperature 1.
std::vector<float> three_tokens() { return {std::log(0.6f), std::log(0.3f), std::log(0.1f)}; }

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingIt) {
  // top_p 0.5: token 0 alone reaches it; 0.8: tokens 0 and 1, drawn 2:1.
  auto only0 = histogram(params(1.0f, 0, 0.5f), three_tokens(), 500);
  EXPECT_EQ(only0.size(), 1u);
  EXPECT_EQ(only0[0], 500);
  auto two = histogram(params(1.0f, 0, 0.8f), three_tokens(), 30000);
  EXPECT_EQ(two.count(2), 0u);
  EXPECT_NEAR(double(two[0]) / 30000, 2.0 / 3.0, 0.015);
  // The same through the top-k path (k = 3 = all three: the filter is the same).
  auto two_k = histogram(params(1.0f, 2, 0.8f), three_tokens(), 3000);
  EXPECT_EQ(two_k.count(2), 0u);
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  // min_p 0.4: floor 0.24 keeps 0.6 and 0.3, drops 0.1; min_p 0.6 keeps 0.6 only.
  auto kept = histogram(params(1.0f, 0, 1.0f, 0.4f), three_tokens(), 20000);
  EXPECT_EQ(kept.count(2), 0u);
  EXPECT_NEAR(double(kept[1]) / 20000, 1.0 / 3.0, 0.015);
  auto best = histogram(params(1.0f, 0, 1.0f, 0.6f), three_tokens(), 300);
  EXPECT_EQ(best.size(), 1u);
}

TEST(Sampler, TopKKeepsTheKBest) {
  std::vector<float> l = {1.0f, 4.0f, 3.0f, 2.0f, 3.5f};
  auto h = histogram(params(5.0f, 2), l, 5000);  // a high temperature: both kept tokens appear
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h[1], 0);
  EXPECT_GT(h[4], 0);
}

TEST(Sampler, FrequenciesFollowTheSoftmaxWithTemperature) {
  std::vector<float> l = {0.0f, 1.0f, 2.0f, 3.0f, -2.0f, 2.5f};
  for (float t : {0.7f, 1.0f, 1.6f}) {
    const auto want = softmax(l, t);
    const int draws = 60000;
    auto h = histogram(params(t), l, draws);
    for (size_t i = 0; i < l.size(); ++i)
      EXPECT_NEAR(double(h[int32_t(i)]) / draws, want[i], 0.01) << "temperature " << t << " token " << i;
  }
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> l(1000);
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 2.f);
  for (auto& v : l) v = d(rng);
  auto draws = [&](uint64_t seed, SamplingParams p) {
    p.seed = seed;
    Sampler s(p, int32_t(l.size()));
    std::vector<int32_t> out;
    for (int i = 0; i < 100; ++i) {
      std::vector<float> copy = l;
      out.push_back(s.sample(copy, {}));
    }
    return out;
  };
  for (auto p : {params(0.8f), params(0.8f, 20), params(0.8f, 0, 0.9f)}) {
    EXPECT_EQ(draws(11, p), draws(11, p));
    EXPECT_NE(draws(11, p), draws(12, p));
  }
}

TEST(Sampler, PenaltiesApplyToGeneratedTokens) {
  std::vector<float> l = {2.0f, 1.9f, -1.0f};
  SamplingParams rep = params(0.0f);
  rep.repetition_penalty = 2.0f;  // 2.0 -> 1.0: token 1 wins
  Sampler s(rep, 3);
  std::vector<float> copy = l;
  std::vector<int32_t> history = {0};
  EXPECT_EQ(s.sample(copy, history), 1);
  EXPECT_FLOAT_EQ(copy[0], 1.0f);
  SamplingParams freq = params(0.0f);
  freq.frequency_penalty = 0.5f, freq.presence_penalty = 0.25f;  // token 0 seen twice: 2.0 - 0.25 - 1.0
  Sampler f(freq, 3);
  copy = l;
  history = {0, 0};
  EXPECT_EQ(f.sample(copy, history), 1);
  EXPECT_FLOAT_EQ(copy[0], 0.75f);
  EXPECT_FLOAT_EQ(copy[1], 1.9f);
}

// The real vocabulary size with top-k off: the nucleus must be exactly the prefix a full sort
// gives, also when it holds thousands of tokens (the sorted prefix grows 64 -> 512 -> 4096).
TEST(Sampler, WholeVocabularyNucleusMatchesAFullSort) {
  const int V = 248320;
  for (int flat : {10, 3000}) {  // tokens sharing the top of the distribution
    SCOPED_TRACE(testing::Message() << flat << " tokens near the top");
    std::vector<float> l(static_cast<size_t>(V));
    std::mt19937 rng(static_cast<uint32_t>(flat));
    std::normal_distribution<float> low(-12.f, 2.f), high(0.f, 0.3f);
    for (auto& v : l) v = low(rng);
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i = 0; i < flat; ++i) l[size_t(ids[size_t(i)])] = high(rng);

    // Reference nucleus at temperature 0.8, top_p 0.9: sort everything.
    const auto p = softmax(l, 0.8);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
    std::set<int32_t> nucleus;
    double mass = 0;
    for (int32_t id : order) {
      nucleus.insert(id);
      mass += p[size_t(id)];
      if (mass >= 0.9) break;
    }
    auto h = histogram(params(0.8f, 0, 0.9f), l, 600);
    for (auto [token, count] : h) EXPECT_TRUE(nucleus.count(token)) << "token " << token << " drawn " << count;
    if (flat > 1000) {
      EXPECT_GT(h.size(), 300u);  // a wide nucleus (~2,700 tokens) is really sampled across
    }
  }
}

// top-k at the real vocabulary size: the candidates are found without sorting the vocabulary
// (tokens within a margin of the best); they must be exactly the k best of a full sort.
TEST(Sampler, TopKAtTheRealVocabularyMatchesAFullSort) {
  const int V = 248320, k = 20;
  std::vector<float> l(static_cast<size_t>(V));
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 6.f);  // wide: the 20 best span several nats
  for (auto& v : l) v = d(rng);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
  });
  const std::set<int32_t> best(order.begin(), order.begin() + k);
  auto h = histogram(params(50.0f, k), l, 600);  // hot: every one of the 20 gets drawn
  for (auto [token, count] : h) EXPECT_TRUE(best.count(token)) << "token " << token << " drawn " << count;
  EXPECT_GE(h.size(), 18u);
  const auto top = top_logprobs(l, 5, V);
  ASSERT_EQ(top.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(top[size_t(i)].token, order[size_t(i)]);
}

TEST(Sampler, NaNLogitsAreNeverChosen) {
  std::vector<float> l = {1.0f, NAN, 0.5f, NAN, 0.9f};
  for (auto p : {params(1.0f), params(1.0f, 2), params(1.0f, 0, 0.95f)}) {
    for (auto [token, count] : histogram(p, l, 200)) EXPECT_TRUE(token == 0 || token == 2 || token == 4) << token;
  }
}

// Constrained decoding masks every token the grammar forbids to -inf, often all but one or two
// of 248,320: every setting must draw only allowed tokens, even with top-k above their number
// and with the forbidden ones holding the best raw logits (poisoned before the mask).
TEST(Sampler, MaskedRowsDrawOnlyAllowedTokensAtEverySetting) {
  const int V = 248320;
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> raw(static_cast<size_t>(V));
  for (auto& v : raw) v = d(rng);
  for (int i = 0; i < 50; ++i) raw[size_t(rng() % V)] = 40.0f;  // poison: far above the rest
  SamplingParams penalised = params(1.0f, 20, 0.9f);
  penalised.repetition_penalty = 1.3f, penalised.presence_penalty = 0.5f, penalised.frequency_penalty = 0.5f;
  const SamplingParams settings[] = {params(0.0f),
                                     params(1.0f),
                                     params(1.0f, 20),
                                     params(0.7f, 20, 0.8f),
                                     params(1.0f, 0, 0.5f),
                                     params(1.0f, 0, 1.0f, 0.2f),
                                     params(1.5f, 40, 0.95f, 0.05f),
                                     penalised};
  for (int allowed_count : {1, 3}) {
    std::vector<int32_t> allowed;
    for (int i = 0; i < allowed_count; ++i) allowed.push_back(int32_t(rng() % V));
    std::vector<float> masked(raw.size(), -INFINITY);
    for (int32_t id : allowed) masked[size_t(id)] = raw[size_t(id)];
    const std::vector<int32_t> history{allowed[0], allowed[0], 5};
    for (const SamplingParams& p : settings) {
      SCOPED_TRACE(testing::Message() << allowed_count << " allowed, temperature " << p.temperature << " top_k "
                                      << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p);
      Sampler s(p, V);
      for (int draw = 0; draw < 25; ++draw) {
        std::vector<float> l = masked;
        const int32_t t = s.sample(l, history);
        EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << "drew the forbidden token " << t;
      }
    }
  }
}

// With two tokens left, temperature and the penalties act between those two only: the draw
// frequencies follow the softmax of the two logits, as if the vocabulary held nothing else.
TEST(Sampler, AMaskedRowSamplesTheSoftmaxOfItsAllowedTokens) {
  const int V = 1024;
  std::vector<float> l(static_cast<size_t>(V), -INFINITY);
  l[100] = 0.0f, l[1000] = std::log(3.0f);  // 1 : 3 at temperature 1
  for (int top_k : {0, 20}) {
    const auto h = histogram(params(1.0f, top_k), l, 3000, V);
    ASSERT_EQ(h.size(), 2u);
    EXPECT_NEAR(h.at(1000) / 3000.0, 0.75, 0.035) << "top_k " << top_k;  // 4.4 standard deviations
  }
}

TEST(Sampler, TopLogprobsAreTheLogSoftmaxOfTheBest) {
  std::vector<float> l = {0.1f, 2.0f, -3.0f, 1.5f, 2.0f};
  const auto p = softmax(l, 1.0);
  const auto top = top_logprobs(l, 3, 5);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);  // ties to the lower id
  EXPECT_EQ(top[1].token, 4);
  EXPECT_EQ(top[2].token, 3);
  for (const auto& t : top) EXPECT_NEAR(t.logprob, std::log(p[size_t(t.token)]), 1e-5);
  EXPECT_NEAR(token_logprob(l, 2, 5).logprob, std::log(p[2]), 1e-5);
}

}  // namespace
}  // namespace lily
