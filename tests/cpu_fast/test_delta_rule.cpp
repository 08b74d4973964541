// cpu_fast::delta_rule_step (one token, S read in one pass and written in another) and
// cpu_fast::delta_rule_tokens (a block of tokens) against the
// reference's recurrent form (cpu::delta_rule_recurrent, T = 1): the state within 1e-5 of its
// largest value, the output within 1e-5 of its and the state's, at head sizes 1 .. 128 (the
// model's: 128 x 128), over 8 tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/layers.h"

namespace lily {
namespace {

std::vector<float> random_values(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

void l2_normalize(std::vector<float>& x) {
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  for (float& v : x) v = float(v / std::sqrt(ss + 1e-6));
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

TEST(DeltaRuleStep, MatchesReferenceRecurrence) {
  std::mt19937 rng(5);
  for (int64_t dk : {1, 2, 63, 64, 65, 128})
    for (int64_t dv : {1, 3, 64, 65, 128}) {
      std::vector<float> S_ref = random_values(dk * dv, rng, 0.5f), S = S_ref;
      for (int t = 0; t < 8; ++t) {
        std::vector<float> q = random_values(dk, rng, 1.f), k = random_values(dk, rng, 1.f);
        const std::vector<float> v = random_values(dv, rng, 1.f);
        l2_normalize(q);
        l2_normalize(k);
        const float g = -std::fabs(random_values(1, rng, 1.f)[0]), beta = 0.7f;
        std::vector<float> o_ref(size_t(dv), NAN), o(size_t(dv), NAN);
        cpu::DeltaRuleInputs in{q.data(), k.data(), v.data(), &g, &beta, dk, dk, dv, 1, 1, dk, dv};
        cpu::delta_rule_recurrent(in, S_ref.data(), o_ref.data(), dv);
        std::vector<float> m(size_t(dv), NAN), r(size_t(dv), NAN);  // scratch: the step must not read it
        cpu_fast::delta_rule_step(q.data(), k.data(), v.data(), g, beta, dk, dv, S.data(), o.data(), m.data(),
                                  r.data());
        const double s_scale = max_abs(S_ref) + 1e-30, o_scale = max_abs(o_ref) + 1e-30;
        double s_err = 0, o_err = 0;
        for (size_t i = 0; i < S.size(); ++i) s_err = std::max(s_err, double(std::fabs(S[i] - S_ref[i])));
        for (size_t i = 0; i < o.size(); ++i)
          o_err = std::isfinite(o[i]) ? std::max(o_err, double(std::fabs(o[i] - o_ref[i]))) : INFINITY;
        ASSERT_LE(s_err, 1e-5 * s_scale) << "dk " << dk << " dv " << dv << " token " << t;
        // o = S'^T q with |q| = 1: S's scale bounds it (o itself may cancel to near zero).
        ASSERT_LE(o_err, 1e-5 * (o_scale + s_scale)) << "dk " << dk << " dv " << dv << " token " << t;
      }
    }
}

// delta_rule_tokens (a block of tokens, strided rows as the prefill lays them out) against the
// reference recurrence over the same tokens, on each instruction set this processor runs: the
// AVX-512 one-pass form for dv a multiple of 16 up to 128, delta_rule_step per token otherwise.
class DeltaRuleTokens : public ::testing::TestWithParam<cpu_fast::Isa> {
 protected:
  void SetUp() override {
    if (!cpu_fast::isa_supported(GetParam()))
      GTEST_SKIP() << "this processor does not run the " << cpu_fast::to_string(GetParam()) << " kernels";
    cpu_fast::use_isa(GetParam());
  }
  void TearDown() override { cpu_fast::use_isa(cpu_fast::best_isa()); }
};

TEST_P(DeltaRuleTokens, MatchesReferenceRecurrence) {
  std::mt19937 rng(7);
  for (int64_t dk : {1, 2, 63, 128})
    for (int64_t dv : {1, 16, 17, 48, 64, 128, 144})
      for (int64_t T : {1, 2, 9}) {
        const int64_t stride = 2 * dk + dv + 3;  // rows: q | k | v | padding, as a token's u
        std::vector<float> rows = random_values(T * stride, rng, 1.f), g(static_cast<size_t>(T)),
                           beta(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t part = 0; part < 2; ++part) {
            std::vector<float> x(rows.begin() + t * stride + part * dk, rows.begin() + t * stride + (part + 1) * dk);
            l2_normalize(x);
            std::copy(x.begin(), x.end(), rows.begin() + t * stride + part * dk);
          }
          g[size_t(t)] = -std::fabs(random_values(1, rng, 1.f)[0]);
          beta[size_t(t)] = 0.3f + 0.05f * float(t);
        }
        std::vector<float> S_ref = random_values(dk * dv, rng, 0.5f), S = S_ref;
        const cpu::DeltaRuleInputs in{rows.data(),
                                      rows.data() + dk,
                                      rows.data() + 2 * dk,
                                      g.data(),
                                      beta.data(),
                                      stride,
                                      stride,
                                      stride,
                                      1,
                                      T,
                                      dk,
                                      dv};
        const int64_t o_stride = dv + 5;
        std::vector<float> o_ref(size_t(T * o_stride), NAN), o(size_t(T * o_stride), NAN), m(static_cast<size_t>(dv)),
            r(static_cast<size_t>(dv));
        cpu::delta_rule_recurrent(in, S_ref.data(), o_ref.data(), o_stride);
        cpu_fast::delta_rule_tokens(in, S.data(), o.data(), o_stride, m.data(), r.data());
        const double s_scale = max_abs(S_ref) + 1e-30, o_scale = max_abs(o_ref) + 1e-30;
        double s_err = 0, o_err = 0;
        for (size_t i = 0; i < S.size(); ++i) s_err = std::max(s_err, double(std::fabs(S[i] - S_ref[i])));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t b = 0; b < dv; ++b) {
            const float got = o[size_t(t * o_stride + b)], want = o_ref[size_t(t * o_stride + b)];
            o_err = std::isfinite(got) ? std::max(o_err, double(std::fabs(got - want))) : INFINITY;
          }
        ASSERT_LE(s_err, 1e-5 * s_scale) << "dk " << dk << " dv " << dv << " T " << T;
        ASSERT_LE(o_err, 1e-5 * (o_scale + s_scale)) << "dk " << dk << " dv " << dv << " T " << T;
      }
}

INSTANTIATE_TEST_SUITE_P(Isas, DeltaRuleTokens,
                         ::testing::Values(cpu_fast::Isa::scalar, cpu_fast::Isa::avx2, cpu_fast::Isa::avx512),
                         [](const auto& info) { return std::string(cpu_fast::to_string(info.param)); });

}  // namespace
}  // namespace lily
