// generate()'s decode loop with Backend::forward_candidates: a backend that hands over only the
// best few logits must give exactly the tokens of the whole-row path (same seed), and must be
// asked only when the sampler's draw depends on nothing else (no penalties, top-k or greedy,
// no logprobs). The same for Backend::chain_tokens (steps chained where the logits are, the host
// a step behind), and what a chain leaves in the state: every delivered token, the last of a
// generation cut at max_tokens aside. Runs on the random-weight test model
// (tests/server/fixtures/tiny-chat), CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "candidate_backends.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace lily {
namespace {

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";

using test::WrappedBackend;
using Mode = WrappedBackend::Mode;

GenerateResult run(Backend& backend, const GenerateRequest& request) {
  auto state = backend.new_sequence(256);
  return generate(backend, *state, request, [](const GeneratedToken&) { return true; });
}

GenerateRequest request_with(SamplingParams sampling, int top_logprobs = -1) {
  GenerateRequest r;
  r.prompt = {1, 17, 42, 99, 5, 63, 64, 65, 7};
  r.max_new_tokens = 24;
  r.sampling = sampling;
  r.sampling.seed = 1234;
  r.top_logprobs = top_logprobs;
  return r;
}

struct Case {
  const char* name;
  SamplingParams sampling;
  int top_logprobs;
  int expected_count;  // the candidates asked for; 0: the whole-row path only
};

TEST(Generate, CandidatePathGivesTheWholeRowTokens) {
  auto engine = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  Backend& plain = engine->backend();
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams qwen;  // Qwen's thinking-mode recommendation
  qwen.temperature = 0.6f, qwen.top_k = 20, qwen.top_p = 0.95f;
  SamplingParams min_p;
  min_p.temperature = 1.3f, min_p.top_k = 7, min_p.min_p = 0.2f;
  SamplingParams hot;
  hot.temperature = 2.0f, hot.top_k = 50;
  SamplingParams penalised = qwen;
  penalised.presence_penalty = 1.5f;
  SamplingParams whole_row;  // no top-k: the whole distribution
  whole_row.temperature = 0.8f, whole_row.top_p = 0.9f;
  const Case cases[] = {
      {"greedy", greedy, -1, 1},       {"qwen", qwen, -1, 20},         {"min_p", min_p, -1, 7},  {"hot", hot, -1, 50},
      {"penalties", penalised, -1, 0}, {"no top-k", whole_row, -1, 0}, {"logprobs", qwen, 3, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const GenerateRequest request = request_with(c.sampling, c.top_logprobs);
    const GenerateResult want = run(plain, request);
    WrappedBackend wrapped(plain, Mode::candidates);
    const GenerateResult got = run(wrapped, request);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.finish, want.finish);
    if (c.expected_count > 0) {
      EXPECT_EQ(wrapped.calls, int(want.tokens.size()) - 1) << "every decode step after the first";
      EXPECT_EQ(wrapped.last_count, c.expected_count);
      EXPECT_EQ(wrapped.masked_calls, 0) << "no grammar, no mask";
    } else {
      EXPECT_EQ(wrapped.calls, 0);
    }
  }
}

// A backend's own forward_candidates (the GPU's top_candidates under LILY_TEST_BACKEND=cuda)
// against the same backend with it switched off (the whole-row path): the same tokens, greedy and
// sampled.
TEST(Generate, BackendCandidatesMatchTheWholeRow) {
  const char* backend = std::getenv("LILY_TEST_BACKEND");
  auto engine = Engine::load(EngineOptions{kModelDir, backend ? backend : "cpu", 0});
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams qwen;
  qwen.temperature = 0.6f, qwen.top_k = 20, qwen.top_p = 0.95f;
  SamplingParams wide;
  wide.temperature = 1.5f, wide.top_k = 256, wide.min_p = 0.01f;
  for (const SamplingParams& sampling : {greedy, qwen, wide}) {
    const GenerateRequest request = request_with(sampling);
    WrappedBackend whole_row(engine->backend(), Mode::whole_row);
    EXPECT_EQ(run(engine->backend(), request).tokens, run(whole_row, request).tokens)
        << "temperature " << sampling.temperature << " top_k " << sampling.top_k;
  }
}

SamplingParams sampling_case(const std::string& name) {
  SamplingParams s;
  if (name == "greedy") s.temperature = 0;
  if (name == "qwen") s.temperature = 0.6f, s.top_k = 20, s.top_p = 0.95f;
  if (name == "min_p") s.temperature = 1.3f, s.top_k = 7, s.min_p = 0.2f;
  if (name == "hot") s.temperature = 2.0f, s.top_k = 50;
  if (name == "top_k 1") s.temperature = 0.7f, s.top_k = 1;
  // Qwen's recommended general setting, with the presence penalty.
  if (name == "qwen presence") s.temperature = 1.0f, s.top_k = 20, s.top_p = 0.95f, s.presence_penalty = 1.5f;
  if (name == "greedy repetition") s.temperature = 0, s.repetition_penalty = 1.3f, s.frequency_penalty = 0.5f;
  if (name == "hot, negative presence") s.temperature = 2.0f, s.top_k = 50, s.presence_penalty = -1.0f;
  if (name == "greedy, presence -5") s.temperature = 0, s.presence_penalty = -5.0f;
  return s;
}

// A chain (here HostChain, the GPU's contract on the host) gives the stepwise path's tokens: the
// same candidates after the same penalties, the same draws in the same order of the seed's
// stream.
TEST(Generate, ChainedStepsGiveTheStepwiseTokens) {
  auto engine = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  const std::pair<const char*, int> cases[] = {
      {"greedy", 1},
      {"qwen", 20},
      {"min_p", 7},
      {"hot", 50},
      {"top_k 1", 1},
      {"qwen presence", 20},
      {"greedy repetition", 1},
      {"hot, negative presence", 50},
      {"greedy, presence -5", 1},
  };
  for (const auto& [name, count] : cases) {
    SCOPED_TRACE(name);
    GenerateRequest request = request_with(sampling_case(name));
    request.vocab_limit = 300;  // below the model's vocabulary: never chosen past it
    WrappedBackend stepwise(engine->backend(), Mode::candidates);
    const GenerateResult want = run(stepwise, request);
    WrappedBackend chained(engine->backend(), Mode::chained);
    const GenerateResult got = run(chained, request);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.finish, want.finish);
    EXPECT_EQ(chained.chains, 1);
    EXPECT_EQ(chained.calls, 0) << "no stepwise candidates once chained";
    EXPECT_EQ(chained.last_choice.count, count);
    EXPECT_EQ(chained.last_choice.vocab_limit, 300);
    const bool penalised = request.sampling.penalties().any();
    EXPECT_EQ(chained.last_choice.history, penalised ? std::vector<int32_t>{got.tokens[0]} : std::vector<int32_t>{});
    for (int32_t t : got.tokens) EXPECT_LT(t, 300);
  }
}

// The penalties change the chained tokens (the comparison above is not vacuous for them).
TEST(Generate, ChainedPenaltiesChangeTheTokens) {
  auto engine = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  SamplingParams plain = sampling_case("greedy");
  SamplingParams repeating = plain;  // a negative presence penalty: the generated tokens come back
  repeating.presence_penalty = -5.0f;
  WrappedBackend a(engine->backend(), Mode::chained), b(engine->backend(), Mode::chained);
  const GenerateResult free = run(a, request_with(plain)), penalised = run(b, request_with(repeating));
  EXPECT_EQ(b.chains, 1);
  EXPECT_NE(free.tokens, penalised.tokens);
}

// What a chain cannot choose stays stepwise: the whole row (no top-k, with or without
// penalties), more logprobs than a chain gives.
TEST(Generate, ChainsOnlyWhatTheBestFewLogitsDecide) {
  auto engine = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  SamplingParams whole_row;
  whole_row.temperature = 0.8f, whole_row.top_p = 0.9f;
  SamplingParams penalised_row = whole_row;
  penalised_row.presence_penalty = 1.5f;
  for (const auto& [request, name] :
       {std::pair{request_with(penalised_row), "penalties, no top-k"}, std::pair{request_with(whole_row), "no top-k"},
        std::pair{request_with(sampling_case("qwen"), 21), "21 logprobs"}}) {
    SCOPED_TRACE(name);
    WrappedBackend chained(engine->backend(), Mode::chained);
    const GenerateResult got = run(chained, request);
    EXPECT_EQ(chained.chains, 0);
    EXPECT_EQ(got.tokens, run(engine->backend(), request).tokens);
  }
}

// A chain's logprobs (asked for with the tokens) are the whole row's: the raw distribution's,
// before penalties, for the chosen token and the most likely ones.
TEST(Generate, ChainedLogprobsAreTheWholeRows) {
  auto engine = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  for (const char* name : {"greedy", "qwen", "qwen presence"}) {
    for (int top : {0, 3, 20}) {
      SCOPED_TRACE(testing::Message() << name << ", top_logprobs " << top);
      const GenerateRequest request = request_with(sampling_case(name), top);
      std::vector<GeneratedToken> want, got;
      auto state = engine->backend().new_sequence(256);
      generate(engine->backend(), *state, request, [&](const GeneratedToken& t) {
        want.push_back(t);
        return true;
      });
      WrappedBackend chained(engine->backend(), Mode::chained);
      auto chained_state = chained.new_sequence(256);
      generate(chained, *chained_state, request, [&](const GeneratedToken& t) {
        got.push_back(t);
        return true;
      });
      EXPECT_EQ(chained.chains, 1);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        SCOPED_TRACE(testing::Message() << "token " << i);
        EXPECT_EQ(got[i].id, want[i].id);
        ASSERT_TRUE(got[i].logprob && want[i].logprob);
        EXPECT_EQ(got[i].logprob->token, got[i].id);
        EXPECT_EQ(got[i].logprob->logprob, want[i].logprob->logprob);
        ASSERT_EQ(got[i].top.size(), size_t(top));
        ASSERT_EQ(want[i].top.size(), size_t(top));
        for (int j = 0; j < top; ++j) {
          EXPECT_EQ(got[i].top[size_t(j)].token, want[i].top[size_t(j)].token);
          EXPECT_EQ(got[i].top[size_t(j)].logprob, want[i].top[size_t(j)].logprob);
        }
      }
    }
  }
}

// The logits after `prompt` (one pass) then `tokens` (a step each) on a fresh sequence: what a
// state holding exactly them gives (generate() computes them the same way).
std::vector<float> logits_after(Backend& backend, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& tokens) {
  auto state = backend.new_sequence(256);
  std::vector<float> logits;
  backend.forward(*state, prompt, LogitsWanted::last, logits);
  for (int32_t t : tokens) backend.forward(*state, std::span<const int32_t>(&t, 1), LogitsWanted::last, logits);
  return logits;
}

// After a chained generation the state holds the prompt and every delivered token (a stop token,
// a token the caller refused), the last of a generation cut at max_tokens aside; the state's next
// logits are those of a sequence fed exactly that.
TEST(Generate, ChainedStateHoldsEveryDeliveredToken) {
  auto engine = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  Backend& plain = engine->backend();
  const GenerateRequest base = request_with(sampling_case("qwen"));
  const GenerateResult free_run = run(plain, base);
  ASSERT_EQ(free_run.tokens.size(), size_t(base.max_new_tokens));

  struct Ending {
    const char* name;
    std::vector<int32_t> stop_tokens;
    int refuse_at;  // on_token returns false at this token (-1: never)
    size_t delivered;
    FinishReason finish;
    size_t fed;  // generated tokens the state holds afterwards
  };
  const size_t M = size_t(base.max_new_tokens);
  size_t first_new = 3;  // a token not generated before it: the stop token of one ending
  while (first_new < M && std::count(free_run.tokens.begin(), free_run.tokens.begin() + ptrdiff_t(first_new),
                                     free_run.tokens[first_new]) > 0)
    ++first_new;
  ASSERT_LT(first_new, M - 1);
  const Ending endings[] = {
      {"max_tokens", {}, -1, M, FinishReason::length, M - 1},
      {"stop token", {free_run.tokens[first_new]}, -1, first_new + 1, FinishReason::stop, first_new + 1},
      {"refused", {}, 4, 5, FinishReason::cancelled, 5},
      {"refused first", {}, 0, 1, FinishReason::cancelled, 0},
  };
  for (const Ending& e : endings) {
    SCOPED_TRACE(e.name);
    GenerateRequest request = base;
    request.stop_tokens = e.stop_tokens;
    WrappedBackend chained(plain, Mode::chained);
    auto state = chained.new_sequence(256);
    int seen = 0;
    const GenerateResult got = generate(chained, *state, request,
                                        [&](const GeneratedToken&) { return seen++ != e.refuse_at; });
    ASSERT_EQ(got.tokens.size(), e.delivered);
    EXPECT_EQ(got.finish, e.finish);
    EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), free_run.tokens.begin()));
    ASSERT_EQ(state->length(), int64_t(base.prompt.size() + e.fed));
    std::vector<int32_t> fed(got.tokens.begin(), got.tokens.begin() + ptrdiff_t(e.fed));
    const int32_t probe = 11;
    fed.push_back(probe);
    std::vector<float> after;
    plain.forward(*state, std::span<const int32_t>(&probe, 1), LogitsWanted::last, after);
    EXPECT_EQ(after, logits_after(plain, base.prompt, fed));
  }
}

// Sampling draws differ between seeds: the comparison above is not vacuous.
TEST(Generate, SeedsChangeSampledTokens) {
  auto engine = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  SamplingParams hot;
  hot.temperature = 2.0f, hot.top_k = 50;
  GenerateRequest a = request_with(hot), b = request_with(hot);
  b.sampling.seed = 99;
  WrappedBackend wrapped(engine->backend(), Mode::candidates);
  EXPECT_NE(run(wrapped, a).tokens, run(wrapped, b).tokens);
}

}  // namespace
}  // namespace lily
