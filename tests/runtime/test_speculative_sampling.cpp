// Speculative sampling (runtime/speculative.h) keeps plain sampling's distribution: over many
// seeds, the first three generated tokens of tiny-a (top-k 4, a presence penalty: a small
// effective vocabulary) with drafts forced onto likely tokens, so that they are kept and refused
// at both draft positions, against the exact joint distribution plain sampling draws from
// (Sampler::distribution, row by row), by a chi-square bound; plain sampling itself passes the
// same bound. Accepting every draft, or drawing a refusal from p with the draft left in, fails it.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>

#include "runtime/speculative.h"
#include "test_speculative_backend.h"

namespace lily {
namespace {

using test::ForcedDraftBackend;
using test::load_tiny;
using test::TinyModel;

using Triple = std::array<int32_t, 3>;

SamplingParams small_vocabulary() {
  SamplingParams s;
  s.temperature = 0.9f;
  s.top_k = 4;
  s.presence_penalty = 0.7f;
  return s;
}

// The exact probability of each first three tokens under plain sampling: each row's processed
// distribution (Sampler::distribution, penalties over the tokens before it).
std::map<Triple, double> exact_joint(Backend& backend, std::span<const int32_t> prompt, const SamplingParams& s) {
  const int32_t V = backend.config().vocab_size;
  Sampler sampler(s, V);
  std::map<Triple, double> joint;
  std::vector<float> logits;
  std::vector<TokenProbability> d1, d2, d3;
  auto root = backend.new_sequence(16);
  backend.forward(*root, prompt, LogitsWanted::last, logits);
  sampler.distribution(logits, {}, d1);
  for (const TokenProbability& a : d1) {
    auto sa = root->clone();
    backend.forward(*sa, std::span<const int32_t>(&a.token, 1), LogitsWanted::last, logits);
    const std::vector<int32_t> ha{a.token};
    sampler.distribution(logits, ha, d2);
    for (const TokenProbability& b : std::vector<TokenProbability>(d2)) {
      auto sb = sa->clone();
      backend.forward(*sb, std::span<const int32_t>(&b.token, 1), LogitsWanted::last, logits);
      const std::vector<int32_t> hb{a.token, b.token};
      sampler.distribution(logits, hb, d3);
      for (const TokenProbability& c : d3)
        joint[{a.token, b.token, c.token}] = a.probability * b.probability * c.probability;
    }
  }
  return joint;
}

// Pearson's chi-square of `counts` (n draws) against `expected` probabilities, the cells of
// expected count below 5 pooled into one; `dof` gets the degrees of freedom.
double chi_square(const std::map<Triple, int>& counts, const std::map<Triple, double>& expected, int n, int& dof) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (const auto& [t, p] : expected) {
    const double e = p * n;
    const auto it = counts.find(t);
    const double o = it == counts.end() ? 0 : it->second;
    if (e < 5) {
      pooled_e += e, pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e, ++cells;
  }
  for (const auto& [t, o] : counts)
    if (!expected.contains(t)) pooled_o += o;  // a triple plain sampling never draws
  if (pooled_e > 0 || pooled_o > 0)
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9), ++cells;
  dof = cells - 1;
  return stat;
}

// The chi-square value a true distribution exceeds with probability 0.001 (Wilson-Hilferty).
double critical_value(int dof) {
  const double k = dof, z = 3.09;
  const double a = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * a * a * a;
}

std::map<Triple, int> sample_triples(Backend& backend, std::span<const int32_t> prompt, int speculate, int n,
                                     SpeculationStats& stats) {
  std::map<Triple, int> counts;
  for (int seed = 0; seed < n; ++seed) {
    GenerateRequest r;
    r.prompt.assign(prompt.begin(), prompt.end());
    r.max_new_tokens = 4;  // the second draft is made only with two tokens left after the first
    r.sampling = small_vocabulary();
    r.sampling.seed = uint64_t(seed) * 7919 + 1;
    r.speculate = speculate;
    auto state = backend.new_sequence(16);
    const GenerateResult g = generate(backend, *state, r, [](const GeneratedToken&) { return true; });
    stats.add(g.speculation);
    EXPECT_EQ(g.tokens.size(), 4u);
    if (g.tokens.size() >= 3) ++counts[{g.tokens[0], g.tokens[1], g.tokens[2]}];
  }
  return counts;
}

// Sampler::distribution is the distribution sample() draws from, on each of sample()'s paths
// (top-k; the whole vocabulary with and without top-p / min-p; penalties), by a chi-square of
// 20000 draws on a row of 8 logits (one of them NaN, one -inf).
TEST(SpeculativeSampling, DistributionIsWhatSampleDraws) {
  const std::vector<float> row{1.0f, 2.5f, NAN, 0.3f, 2.4f, -INFINITY, 1.7f, -0.5f};
  const std::vector<int32_t> history{4, 4, 1};
  for (int path = 0; path < 4; ++path) {
    SamplingParams s;
    s.temperature = 0.8f;
    if (path == 0) s.top_k = 3;
    if (path == 2) s.top_p = 0.8f, s.min_p = 0.1f;
    if (path == 3) s.presence_penalty = 0.4f, s.repetition_penalty = 1.2f;
    s.seed = 99;
    Sampler sampler(s, int32_t(row.size()));
    std::vector<float> work = row;
    std::vector<TokenProbability> d;
    sampler.distribution(work, history, d);
    double total = 0;
    for (const TokenProbability& t : d) total += t.probability;
    EXPECT_NEAR(total, 1.0, 1e-12) << "path " << path;
    const int n = 20000;
    std::map<int32_t, int> counts;
    for (int i = 0; i < n; ++i) {
      work = row;
      ++counts[sampler.sample(work, history)];
    }
    double stat = 0;
    for (const TokenProbability& t : d) {
      const double e = t.probability * n, o = counts[t.token];
      stat += (o - e) * (o - e) / e;
      counts.erase(t.token);
    }
    EXPECT_TRUE(counts.empty()) << "path " << path << ": sample() drew a token outside the distribution";
    ASSERT_GT(d.size(), 1u) << "path " << path;
    EXPECT_LT(stat, critical_value(int(d.size()) - 1)) << "path " << path;
  }
}

TEST(SpeculativeSampling, FirstTokensKeepPlainSamplingsDistribution) {
  TinyModel t = load_tiny();
  const std::vector<int32_t> prompt(t.ids.begin(), t.ids.begin() + 3);
  const std::map<Triple, double> joint = exact_joint(*t.backend, prompt, small_vocabulary());
  // Drafts forced onto the most likely second and third tokens (after the most likely first):
  // kept in some draws, refused in others, at both positions.
  Triple likely{};
  double best = 0;
  for (const auto& [tr, p] : joint)
    if (p > best) best = p, likely = tr;
  ForcedDraftBackend forced(*t.backend, /*offer=*/true);
  forced.truth = prompt;
  forced.truth.insert(forced.truth.end(), likely.begin(), likely.end());
  forced.accepts = [](int64_t) { return 99; };  // every draft the truth's

  for (auto [speculate, n] : {std::pair{0, 250}, std::pair{2, 600}}) {
    SCOPED_TRACE(testing::Message() << "speculate " << speculate);
    SpeculationStats stats;
    const std::map<Triple, int> counts = sample_triples(forced, prompt, speculate, n, stats);
    for (size_t k = 0; k < stats.drafted.size(); ++k) {  // drafts kept and refused at each position
      EXPECT_GT(stats.accepted[k], n / 50) << "position " << k;
      EXPECT_LT(stats.accepted[k], stats.drafted[k] - n / 50) << "position " << k;
    }
    int dof = 0;
    const double stat = chi_square(counts, joint, n, dof);
    EXPECT_LT(stat, critical_value(dof)) << "chi-square " << stat << " over " << dof << " degrees of freedom";
  }
}

}  // namespace
}  // namespace lily
