// generate()'s decode loop with Backend::forward_candidates: a backend that hands over only the
// best few logits must give exactly the tokens of the whole-row path (same seed), and must be
// asked only when the sampler's draw depends on nothing else (no penalties, top-k or greedy,
// no logprobs). Runs on the random-weight test model (tests/server/fixtures/tiny-chat), CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "runtime/engine.h"
#include "runtime/generate.h"

namespace lily {
namespace {

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";

// Passes everything to a wrapped backend except forward_candidates, which stays the base's
// "not offered": the whole-row path of the same backend.
class WholeRowBackend : public Backend {
 public:
  explicit WholeRowBackend(Backend& inner, std::string label = "whole-row") : inner_(inner), label_(std::move(label)) {}
  std::string name() const override { return label_ + "(" + inner_.name() + ")"; }
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return inner_.new_sequence(capacity); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    inner_.forward(state, tokens, wanted, logits);
  }

 protected:
  Backend& inner_;

 private:
  std::string label_;
};

// Wraps a backend; forward_candidates runs the wrapped forward() and selects on the host (what
// a GPU backend does on the device): descending logits, ties to the lower id, NaN excluded.
class CandidateBackend final : public WholeRowBackend {
 public:
  explicit CandidateBackend(Backend& inner) : WholeRowBackend(inner, "candidates") {}
  bool forward_candidates(SequenceState& state, int32_t token, int count, int32_t vocab_limit,
                          std::vector<TokenLogit>& out) override {
    ++calls;
    last_count = count;
    std::vector<float> logits;
    inner_.forward(state, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits);
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < vocab_limit; ++i)
      if (!std::isnan(logits[size_t(i)])) ids.push_back(i);
    const size_t k = std::min(size_t(count), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    });
    out.clear();
    for (size_t i = 0; i < k; ++i) out.push_back({ids[i], logits[size_t(ids[i])]});
    return true;
  }
  int calls = 0, last_count = 0;
};

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
    CandidateBackend wrapped(plain);
    const GenerateResult got = run(wrapped, request);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.finish, want.finish);
    if (c.expected_count > 0) {
      EXPECT_EQ(wrapped.calls, int(want.tokens.size()) - 1) << "every decode step after the first";
      EXPECT_EQ(wrapped.last_count, c.expected_count);
    } else {
      EXPECT_EQ(wrapped.calls, 0);
    }
  }
}

// A backend's own forward_candidates (the GPU's top_candidates under LILY_TEST_BACKEND=cuda)
// against the same backend with it switched off (WholeRowBackend): the same tokens, greedy and
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
    WholeRowBackend whole_row(engine->backend());
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
  CandidateBackend wrapped(engine->backend());
  EXPECT_NE(run(wrapped, a).tokens, run(wrapped, b).tokens);
}

}  // namespace
}  // namespace lily
