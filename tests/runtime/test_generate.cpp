// generate()'s decode loop with Backend::forward_candidates: a backend that hands over only the
// best few logits must give exactly the tokens of the whole-row path (same seed), and must be
// asked only when the sampler's draw depends on nothing else (no penalties, top-k or greedy,
// no logprobs). Runs on the random-weight test model (tests/server/fixtures/tiny-chat), CPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

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
