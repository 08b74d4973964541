// The chunked delta rule against the token loop (spec §3.2 derivation check): random inputs,
// random initial state, T across the 64-token chunk edges.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"

namespace lily::cpu {
namespace {

struct Problem {
  int64_t T, dk = 128, dv = 128;
  std::vector<float> q, k, v, g, beta, S0;
};

void l2n(float* x, int64_t n, float scale) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  float inv = float(1 / std::sqrt(s + 1e-6)) * scale;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

Problem make_problem(int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  Problem p;
  p.T = T;
  p.q.resize(size_t(T * p.dk));
  p.k.resize(size_t(T * p.dk));
  p.v.resize(size_t(T * p.dv));
  for (auto& x : p.q) x = normal(rng);
  for (auto& x : p.k) x = normal(rng);
  for (auto& x : p.v) x = normal(rng);
  for (int64_t t = 0; t < T; ++t) {
    l2n(&p.q[size_t(t * p.dk)], p.dk, 1.f / std::sqrt(float(p.dk)));
    l2n(&p.k[size_t(t * p.dk)], p.dk, 1.f);
    p.g.push_back(-std::exp(normal(rng)) * 0.3f);  // log decay < 0
    p.beta.push_back(uniform(rng));
  }
  p.S0.resize(size_t(p.dk * p.dv));
  for (auto& x : p.S0) x = normal(rng) * 0.5f;
  return p;
}

DeltaRuleInputs inputs(const Problem& p) {
  return {p.q.data(), p.k.data(), p.v.data(), p.g.data(), p.beta.data(), p.dk, p.dk, p.dv, 1, p.T, p.dk, p.dv};
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
    if (std::isnan(a[i])) return INFINITY;
  }
  return diff / scale;
}

class DeltaRule : public ::testing::TestWithParam<int64_t> {};

TEST_P(DeltaRule, ChunkedEqualsRecurrent) {
  const int64_t T = GetParam();
  Problem p = make_problem(T, uint32_t(1000 + T));
  std::vector<float> S_rec = p.S0, S_chunk = p.S0;
  std::vector<float> o_rec(size_t(T * p.dv), NAN), o_chunk(size_t(T * p.dv), NAN);  // poisoned
  delta_rule_recurrent(inputs(p), S_rec.data(), o_rec.data(), p.dv);
  delta_rule_chunked(inputs(p), S_chunk.data(), o_chunk.data(), p.dv, 64);
  EXPECT_LT(max_rel_diff(o_chunk, o_rec), 2e-5) << "outputs, T=" << T;
  EXPECT_LT(max_rel_diff(S_chunk, S_rec), 2e-5) << "final state, T=" << T;
}

TEST_P(DeltaRule, SplitPrefillThenDecodeEqualsOnePass) {
  const int64_t T = GetParam();
  Problem p = make_problem(T, uint32_t(2000 + T));
  std::vector<float> S_all = p.S0, S_split = p.S0;
  std::vector<float> o_all(size_t(T * p.dv)), o_split(size_t(T * p.dv), NAN);
  delta_rule_recurrent(inputs(p), S_all.data(), o_all.data(), p.dv);
  const int64_t cut = T / 2;
  DeltaRuleInputs head = inputs(p);
  head.T = cut;
  delta_rule_chunked(head, S_split.data(), o_split.data(), p.dv, 64);
  for (int64_t t = cut; t < T; ++t) {  // decode the rest token by token
    DeltaRuleInputs one = inputs(p);
    one.q += t * p.dk, one.k += t * p.dk, one.v += t * p.dv, one.g += t, one.beta += t;
    one.T = 1;
    delta_rule_recurrent(one, S_split.data(), o_split.data() + t * p.dv, p.dv);
  }
  EXPECT_LT(max_rel_diff(o_split, o_all), 2e-5);
  EXPECT_LT(max_rel_diff(S_split, S_all), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Lengths, DeltaRule, ::testing::Values(1, 2, 63, 64, 65, 128, 200));

// A failing delta rule must be caught: a wrong decay in the chunked form is detected.
TEST(DeltaRuleSelfCheck, DetectsAWrongDecay) {
  Problem p = make_problem(100, 7);
  std::vector<float> S_rec = p.S0, S_chunk = p.S0, o_rec(size_t(100 * p.dv)), o_chunk(size_t(100 * p.dv));
  delta_rule_recurrent(inputs(p), S_rec.data(), o_rec.data(), p.dv);
  for (auto& g : p.g) g *= 1.01f;
  delta_rule_chunked(inputs(p), S_chunk.data(), o_chunk.data(), p.dv, 64);
  EXPECT_GT(max_rel_diff(o_chunk, o_rec), 1e-4);
}

}  // namespace
}  // namespace lily::cpu
