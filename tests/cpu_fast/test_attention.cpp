// The prefill's attention of one token's query heads over one KV head (attention_avx512.cpp)
// against attend (the decode step's, itself the reference's math) per head: 1 .. 8 heads,
// 1 .. 33 visible positions (the blocks of 16 keys and their edges), head sizes 32 .. 256,
// strided rows as the prefill lays them out, outputs poisoned with NaN. Skips where the
// processor lacks AVX-512.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/prefill.h"

namespace lily {
namespace {

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(AttendHeads, MatchesAttendPerHead) {
  if (!cpu_fast::isa_supported(cpu_fast::Isa::avx512)) GTEST_SKIP() << "this processor does not run AVX-512";
  std::mt19937 rng(3);
  int cases = 0;
  for (int64_t d : {32, 64, 256})
    for (int64_t heads : {1, 2, 5, 8})
      for (int64_t visible : {1, 2, 15, 16, 17, 33}) {
        const int64_t nkv = 2, g = 1, keys = (visible + 15) / 16 * 16;
        cpu::AttentionCache cache;  // [visible, nkv, d]
        cache.k = random_values(size_t(visible * nkv * d), rng);
        cache.v = random_values(size_t(visible * nkv * d), rng);
        std::vector<float> keys_t(size_t(d * keys), 0.f);
        for (int64_t e = 0; e < d; ++e)
          for (int64_t j = 0; j < visible; ++j) keys_t[size_t(e * keys + j)] = cache.k[size_t((j * nkv + g) * d + e)];
        const std::vector<float> qg = random_values(size_t(heads * 2 * d), rng);  // per head: q then gate
        std::vector<float> got(size_t(heads * (d + 3)), NAN), want(size_t(heads * d), NAN);
        std::vector<float> scores(size_t(heads * keys), NAN);
        const cpu_fast::AttentionHeads a{
            qg.data(), 2 * d,      qg.data() + d, 2 * d, keys_t.data(), keys, cache.v.data() + g * d,
            nkv * d,   got.data(), d + 3,         heads, visible,       d};
        ASSERT_TRUE(cpu_fast::detail::attend_heads_avx512(a, scores.data()));
        double worst = 0, scale = 1e-30;
        for (int64_t h = 0; h < heads; ++h) {
          std::vector<float> s(static_cast<size_t>(visible));
          cpu_fast::attend(qg.data() + h * 2 * d, qg.data() + h * 2 * d + d, cache, visible, nkv, g, d, s.data(),
                           want.data() + h * d);
          for (int64_t e = 0; e < d; ++e) {
            const float x = got[size_t(h * (d + 3) + e)], y = want[size_t(h * d + e)];
            worst = std::isfinite(x) ? std::max(worst, double(std::fabs(x - y))) : INFINITY;
            scale = std::max(scale, double(std::fabs(y)));
          }
          for (int64_t e = d; e < d + 3; ++e) EXPECT_TRUE(std::isnan(got[size_t(h * (d + 3) + e)])) << "past a row";
        }
        EXPECT_LE(worst, 1e-5 * scale) << "d " << d << " heads " << heads << " visible " << visible;
        ++cases;
      }
  EXPECT_EQ(cases, 72);
  // Shapes it does not take: it says so and leaves the output alone.
  std::vector<float> x(4096, 1.f), out(64, NAN), scores(1024);
  const cpu_fast::AttentionHeads odd{x.data(), 48, x.data(), 48, x.data(), 16, x.data(), 48, out.data(), 48, 1, 1, 48};
  EXPECT_FALSE(cpu_fast::detail::attend_heads_avx512(odd, scores.data()));
  const cpu_fast::AttentionHeads many{x.data(), 64, x.data(), 64, x.data(), 16, x.data(), 64, out.data(), 64, 9, 1, 64};
  EXPECT_FALSE(cpu_fast::detail::attend_heads_avx512(many, scores.data()));
  EXPECT_TRUE(std::isnan(out[0]));
}

// The decode step's and a batch row's form, the keys read in place from the cache: every head of
// the group in one pass against attend per head, 1 .. 8 heads, 1 .. 33 visible positions (the
// blocks of 4 keys and their edges), head sizes 64, 128 and 256 (the widths of
// the value passes: in_place), outputs poisoned.
TEST(AttendHeads, InPlaceMatchesAttendPerHead) {
  if (!cpu_fast::isa_supported(cpu_fast::Isa::avx512)) GTEST_SKIP() << "this processor does not run AVX-512";
  std::mt19937 rng(4);
  int cases = 0;
  for (int64_t d : {64, 128, 256})
    for (int64_t heads : {1, 2, 3, 8})
      for (int64_t visible : {1, 3, 4, 5, 17, 33}) {
        const int64_t nkv = 2, g = 1;
        cpu::AttentionCache cache;  // [visible, nkv, d]
        cache.k = random_values(size_t(visible * nkv * d), rng);
        cache.v = random_values(size_t(visible * nkv * d), rng);
        const std::vector<float> qg = random_values(size_t(heads * 2 * d), rng);  // per head: q then gate
        std::vector<float> got(size_t(heads * (d + 3)), NAN), want(size_t(heads * d), NAN);
        std::vector<float> scores(size_t(heads * visible), NAN);
        const cpu_fast::AttentionHeads a{qg.data(),
                                         2 * d,
                                         qg.data() + d,
                                         2 * d,
                                         cache.k.data() + g * d,
                                         nkv * d,
                                         cache.v.data() + g * d,
                                         nkv * d,
                                         got.data(),
                                         d + 3,
                                         heads,
                                         visible,
                                         d};
        ASSERT_TRUE(cpu_fast::detail::attend_in_place_avx512(a, scores.data()));
        double worst = 0, scale = 1e-30;
        for (int64_t h = 0; h < heads; ++h) {
          std::vector<float> s(static_cast<size_t>(visible));
          cpu_fast::attend(qg.data() + h * 2 * d, qg.data() + h * 2 * d + d, cache, visible, nkv, g, d, s.data(),
                           want.data() + h * d);
          for (int64_t e = 0; e < d; ++e) {
            const float x = got[size_t(h * (d + 3) + e)], y = want[size_t(h * d + e)];
            worst = std::isfinite(x) ? std::max(worst, double(std::fabs(x - y))) : INFINITY;
            scale = std::max(scale, double(std::fabs(y)));
          }
          for (int64_t e = d; e < d + 3; ++e) EXPECT_TRUE(std::isnan(got[size_t(h * (d + 3) + e)])) << "past a row";
        }
        EXPECT_LE(worst, 1e-5 * scale) << "d " << d << " heads " << heads << " visible " << visible;
        ++cases;
      }
  EXPECT_EQ(cases, 72);
  std::vector<float> x(4096, 1.f), out(64, NAN), scores(1024);
  const cpu_fast::AttentionHeads odd{x.data(), 32, x.data(), 32, x.data(), 32, x.data(), 32, out.data(), 32, 1, 1, 32};
  EXPECT_FALSE(cpu_fast::detail::attend_in_place_avx512(odd, scores.data())) << "d not a multiple of 64";
  const cpu_fast::AttentionHeads many{x.data(), 64, x.data(), 64, x.data(), 64, x.data(), 64, out.data(), 64, 9, 1, 64};
  EXPECT_FALSE(cpu_fast::detail::attend_in_place_avx512(many, scores.data()));
  EXPECT_TRUE(std::isnan(out[0]));
}

}  // namespace
}  // namespace lily
