// fast_math.h against the standard library: e^x within 3 ulp over the range it keeps exact
// (x in [-87.3, 88.3], every 2^-12 and a million random points), the clamps beyond it, NaN
// through; SiLU and sigmoid within 3e-7 of cpu::silu and cpu::sigmoid relative to |x| + 1.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/fast_math.h"

namespace lily {
namespace {

double relative_error(float got, double want) { return std::fabs(double(got) - want) / std::fabs(want); }

TEST(FastMath, ExpWithinThreeUlp) {
  double worst = 0;
  float at = 0;
  auto check = [&](float x) {
    const double e = relative_error(cpu_fast::exp_approx(x), std::exp(double(x)));
    if (e > worst) worst = e, at = x;
  };
  for (float x = -87.3f; x <= 88.3f; x += 1.f / 4096) check(x);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-87.3f, 88.3f);
  for (int i = 0; i < 1000000; ++i) check(dist(rng));
  EXPECT_LE(worst, 3 * 5.96e-8) << "at x = " << at;
  EXPECT_EQ(cpu_fast::exp_approx(0.f), 1.f);
  EXPECT_GT(cpu_fast::exp_approx(-1000.f), 0.f);
  EXPECT_LT(cpu_fast::exp_approx(-1000.f), 2e-38f);
  EXPECT_TRUE(std::isfinite(cpu_fast::exp_approx(1000.f)));
  EXPECT_GT(cpu_fast::exp_approx(1000.f), 2e38f);
  EXPECT_TRUE(std::isnan(cpu_fast::exp_approx(NAN)));
}

TEST(FastMath, SiluAndSigmoidMatchTheReference) {
  double worst_silu = 0, worst_sigmoid = 0;
  for (float x = -120.f; x <= 120.f; x += 1.f / 1024) {
    worst_silu = std::max(worst_silu, std::fabs(double(cpu_fast::silu_approx(x)) - cpu::silu(x)) / (std::fabs(x) + 1));
    worst_sigmoid = std::max(worst_sigmoid, std::fabs(double(cpu_fast::sigmoid_approx(x)) - cpu::sigmoid(x)));
  }
  EXPECT_LE(worst_silu, 3e-7);
  EXPECT_LE(worst_sigmoid, 3e-7);
  EXPECT_TRUE(std::isnan(cpu_fast::silu_approx(NAN)));
}

}  // namespace
}  // namespace lily
