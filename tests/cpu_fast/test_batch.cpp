// The fast CPU backend's batch step (Backend::forward_batch: one token of each of N sequences,
// every weight read once for all the rows, each row's attention and DeltaNet on its own
// sequence's caches) against each sequence stepped alone (forward(), the decode step), on the
// golden fixture tiny-a (mlx 4-bit, and the bf16 layout the kernels leave to the dequantizing
// fallback) and on lily-tiny: N = 1, 2, 3, 4, 8, 9 (tiles of 8 tokens and past one) sequences at
// different depths (a fresh one at position 0, short ones, ones past the 64-token chunk of the
// delta rule, prefilled and decoded to there), three steps in a row. Each row within 1e-3 of
// its alone row's max |logit| (the products' x is rounded alike; the sums run in another
// order), the same argmax, the lengths equal; the output poisoned (NaN, the wrong size); and
// every row far from every other sequence's row, so swapped rows or states would fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "../model/fixture.h"
#include "backend/backend.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"

namespace lily {
namespace {

// Depths of the sequences of a batch of N: the first N.
constexpr int32_t kDepths[] = {70, 0, 130, 3, 64, 1, 200, 65, 17};

struct Model {
  const char* name;
  std::string dir;
};

const Model kModels[] = {{"tiny_a_mlx_q4", test::fixture_dir("tiny-a") + "/mlx-q4"},
                         {"tiny_a_hf_fused", test::fixture_dir("tiny-a") + "/hf-fused"},
                         {"lily_tiny", std::string(LILY_SOURCE_DIR) + "/models/lily-tiny"}};

struct Case {
  int model;  // into kModels
  int n;      // sequences
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(kModels[info.param.model].name) + "_n" + std::to_string(info.param.n);
}

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

// max |a - b| over a row of n (infinite where a is not finite).
double max_diff(const float* a, const float* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::isfinite(a[i]) ? std::max(d, double(std::fabs(a[i] - b[i]))) : INFINITY;
  return d;
}

double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i])));
  return m;
}

// A sequence of `depth` random tokens: its prompt prefilled but for the last two, which are
// decode steps (both paths leave the caches a batch row reads).
std::unique_ptr<SequenceState> sequence_at(Backend& backend, int32_t depth, std::mt19937& rng) {
  const int32_t V = backend.config().vocab_size;
  auto seq = backend.new_sequence(int64_t(depth) + 8);
  std::vector<int32_t> ids(static_cast<size_t>(depth));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(V));
  const size_t prefilled = ids.size() > 2 ? ids.size() - 2 : 0;
  std::vector<float> logits;
  if (prefilled > 0) backend.forward(*seq, std::span(ids.data(), prefilled), LogitsWanted::none, logits);
  for (size_t t = prefilled; t < ids.size(); ++t)
    backend.forward(*seq, std::span(&ids[t], 1), LogitsWanted::last, logits);
  EXPECT_EQ(seq->length(), depth);
  return seq;
}

class BatchStep : public ::testing::TestWithParam<Case> {};

TEST_P(BatchStep, RowsAreEachSequenceSteppedAlone) {
  const Case cs = GetParam();
  auto weights = load_model(kModels[cs.model].dir);
  auto fast = make_cpu_fast_backend(weights);
  const int64_t V = fast->config().vocab_size;
  const size_t N = size_t(cs.n);
  std::mt19937 rng(uint32_t(1000 + cs.n));
  std::vector<std::unique_ptr<SequenceState>> batch, alone;
  std::vector<SequenceState*> states;
  for (size_t i = 0; i < N; ++i) {
    batch.push_back(sequence_at(*fast, kDepths[i], rng));
    alone.push_back(batch.back()->clone());
    states.push_back(batch.back().get());
  }
  double worst = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<int32_t> tokens(N);
    for (auto& t : tokens) t = int32_t(rng() % uint32_t(V));
    std::vector<float> rows(3, NAN);  // poisoned, and the wrong size: forward_batch sizes and fills it
    if (step == 1) rows.assign(N * size_t(V) + 5, NAN);
    fast->forward_batch(states, tokens, rows);
    ASSERT_EQ(rows.size(), N * size_t(V)) << "step " << step;
    std::vector<std::vector<float>> want(N);
    for (size_t i = 0; i < N; ++i) {
      fast->forward(*alone[i], std::span(&tokens[i], 1), LogitsWanted::last, want[i]);
      ASSERT_EQ(want[i].size(), size_t(V));
    }
    for (size_t i = 0; i < N; ++i) {
      const float* got = rows.data() + i * size_t(V);
      const double bar = 1e-3 * max_abs(want[i].data(), V), diff = max_diff(got, want[i].data(), V);
      worst = std::max(worst, diff / max_abs(want[i].data(), V));
      EXPECT_LE(diff, bar) << "step " << step << ", row " << i << " (depth " << kDepths[i] << ")";
      EXPECT_EQ(argmax(got, V), argmax(want[i].data(), V)) << "step " << step << ", row " << i;
      EXPECT_EQ(batch[i]->length(), alone[i]->length()) << "step " << step << ", row " << i;
      // Another sequence's row is far off: a swap of rows (or of the states they ran on) fails.
      for (size_t j = 0; j < N; ++j) {
        if (j == i) continue;
        EXPECT_GT(max_diff(got, want[j].data(), V), 10 * bar) << "rows " << i << " and " << j << " alike";
      }
    }
  }
  std::printf("[%s, %zu sequences] worst max |batch - alone| / max |alone| = %.3g\n", kModels[cs.model].name, N, worst);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int m = 0; m < int(std::size(kModels)); ++m)
    for (int n : {1, 2, 3, 4, 8, 9}) out.push_back({m, n});
  return out;
}

INSTANTIATE_TEST_SUITE_P(ModelsAndSizes, BatchStep, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace lily
