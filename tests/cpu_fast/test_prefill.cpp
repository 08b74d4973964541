// The prefill layers (cpu_fast/prefill.h) against the reference layers (backend/cpu/ops.h) on
// lily-tiny's weights, one layer at a time, on each instruction set this processor runs (the
// others skip): blocks of T = 1, 2, 15, 16, 17, 63, 64, 65 tokens (tiles of 8 tokens, panels of
// 16 rows, blocks of 16 keys and their edges), each after a block of 5 (its attention over the
// first block's cache, the DeltaNet states carried), one scratch for every block, outputs
// poisoned with NaN. Outputs and the caches left within 1e-3 of max |reference| (x's 16-bit rounding and the
// approximate e^x give ~1e-4; a wrong token, row or head is off by the output's own scale).
// The MoE blocks give experts 1 token, odd numbers of tokens and more than a tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/prefill.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"

namespace lily {
namespace {

using cpu_fast::Isa;

constexpr int64_t kBlocks[] = {1, 2, 15, 16, 17, 63, 64, 65};
constexpr int64_t kFirstBlock = 5;
constexpr double kBar = 1e-3;

const ModelWeights& lily_tiny() {
  static const std::shared_ptr<ModelWeights> weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  return *weights;
}

const LayerWeights& first_layer(LayerKind kind) {
  for (const LayerWeights& layer : lily_tiny().layers)
    if (layer.kind == kind) return layer;
  throw std::runtime_error("lily-tiny has no layer of this kind");
}

std::vector<float> random_rows(int64_t T, int64_t H, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(size_t(T * H));
  for (auto& v : x) v = dist(rng);
  return x;
}

// max |got - want| / max |want|; infinite where got has a NaN or infinity, or another size.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, double(std::fabs(got[i] - want[i])));
    scale = std::max(scale, double(std::fabs(want[i])));
  }
  return diff / scale;
}

cpu::DeltaNetCache fresh_deltanet_cache(const ModelConfig& c) {
  cpu::DeltaNetCache cache;
  cache.conv.assign(size_t((c.linear_conv_kernel_dim - 1) * c.linear_conv_dim()), 0.f);
  cache.ssm.assign(size_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim, 0.f);
  return cache;
}

class PrefillLayers : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu_fast::isa_supported(GetParam()))
      GTEST_SKIP() << "this processor does not run the " << cpu_fast::to_string(GetParam()) << " kernels";
    cpu_fast::use_isa(GetParam());
  }
  void TearDown() override { cpu_fast::use_isa(cpu_fast::best_isa()); }
  std::string where(int64_t T) const {
    return std::string(cpu_fast::to_string(GetParam())) + ", T " + std::to_string(T);
  }
};

TEST_P(PrefillLayers, DeltaNetMatchesReference) {
  const ModelConfig& c = lily_tiny().config;
  const DeltaNetWeights& w = first_layer(LayerKind::linear_attention).deltanet;
  const int64_t H = c.hidden_size;
  cpu_fast::PrefillScratch s;
  double worst = 0;
  for (int64_t T : kBlocks) {
    cpu::DeltaNetCache want_cache = fresh_deltanet_cache(c), got_cache = want_cache;
    for (int64_t n : {kFirstBlock, T}) {
      const std::vector<float> x = random_rows(n, H, uint32_t(T * 100 + n));
      std::vector<float> want(size_t(n * H), NAN), got(size_t(n * H), NAN);
      cpu::gated_deltanet(w, c, want_cache, x.data(), n, want.data());
      cpu_fast::deltanet_prefill(w, c, got_cache, x.data(), n, got.data(), s);
      const double e = relative_error(got, want);
      worst = std::max(worst, e);
      EXPECT_LE(e, kBar) << where(T) << ": the output of a block of " << n;
    }
    EXPECT_LE(relative_error(got_cache.conv, want_cache.conv), kBar) << where(T) << ": the conv state";
    EXPECT_LE(relative_error(got_cache.ssm, want_cache.ssm), kBar) << where(T) << ": the delta rule's state";
  }
  std::printf("[DeltaNet prefill, %s] worst output error %.3g of max |reference|\n", cpu_fast::to_string(GetParam()),
              worst);
}

TEST_P(PrefillLayers, AttentionMatchesReference) {
  const ModelConfig& c = lily_tiny().config;
  const AttentionWeights& w = first_layer(LayerKind::full_attention).attention;
  const int64_t H = c.hidden_size;
  cpu_fast::PrefillScratch s;
  double worst = 0;
  for (int64_t T : kBlocks) {
    cpu::AttentionCache want_cache, got_cache;
    int64_t position = 0;
    for (int64_t n : {kFirstBlock, T}) {
      const std::vector<float> x = random_rows(n, H, uint32_t(T * 100 + n + 7));
      std::vector<float> want(size_t(n * H), NAN), got(size_t(n * H), NAN);
      cpu::gated_attention(w, c, want_cache, position, x.data(), n, want.data());
      cpu_fast::attention_prefill(w, c, got_cache, position, x.data(), n, got.data(), s);
      const double e = relative_error(got, want);
      worst = std::max(worst, e);
      EXPECT_LE(e, kBar) << where(T) << ": the output of a block of " << n << " from position " << position;
      position += n;
    }
    EXPECT_LE(relative_error(got_cache.k, want_cache.k), kBar) << where(T) << ": the cached keys";
    EXPECT_LE(relative_error(got_cache.v, want_cache.v), kBar) << where(T) << ": the cached values";
  }
  std::printf("[attention prefill, %s] worst output error %.3g of max |reference|\n", cpu_fast::to_string(GetParam()),
              worst);
}

TEST_P(PrefillLayers, MoeMatchesReference) {
  const ModelConfig& c = lily_tiny().config;
  const MoeWeights& w = first_layer(LayerKind::linear_attention).moe;
  const int64_t H = c.hidden_size;
  cpu_fast::PrefillScratch s;
  std::set<int32_t> counts;  // tokens an expert was given, over every block
  double worst = 0;
  for (int64_t T : kBlocks) {
    const std::vector<float> x = random_rows(T, H, uint32_t(T + 11));
    std::vector<float> want(size_t(T * H), NAN), got(size_t(T * H), NAN);
    cpu::sparse_moe(w, c, x.data(), T, want.data());
    cpu_fast::moe_prefill(w, c, x.data(), T, got.data(), s);
    const double e = relative_error(got, want);
    worst = std::max(worst, e);
    EXPECT_LE(e, kBar) << where(T);
    counts.insert(s.count.begin(), s.count.end());
  }
  std::printf("[MoE prefill, %s] worst output error %.3g of max |reference|\n", cpu_fast::to_string(GetParam()), worst);
  auto odd_above_one = [](int32_t n) { return n > 1 && n % 2 == 1; };
  EXPECT_TRUE(counts.count(1)) << "no expert had a single token";
  EXPECT_TRUE(std::any_of(counts.begin(), counts.end(), odd_above_one)) << "no expert had an odd number of tokens";
  EXPECT_GT(*counts.rbegin(), cpu_fast::kTokenTile) << "no expert had more than a tile of tokens";
}

INSTANTIATE_TEST_SUITE_P(Isas, PrefillLayers, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const auto& info) { return std::string(cpu_fast::to_string(info.param)); });

}  // namespace
}  // namespace lily
