// Speculative decoding (runtime/speculative.h) on the random fixture tiny-a, reference backend:
// greedy gives token for token plain greedy's tokens (K = 1, 2, 3, prompts of several lengths,
// stop tokens, max_tokens at and around the step's edges); drafts forced right or wrong so that
// every accept length 0..K and the all-accepted step run, with keep_row_states / rewind offered
// and refused (the snapshot-and-replay path); the state afterwards (sequence and MTP cache) is the
// teacher-forced one; and a model without the head is refused before anything runs.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/speculative.h"
#include "test_speculative_backend.h"

namespace lily {
namespace {

using test::ForcedDraftBackend;
using test::load_tiny;
using test::run_generate;
using test::TinyModel;

GenerateRequest greedy_request(std::span<const int32_t> prompt, int64_t max_new, int speculate) {
  GenerateRequest r;
  r.prompt.assign(prompt.begin(), prompt.end());
  r.max_new_tokens = max_new;
  r.sampling.temperature = 0;
  r.speculate = speculate;
  return r;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Speculative, GreedyGivesPlainTokens) {
  for (const char* layout : {"hf-fused", "mlx-q4"}) {
    TinyModel t = load_tiny(layout);
    for (size_t prompt_len : {size_t(1), size_t(2), size_t(7), size_t(20)}) {
      const std::span<const int32_t> prompt = std::span<const int32_t>(t.ids).first(prompt_len);
      const GenerateResult plain = run_generate(*t.backend, greedy_request(prompt, 24, 0));
      for (int k : {1, 2, 3}) {
        const GenerateResult spec = run_generate(*t.backend, greedy_request(prompt, 24, k));
        EXPECT_EQ(spec.tokens, plain.tokens) << layout << ", prompt " << prompt_len << ", K " << k;
        EXPECT_EQ(spec.finish, plain.finish);
        EXPECT_GT(spec.speculation.steps, 0);
        EXPECT_EQ(spec.speculation.step_tokens + 1, int64_t(spec.tokens.size()));
      }
    }
  }
}

// max_tokens never exceeded, at every edge of a step of K + 1 tokens; stop tokens end the reply
// where plain decoding's do, a stop token inside an accepted run included (drafts forced right).
TEST(Speculative, StopsAndMaxTokensAsPlainDecoding) {
  TinyModel t = load_tiny();
  const std::span<const int32_t> prompt = std::span<const int32_t>(t.ids).first(5);
  const GenerateResult plain = run_generate(*t.backend, greedy_request(prompt, 20, 0));
  ForcedDraftBackend forced(*t.backend, /*offer=*/false);
  forced.truth.assign(prompt.begin(), prompt.end());
  forced.truth.insert(forced.truth.end(), plain.tokens.begin(), plain.tokens.end());
  forced.accepts = [](int64_t) { return 99; };  // every draft right
  for (int k : {1, 2, 3}) {
    for (int64_t max_new = 1; max_new <= 9; ++max_new) {
      for (Backend* b : {static_cast<Backend*>(t.backend.get()), static_cast<Backend*>(&forced)}) {
        const GenerateResult r = run_generate(*b, greedy_request(prompt, max_new, k));
        EXPECT_EQ(r.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + max_new))
            << "K " << k << ", max " << max_new;
        EXPECT_EQ(r.finish, FinishReason::length);
      }
    }
    for (size_t at : {size_t(0), size_t(1), size_t(2), size_t(5), size_t(9)}) {
      GenerateRequest stop = greedy_request(prompt, 20, k);
      stop.stop_tokens = {plain.tokens[at]};
      const size_t end = size_t(std::find(plain.tokens.begin(), plain.tokens.end(), plain.tokens[at]) -
                                plain.tokens.begin());
      for (Backend* b : {static_cast<Backend*>(t.backend.get()), static_cast<Backend*>(&forced)}) {
        const GenerateResult r = run_generate(*b, stop);
        EXPECT_EQ(r.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + ptrdiff_t(end) + 1))
            << "K " << k << ", stop at " << at;
        EXPECT_EQ(r.finish, FinishReason::stop);
      }
    }
  }
}

// The callback's refusal ends the reply at that token, mid-step too; nothing after it is delivered.
TEST(Speculative, CallbackRefusalEndsMidStep) {
  TinyModel t = load_tiny();
  const std::span<const int32_t> prompt = std::span<const int32_t>(t.ids).first(4);
  const GenerateResult plain = run_generate(*t.backend, greedy_request(prompt, 16, 0));
  ForcedDraftBackend forced(*t.backend, false);
  forced.truth.assign(prompt.begin(), prompt.end());
  forced.truth.insert(forced.truth.end(), plain.tokens.begin(), plain.tokens.end());
  forced.accepts = [](int64_t) { return 99; };
  for (size_t stop_after : {size_t(1), size_t(2), size_t(3), size_t(6)}) {
    auto state = forced.new_sequence(64);
    std::vector<int32_t> seen;
    const GenerateResult r = generate(forced, *state, greedy_request(prompt, 16, 3), [&](const GeneratedToken& g) {
      seen.push_back(g.id);
      return seen.size() < stop_after;
    });
    EXPECT_EQ(seen, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + ptrdiff_t(stop_after)));
    EXPECT_EQ(r.finish, FinishReason::cancelled);
    EXPECT_EQ(state->length(), int64_t(prompt.size() + stop_after) - 1) << "every token but the last";
  }
}

// The state a speculative generation leaves, against one built by teacher forcing: the prompt and
// every generated token but the last through the main model, and head rows 0 .. length - 1 =
// (h_i, x_{i+1}). The next main forward and the next head row must agree. Fails when the chained
// rows stay in the head's cache, or when its rows take the head's m instead of the main h.
void expect_teacher_forced(Backend& backend, SequenceState& spec, std::span<const int32_t> sequence) {
  const int64_t L = spec.length();
  ASSERT_EQ(spec.mtp_length(), L);
  ASSERT_EQ(int64_t(sequence.size()), L + 1);
  const int64_t H = backend.config().hidden_size;
  auto ref = backend.new_sequence(spec.capacity());
  std::vector<float> logits, hidden, head_logits, m;
  backend.forward_hidden(*ref, sequence.first(size_t(L)), LogitsWanted::none, logits, LogitsWanted::all, hidden);
  backend.forward_mtp(*ref, hidden, sequence.subspan(1), LogitsWanted::none, head_logits, m);

  const int32_t next = sequence[size_t(L)];
  std::vector<float> a_logits, a_hidden, b_logits, b_hidden;
  backend.forward_hidden(spec, std::span<const int32_t>(&next, 1), LogitsWanted::last, a_logits, LogitsWanted::last,
                         a_hidden);
  backend.forward_hidden(*ref, std::span<const int32_t>(&next, 1), LogitsWanted::last, b_logits, LogitsWanted::last,
                         b_hidden);
  for (size_t i = 0; i < a_logits.size(); ++i) ASSERT_NEAR(a_logits[i], b_logits[i], 1e-4) << "main logit " << i;
  const int32_t probe = 3;
  std::vector<float> a_head, a_m, b_head, b_m;
  backend.forward_mtp(spec, b_hidden, std::span<const int32_t>(&probe, 1), LogitsWanted::last, a_head, a_m);
  backend.forward_mtp(*ref, b_hidden, std::span<const int32_t>(&probe, 1), LogitsWanted::last, b_head, b_m);
  ASSERT_EQ(int64_t(b_m.size()), H);
  for (size_t i = 0; i < a_head.size(); ++i) ASSERT_NEAR(a_head[i], b_head[i], 1e-4) << "head logit " << i;
}

struct ForcedCase {
  int k;
  bool offer;
};

// Drafts forced right / wrong so that step s accepts s mod (K + 2) drafts (K + 1 and up: all):
// every accept length 0..K and the all-accepted path, each step's yield checked against the plan;
// with rewind offered (used) and refused (snapshot and replay); the tokens plain decoding's, the
// state teacher-forced.
TEST(Speculative, ForcedDraftsExerciseEveryAcceptLength) {
  TinyModel t = load_tiny();
  const std::span<const int32_t> prompt = std::span<const int32_t>(t.ids).first(6);
  const int64_t max_new = 40;
  const GenerateResult plain = run_generate(*t.backend, greedy_request(prompt, max_new, 0));
  for (ForcedCase c : {ForcedCase{1, true}, ForcedCase{1, false}, ForcedCase{2, true}, ForcedCase{2, false},
                       ForcedCase{3, true}, ForcedCase{3, false}}) {
    SCOPED_TRACE(testing::Message() << "K " << c.k << (c.offer ? ", rewind" : ", replay"));
    ForcedDraftBackend forced(*t.backend, c.offer);
    forced.truth.assign(prompt.begin(), prompt.end());
    forced.truth.insert(forced.truth.end(), plain.tokens.begin(), plain.tokens.end());
    const int k = c.k;
    forced.accepts = [k](int64_t s) { return int(s % (k + 2)); };
    auto state = forced.new_sequence(128);
    const GenerateResult r = generate(forced, *state, greedy_request(prompt, max_new, c.k),
                                      [](const GeneratedToken&) { return true; });
    EXPECT_EQ(r.tokens, plain.tokens);
    std::vector<int> seen(size_t(c.k) + 1, 0);
    for (size_t s = 0; s + 1 < forced.steps.size(); ++s) {
      const int64_t yielded = forced.steps[s + 1] - forced.steps[s];
      const int64_t left = max_new - (forced.steps[s] - int64_t(prompt.size()) + 1);
      const int64_t planned = std::min<int64_t>({int64_t(s % size_t(k + 2)), k, left - 1}) + 1;
      EXPECT_EQ(yielded, planned) << "step " << s;
      ++seen[size_t(yielded - 1)];
    }
    for (int a = 0; a <= c.k; ++a) EXPECT_GT(seen[size_t(a)], 0) << "no step accepted " << a;
    for (int p = 0; p < c.k; ++p) {
      EXPECT_GT(r.speculation.accepted[size_t(p)], 0) << "position " << p;
      EXPECT_LT(r.speculation.accepted[size_t(p)], r.speculation.drafted[size_t(p)]) << "position " << p;
    }
    auto& rs = dynamic_cast<test::RewindState&>(*state);
    if (c.offer) {
      EXPECT_GT(rs.rewinds, 0);
      EXPECT_EQ(r.speculation.replays, 0);
    } else {
      EXPECT_EQ(rs.rewinds, 0);
      EXPECT_GT(r.speculation.replays, 0);
    }
    std::vector<int32_t> sequence(prompt.begin(), prompt.end());
    sequence.insert(sequence.end(), r.tokens.begin(), r.tokens.end());
    expect_teacher_forced(*t.backend, rs.inner(), sequence);
  }
}

// Unforced drafts (the random head's own), over a prompt resumed from a cached prefix filled
// without the head: the same tokens; the head's gap filled, its cache teacher-forced after it.
TEST(Speculative, ResumesAStateFilledWithoutTheHead) {
  TinyModel t = load_tiny();
  const std::span<const int32_t> prompt = std::span<const int32_t>(t.ids).first(12);
  const GenerateResult plain = run_generate(*t.backend, greedy_request(prompt, 12, 0));
  auto state = t.backend->new_sequence(64);
  std::vector<float> none;
  t.backend->forward(*state, prompt.first(5), LogitsWanted::none, none);  // mtp_length 0
  const GenerateResult r = generate(*t.backend, *state, greedy_request(prompt, 12, 2),
                                    [](const GeneratedToken&) { return true; });
  EXPECT_EQ(r.tokens, plain.tokens);
  EXPECT_EQ(r.cached_tokens, 5);
  EXPECT_EQ(state->mtp_length(), state->length());

  // prefill_with_head leaves no gap: its rows are the teacher-forced ones.
  auto fed = t.backend->new_sequence(64);
  prefill_with_head(*t.backend, *fed, prompt, 7);
  expect_teacher_forced(*t.backend, *fed, prompt.first(8));
}

TEST(Speculative, RefusedWithoutTheHeadBeforeAnythingRuns) {
  auto weights = load_model(test::kTinyA + "/mlx-q4");  // mlx conversions drop mtp.*
  auto backend = make_cpu_backend(weights);
  auto state = backend->new_sequence(32);
  const std::vector<int32_t> prompt{1, 2, 3};
  const std::string why = error_of(
      [&] { generate(*backend, *state, greedy_request(prompt, 4, 2), [](const GeneratedToken&) { return true; }); });
  EXPECT_NE(why.find("--speculate 2: "), std::string::npos) << why;
  EXPECT_NE(why.find(backend->mtp_unavailable()), std::string::npos) << why;
  EXPECT_EQ(state->length(), 0);
  EXPECT_NE(error_of([&] { check_speculate(*backend, kMaxSpeculate + 1); }).find("--speculate"), std::string::npos);
  EXPECT_NE(error_of([&] { check_speculate(*backend, -1); }).find("--speculate -1"), std::string::npos);
}

}  // namespace
}  // namespace lily
