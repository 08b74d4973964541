// The fast CPU backend against the fp32 reference backend (issue 20, item 3): on the golden
// fixture tiny-a (mlx 4-bit, and the bf16 layout the kernels leave to the reference) and on
// lily-tiny, token by token so every step runs the fast decode path:
//   logits within 1e-2 of max |reference| and the same argmax at >= 99% of positions, and
//   against transformers' logits too; greedy generation on lily-tiny equal for 64 tokens;
//   teacher-forced perplexity on lily-tiny within 0.1% of the reference's, prefilled (the fast
//   products over blocks of tokens) and token by token; a prefill's logits within the same bar.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../model/fixture.h"
#include "backend/backend.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "backend/cpu_fast/gemv.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace lily {
namespace {

const std::string kLilyTiny = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

struct Comparison {
  double max_abs_diff = 0, max_abs_ref = 0;
  int64_t positions = 0, argmax_mismatches = 0;
};

Comparison compare(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  Comparison c;
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    c.max_abs_diff = std::max(c.max_abs_diff, double(std::fabs(got[i] - want[i])));
    c.max_abs_ref = std::max(c.max_abs_ref, double(std::fabs(want[i])));
    if (!std::isfinite(got[i])) c.max_abs_diff = INFINITY;
  }
  c.positions = int64_t(want.size()) / vocab;
  for (int64_t t = 0; t < c.positions; ++t)
    c.argmax_mismatches += argmax(&got[size_t(t * vocab)], vocab) != argmax(&want[size_t(t * vocab)], vocab);
  return c;
}

// Logits [T, V] of `ids` fed one token at a time (every step a decode step).
std::vector<float> one_at_a_time(Backend& backend, const std::vector<int32_t>& ids) {
  const int64_t V = backend.config().vocab_size;
  auto seq = backend.new_sequence(int64_t(ids.size()) + 1);
  std::vector<float> all(ids.size() * size_t(V), NAN), step;
  for (size_t t = 0; t < ids.size(); ++t) {
    backend.forward(*seq, std::span<const int32_t>(&ids[t], 1), LogitsWanted::last, step);
    EXPECT_EQ(step.size(), size_t(V));
    std::copy(step.begin(), step.end(), all.begin() + std::ptrdiff_t(t * size_t(V)));
  }
  return all;
}

void expect_within_bar(const Comparison& c, const std::string& what) {
  std::printf("[%s] max |diff| = %.3g, max |ref| = %.3g, relative %.3g, argmax mismatches %lld of %lld\n", what.c_str(),
              c.max_abs_diff, c.max_abs_ref, c.max_abs_diff / c.max_abs_ref, (long long)c.argmax_mismatches,
              (long long)c.positions);
  EXPECT_LE(c.max_abs_diff, 1e-2 * c.max_abs_ref) << what;
  EXPECT_LE(double(c.argmax_mismatches), 0.01 * double(c.positions)) << what;
}

struct Layout {
  const char* dir;
  const char* reference;  // transformers' logits of this layout (hf or mlx)
};

class FastOnFixture : public ::testing::TestWithParam<Layout> {};

TEST_P(FastOnFixture, DecodeStepsMatchReferenceAndTransformers) {
  const Layout layout = GetParam();
  const std::string dir = test::fixture_dir("tiny-a");
  auto weights = load_model(dir + "/" + layout.dir);
  auto ref_json = test::read_json(dir + "/reference.json");
  const auto ids = ref_json["ids"].get<std::vector<int32_t>>();
  const int64_t V = ref_json["vocab_size"].get<int64_t>();
  const std::vector<float> transformers = test::read_f32(dir + "/" +
                                                         ref_json["logits"][layout.reference].get<std::string>());

  auto fast = make_cpu_fast_backend(weights);
  auto reference = make_cpu_backend(weights);
  const std::vector<float> got = one_at_a_time(*fast, ids);
  const std::vector<float> want = one_at_a_time(*reference, ids);
  expect_within_bar(compare(got, want, V), std::string(layout.dir) + " fast vs reference");
  expect_within_bar(compare(got, transformers, V), std::string(layout.dir) + " fast vs transformers");
}

// The whole prompt at once (the prefill layers, prefill.h; the bf16 layout's matrices through
// the dequantizing fallback), every position's logits, against both.
TEST_P(FastOnFixture, PrefillMatchesReferenceAndTransformers) {
  const Layout layout = GetParam();
  const std::string dir = test::fixture_dir("tiny-a");
  auto weights = load_model(dir + "/" + layout.dir);
  auto ref_json = test::read_json(dir + "/reference.json");
  const auto ids = ref_json["ids"].get<std::vector<int32_t>>();
  const int64_t V = ref_json["vocab_size"].get<int64_t>();
  const std::vector<float> transformers = test::read_f32(dir + "/" +
                                                         ref_json["logits"][layout.reference].get<std::string>());
  auto fast = make_cpu_fast_backend(weights);
  auto reference = make_cpu_backend(weights);
  std::vector<float> got(3, NAN), want;  // poisoned: forward must size and fill it
  auto seq = fast->new_sequence(int64_t(ids.size()));
  fast->forward(*seq, ids, LogitsWanted::all, got);
  auto ref_seq = reference->new_sequence(int64_t(ids.size()));
  reference->forward(*ref_seq, ids, LogitsWanted::all, want);
  expect_within_bar(compare(got, want, V), std::string(layout.dir) + " prefill, fast vs reference");
  expect_within_bar(compare(got, transformers, V), std::string(layout.dir) + " prefill, fast vs transformers");
}

INSTANTIATE_TEST_SUITE_P(Layouts, FastOnFixture, ::testing::Values(Layout{"mlx-q4", "mlx"}, Layout{"hf-fused", "hf"}),
                         [](const auto& info) {
                           std::string n = info.param.dir;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

std::vector<int32_t> greedy(Backend& backend, const std::vector<int32_t>& prompt, int n) {
  auto seq = backend.new_sequence(int64_t(prompt.size()) + n + 1);
  std::vector<float> logits;
  backend.forward(*seq, prompt, LogitsWanted::last, logits);  // prefill: the reference layers in both
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t next = int32_t(argmax(logits.data(), int64_t(logits.size())));
    out.push_back(next);
    backend.forward(*seq, std::span<const int32_t>(&next, 1), LogitsWanted::last, logits);
  }
  return out;
}

TEST(FastOnLilyTiny, DecodeStepsMatchReference) {
  auto weights = load_model(kLilyTiny);
  std::vector<int32_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back(int32_t((i * 7919 + 13) % weights->config.vocab_size));
  auto fast = make_cpu_fast_backend(weights);
  auto reference = make_cpu_backend(weights);
  expect_within_bar(compare(one_at_a_time(*fast, ids), one_at_a_time(*reference, ids), weights->config.vocab_size),
                    "lily-tiny fast vs reference");
}

// The whole decode path on each instruction set this processor has (the others skip): the
// scalar kernels always, AVX2 and AVX-512 VNNI where they run.
class FastOnEveryIsa : public ::testing::TestWithParam<cpu_fast::Isa> {
 protected:
  void SetUp() override {
    if (!cpu_fast::isa_supported(GetParam()))
      GTEST_SKIP() << "this processor does not run the " << cpu_fast::to_string(GetParam()) << " kernels";
    cpu_fast::use_isa(GetParam());
  }
  void TearDown() override { cpu_fast::use_isa(cpu_fast::best_isa()); }
};

TEST_P(FastOnEveryIsa, LilyTinyDecodeStepsMatchReference) {
  ASSERT_EQ(cpu_fast::active_isa(), GetParam());
  auto weights = load_model(kLilyTiny);
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(int32_t((i * 7919 + 13) % weights->config.vocab_size));
  auto fast = make_cpu_fast_backend(weights);
  auto reference = make_cpu_backend(weights);
  expect_within_bar(compare(one_at_a_time(*fast, ids), one_at_a_time(*reference, ids), weights->config.vocab_size),
                    std::string("lily-tiny fast (") + cpu_fast::to_string(GetParam()) + ") vs reference");
}

// A prefill in two blocks (the second from position 37: attention over the first block's
// cache, the DeltaNet states carried) and a decode step after it, on each instruction set.
TEST_P(FastOnEveryIsa, LilyTinyPrefillMatchesReference) {
  auto weights = load_model(kLilyTiny);
  const int64_t V = weights->config.vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 70; ++i) ids.push_back(int32_t((i * 7919 + 13) % V));
  auto fast = make_cpu_fast_backend(weights);
  auto reference = make_cpu_backend(weights);
  auto run = [&](Backend& b) {
    auto seq = b.new_sequence(int64_t(ids.size()) + 1);
    std::vector<float> first, second, step;
    b.forward(*seq, std::span<const int32_t>(ids.data(), 37), LogitsWanted::all, first);
    b.forward(*seq, std::span<const int32_t>(ids.data() + 37, ids.size() - 37), LogitsWanted::all, second);
    first.insert(first.end(), second.begin(), second.end());
    b.forward(*seq, std::span<const int32_t>(&ids[5], 1), LogitsWanted::last, step);
    first.insert(first.end(), step.begin(), step.end());
    return first;
  };
  expect_within_bar(compare(run(*fast), run(*reference), V),
                    std::string("lily-tiny prefill (") + cpu_fast::to_string(GetParam()) + ") vs reference");
}

INSTANTIATE_TEST_SUITE_P(Isas, FastOnEveryIsa,
                         ::testing::Values(cpu_fast::Isa::scalar, cpu_fast::Isa::avx2, cpu_fast::Isa::avx512),
                         [](const auto& info) { return std::string(cpu_fast::to_string(info.param)); });

TEST(FastOnLilyTiny, Greedy64TokensEqualReference) {
  auto weights = load_model(kLilyTiny);
  const std::vector<int32_t> prompt = {1829, 100, 200, 300, 400, 500, 17, 42, 1000, 1500};
  auto fast = make_cpu_fast_backend(weights);
  auto reference = make_cpu_backend(weights);
  const std::vector<int32_t> got = greedy(*fast, prompt, 64), want = greedy(*reference, prompt, 64);
  EXPECT_EQ(got, want);
}

// Perplexity of ids[1..] given the logits [T, V] of ids[0..T-1] (teacher forcing).
double perplexity(const std::vector<float>& logits, const std::vector<int32_t>& ids, int64_t V) {
  double nll = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits.data() + t * size_t(V);
    const double max_logit = *std::max_element(row, row + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - max_logit);
    nll -= double(row[ids[t + 1]]) - max_logit - std::log(sum);
  }
  return std::exp(nll / double(ids.size() - 1));
}

TEST(FastOnLilyTiny, TeacherForcedPerplexityWithinATenthOfAPercent) {
  auto weights = load_model(kLilyTiny);
  const int64_t V = weights->config.vocab_size;
  auto fast = make_cpu_fast_backend(weights);
  auto reference = make_cpu_backend(weights);
  // Text: a held-out prompt (a chat-rendered question) and the reference's greedy reply to it.
  const Tokenizer tokenizer = Tokenizer::load_from_model_dir(kLilyTiny);
  const auto tests = test::read_json(kLilyTiny + "/heldout.json")["tests"];
  std::vector<int32_t> ids = tokenizer.encode(tests[0]["prompt"].get<std::string>());
  const std::vector<int32_t> reply = greedy(*reference, ids, 100);
  ids.insert(ids.end(), reply.begin(), reply.end());
  std::vector<float> fast_logits, reference_logits;
  auto prefill = [&](Backend& b, std::vector<float>& logits) {
    auto seq = b.new_sequence(int64_t(ids.size()));
    b.forward(*seq, ids, LogitsWanted::all, logits);
  };
  prefill(*fast, fast_logits);
  prefill(*reference, reference_logits);
  expect_within_bar(compare(fast_logits, reference_logits, V), "lily-tiny prefill, fast vs reference");
  const double want = perplexity(reference_logits, ids, V);
  const double prefilled = perplexity(fast_logits, ids, V);
  const double stepped = perplexity(one_at_a_time(*fast, ids), ids, V);
  std::printf("[lily-tiny perplexity over %zu tokens] reference %.6f, fast prefilled %.6f (%+.2e), fast stepped %.6f "
              "(%+.2e)\n",
              ids.size(), want, prefilled, prefilled / want - 1, stepped, stepped / want - 1);
  EXPECT_LE(std::fabs(prefilled / want - 1), 1e-3);
  EXPECT_LE(std::fabs(stepped / want - 1), 1e-3);
}

// Prefill, decode, snapshot and restore on one sequence: the fast decode shares the reference
// layers' caches, so a rolled-back sequence decodes the same logits again.
TEST(FastOnLilyTiny, SnapshotRestoreAndCloneDecodeAlike) {
  auto weights = load_model(kLilyTiny);
  auto fast = make_cpu_fast_backend(weights);
  auto seq = fast->new_sequence(64);
  const std::vector<int32_t> prompt = {1829, 5, 6, 7, 8, 9, 10};
  std::vector<float> logits, first, again, cloned;
  fast->forward(*seq, prompt, LogitsWanted::none, logits);
  auto snap = seq->snapshot();
  const int32_t a = 11, b = 12;
  fast->forward(*seq, std::span<const int32_t>(&a, 1), LogitsWanted::last, logits);
  auto copy = seq->clone();
  fast->forward(*seq, std::span<const int32_t>(&b, 1), LogitsWanted::last, first);
  fast->forward(*copy, std::span<const int32_t>(&b, 1), LogitsWanted::last, cloned);
  EXPECT_EQ(first, cloned);
  seq->restore(*snap);
  EXPECT_EQ(seq->length(), int64_t(prompt.size()));
  fast->forward(*seq, std::span<const int32_t>(&a, 1), LogitsWanted::last, logits);
  fast->forward(*seq, std::span<const int32_t>(&b, 1), LogitsWanted::last, again);
  EXPECT_EQ(first, again);
  // A state of the reference backend is refused by name.
  auto reference = make_cpu_backend(weights);
  auto foreign = reference->new_sequence(8);
  EXPECT_THROW(fast->forward(*foreign, std::span<const int32_t>(&a, 1), LogitsWanted::last, logits), std::exception);
  // The two CPU backends share one state class (backend/cpu/sequence_state.h) and still refuse
  // each other's states and snapshots, the refused restore changing nothing.
  EXPECT_THROW(reference->forward(*seq, std::span<const int32_t>(&a, 1), LogitsWanted::last, logits), std::exception);
  EXPECT_THROW(seq->restore(*foreign->snapshot()), std::exception);
  EXPECT_THROW(foreign->restore(*seq->snapshot()), std::exception);
  EXPECT_EQ(seq->length(), int64_t(prompt.size()) + 2);
}

// A step of several sequences (Backend::forward_batch: one block, every weight read once; a batch
// of one is the decode step, test_batch.cpp has the sizes and depths): row i is what sequence i
// alone gives for its token, within 1e-3 of its max |logit| and the same argmax, the sequences
// at different lengths (one empty); a second step from there; and the argument checks: a token per sequence, none
// null, none twice, none full, every token in the vocabulary, and nothing changed by a refused
// step (the rows before the bad one included).
TEST(FastOnLilyTiny, BatchStepIsEachSequenceStepped) {
  auto weights = load_model(kLilyTiny);
  auto fast = make_cpu_fast_backend(weights);
  const int64_t V = fast->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{1829, 5, 6}, {}, {7, 8, 9, 10, 11, 12, 13}, {14}};
  std::vector<std::unique_ptr<SequenceState>> batch, alone;
  std::vector<float> logits;
  for (const auto& p : prompts) {
    batch.push_back(fast->new_sequence(16));
    alone.push_back(fast->new_sequence(16));
    if (p.empty()) continue;
    fast->forward(*batch.back(), p, LogitsWanted::none, logits);
    fast->forward(*alone.back(), p, LogitsWanted::none, logits);
  }
  std::vector<SequenceState*> states;
  for (auto& s : batch) states.push_back(s.get());
  for (const std::vector<int32_t>& tokens :
       {std::vector<int32_t>{20, 21, 22, 23}, std::vector<int32_t>{30, 31, 32, 33}}) {
    std::vector<float> rows, row;
    fast->forward_batch(states, tokens, rows);
    ASSERT_EQ(rows.size(), prompts.size() * size_t(V));
    for (size_t i = 0; i < prompts.size(); ++i) {
      fast->forward(*alone[i], std::span<const int32_t>(&tokens[i], 1), LogitsWanted::last, row);
      const std::vector<float> got(rows.begin() + std::ptrdiff_t(i * size_t(V)),
                                   rows.begin() + std::ptrdiff_t((i + 1) * size_t(V)));
      const Comparison cmp = compare(got, row, V);
      EXPECT_LE(cmp.max_abs_diff, 1e-3 * cmp.max_abs_ref) << "row " << i;
      EXPECT_EQ(cmp.argmax_mismatches, 0) << "row " << i;
      EXPECT_EQ(batch[i]->length(), alone[i]->length()) << "row " << i;
    }
  }
  const int32_t t = 40;
  SequenceState* twice[] = {states[0], states[2], states[0]};
  const int32_t three[] = {t, t, t};
  EXPECT_THROW(fast->forward_batch(twice, three, logits), std::exception);
  SequenceState* with_null[] = {states[0], nullptr};
  EXPECT_THROW(fast->forward_batch(with_null, std::span<const int32_t>(three, 2), logits), std::exception);
  EXPECT_THROW(fast->forward_batch(states, std::span<const int32_t>(three, 3), logits), std::exception);
  const int32_t bad[] = {t, -1, t};  // a token outside the vocabulary, after a good row
  SequenceState* three_states[] = {states[0], states[2], states[3]};
  EXPECT_THROW(fast->forward_batch(three_states, bad, logits), std::exception);
  auto full = fast->new_sequence(1);  // room for one token: full after it
  fast->forward(*full, std::span<const int32_t>(&t, 1), LogitsWanted::none, logits);
  SequenceState* with_full[] = {states[0], full.get()};
  EXPECT_THROW(fast->forward_batch(with_full, std::span<const int32_t>(three, 2), logits), std::exception);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(batch[i]->length(), alone[i]->length()) << "a refused step changed sequence " << i;
}

}  // namespace
}  // namespace lily
