// BatchGenerator (runtime/batch_generate.h): requests decoding in the same steps give exactly the
// tokens (the logprobs within rounding, and the finish reasons) of the same requests run one at
// a time by generate(), whatever the batch size, the line behind the slots, the prompts' lengths
// (chunked prefill, prompts partly cached) and the rounds they arrive in; the steps really are
// batches; a long prompt holds the running streams for one chunk a round at most; a cancelled
// request frees its slot at once; an exception ends its own request alone. Random-weight test
// model (tests/server/fixtures/tiny-chat), CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "candidate_backends.h"
#include "runtime/batch_generate.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace lily {
namespace {

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";

Engine& engine() {
  static auto e = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  return *e;
}

// The engine's backend, counting the batch steps and their rows.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return inner_.new_sequence(capacity); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    inner_.forward(state, tokens, wanted, logits);
  }
  void forward_batch(std::span<SequenceState* const> states, std::span<const int32_t> tokens,
                     std::vector<float>& logits) override {
    ++batch_steps;
    widest = std::max(widest, states.size());
    inner_.forward_batch(states, tokens, logits);
  }
  bool forward_candidates(SequenceState& state, int32_t token, int count, int32_t vocab_limit,
                          const AllowedTokens* allowed, std::vector<TokenLogit>& out) override {
    const bool offered = inner_.forward_candidates(state, token, count, vocab_limit, allowed, out);
    candidate_steps += offered;
    return offered;
  }
  int batch_steps = 0, candidate_steps = 0;
  size_t widest = 0;

 private:
  Backend& inner_;
};

struct Spec {
  int prompt_length;
  int cached;  // prompt tokens already in the state
  int max_new_tokens;
  int arrival;  // the round before which it is added
  SamplingParams sampling;
  int top_logprobs = -1;
  std::vector<int32_t> stop_tokens = {};
};

GenerateRequest request_of(const Spec& s, uint32_t seed) {
  GenerateRequest r;
  std::mt19937 rng(seed);
  const int32_t V = engine().config().vocab_size;
  for (int i = 0; i < s.prompt_length; ++i) r.prompt.push_back(int32_t(rng() % uint32_t(V)));
  r.max_new_tokens = s.max_new_tokens;
  r.sampling = s.sampling;
  r.sampling.seed = seed;
  r.top_logprobs = s.top_logprobs;
  r.stop_tokens = s.stop_tokens;
  return r;
}

// A fresh state holding the request's first `cached` prompt tokens.
std::unique_ptr<SequenceState> state_of(Backend& b, const GenerateRequest& r, int cached) {
  auto s = b.new_sequence(512);
  std::vector<float> logits;
  if (cached > 0) b.forward(*s, std::span<const int32_t>(r.prompt.data(), size_t(cached)), LogitsWanted::none, logits);
  return s;
}

struct Seen {
  std::vector<GeneratedToken> tokens;
  std::vector<int64_t> rounds;  // the round each token came in
};

void expect_same(const GenerateResult& got, const std::vector<GeneratedToken>& got_tokens, const GenerateResult& want,
                 const std::vector<GeneratedToken>& want_tokens) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.finish, want.finish);
  ASSERT_EQ(got_tokens.size(), want_tokens.size());
  for (size_t i = 0; i < got_tokens.size(); ++i) {
    EXPECT_EQ(got_tokens[i].id, want_tokens[i].id);
    ASSERT_EQ(got_tokens[i].logprob.has_value(), want_tokens[i].logprob.has_value());
    // Within rounding: the CPU backend's batch step reads each weight once for all its rows (the
    // prefill product) where a lone step runs the GEMV kernels, the same sums in another order
    // (~1e-4 on a logprob).
    if (got_tokens[i].logprob) {
      EXPECT_NEAR(got_tokens[i].logprob->logprob, want_tokens[i].logprob->logprob, 2e-3);
    }
    ASSERT_EQ(got_tokens[i].top.size(), want_tokens[i].top.size());
    for (size_t j = 0; j < got_tokens[i].top.size(); ++j)
      EXPECT_EQ(got_tokens[i].top[j].token, want_tokens[i].top[j].token);
  }
}

// Every spec through the batch generator (max_running slots, chunks of `chunk`), against each
// alone through generate(), both on `plain` (default: the engine's backend). Returns the steps
// a request decoding alone ran on the backend's candidates.
int check_against_alone(const std::vector<Spec>& specs, int max_running, int64_t chunk,
                        Backend& plain = engine().backend()) {
  SCOPED_TRACE(testing::Message() << specs.size() << " requests, " << max_running << " slots, chunks of " << chunk);
  CountingBackend counting(plain);
  BatchGenerator batch(counting, {max_running, chunk});
  std::vector<GenerateRequest> requests;
  std::vector<std::unique_ptr<SequenceState>> states;
  for (size_t i = 0; i < specs.size(); ++i) {
    requests.push_back(request_of(specs[i], 1000 + uint32_t(i)));
    states.push_back(state_of(plain, requests.back(), specs[i].cached));
  }
  std::vector<Seen> seen(specs.size());
  std::map<size_t, uint64_t> ids;
  int64_t round = 0;
  for (bool more = true; more || ids.size() < specs.size(); ++round) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].arrival == round)
        ids[i] = batch.add(requests[i], *states[i], [&, i](const GeneratedToken& t) {
          seen[i].tokens.push_back(t);
          seen[i].rounds.push_back(round);
          return true;
        });
    more = batch.step();
    EXPECT_LT(round, 10000) << "the batch never ends";
    if (round >= 10000) return counting.candidate_steps;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "request " << i);
    auto outcome = batch.take(ids[i]);
    EXPECT_TRUE(outcome.has_value());
    if (!outcome) continue;
    EXPECT_FALSE(outcome->error);
    auto alone_state = state_of(plain, requests[i], specs[i].cached);
    std::vector<GeneratedToken> alone_tokens;
    const GenerateResult alone = generate(plain, *alone_state, requests[i], [&](const GeneratedToken& t) {
      alone_tokens.push_back(t);
      return true;
    });
    expect_same(outcome->result, seen[i].tokens, alone, alone_tokens);
    EXPECT_EQ(outcome->result.cached_tokens, specs[i].cached);
    EXPECT_EQ(states[i]->length(), alone_state->length()) << "what the state holds afterwards";
  }
  if (max_running > 1 && specs.size() > 1) {
    EXPECT_GT(counting.widest, 1u) << "some steps must batch rows";
  }
  return counting.candidate_steps;
}

SamplingParams greedy() {
  SamplingParams s;
  s.temperature = 0;
  return s;
}

SamplingParams qwen() {
  SamplingParams s;
  s.temperature = 0.6f, s.top_k = 20, s.top_p = 0.95f;
  return s;
}

TEST(BatchGenerate, GreedyMatchesOneAtATime) {
  for (int N : {2, 4, 8}) {
    std::vector<Spec> specs;
    for (int i = 0; i < N; ++i) specs.push_back({1 + 37 * i % 130, 0, 12 + 3 * i, i % 3, greedy()});
    check_against_alone(specs, N, 16);
  }
}

TEST(BatchGenerate, SamplingLogprobsStopsAndTheLineMatchOneAtATime) {
  SamplingParams penalised = qwen();
  penalised.presence_penalty = 1.2f, penalised.repetition_penalty = 1.1f;
  SamplingParams wide;
  wide.temperature = 1.3f, wide.min_p = 0.05f;
  std::vector<Spec> specs = {
      {9, 0, 20, 0, qwen()},
      {64, 20, 16, 0, penalised},                              // partly cached
      {1, 0, 1, 1, greedy()},                                  // one token: no step
      {200, 0, 10, 2, wide, 3},                                // a long prompt, logprobs
      {33, 0, 0, 2, greedy()},                                 // no tokens at all
      {17, 16, 25, 5, qwen(), 0},                              // one prompt token left
      {40, 0, 30, 6, greedy(), -1, {0, 1, 2, 3, 4, 5, 6, 7}},  // stop tokens
  };
  check_against_alone(specs, 3, 16);  // more requests than slots: a line
  check_against_alone(specs, 8, 512);
  check_against_alone(specs, 1, 7);  // one slot: one at a time
}

// A request decoding alone steps as generate() does: on the backend's best few candidates where
// it offers them (the CUDA backend; here selected on the host from the row), no whole row handed
// over, with the same tokens and logprobs; two requests decoding together take batch steps.
TEST(BatchGenerate, ALoneStreamStepsOnCandidates) {
  test::WrappedBackend candidates(engine().backend(), test::WrappedBackend::Mode::candidates);
  std::vector<Spec> specs = {
      {9, 0, 30, 0, qwen()},      // alone, then beside the next two
      {40, 0, 12, 20, greedy()},  // arrives while the first decodes
      {5, 0, 20, 26, qwen(), 2},  // logprobs: its steps take the row, alone or not
      {70, 0, 25, 80, qwen()},    // alone again, after the others
  };
  EXPECT_GT(check_against_alone(specs, 4, 16, candidates), 10);
  EXPECT_EQ(check_against_alone(specs, 4, 16), 0) << "the CPU backend offers no candidates";
}

// A 300-token prompt arriving while three requests decode: in every round it prefills one chunk
// and each of the three still gets a token.
TEST(BatchGenerate, LongPromptHoldsTheStreamsOneChunkARound) {
  Backend& b = engine().backend();
  BatchGenerator batch(b, {4, 32});
  std::vector<GenerateRequest> requests;
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<Seen> seen(4);
  for (int i = 0; i < 4; ++i) {
    requests.push_back(request_of({i == 3 ? 300 : 5, 0, 40, 0, greedy()}, 50 + uint32_t(i)));
    states.push_back(state_of(b, requests.back(), 0));
  }
  int64_t round = 0;
  std::vector<uint64_t> ids;
  auto add = [&](int i) {
    ids.push_back(batch.add(requests[size_t(i)], *states[size_t(i)], [&, i](const GeneratedToken& t) {
      seen[size_t(i)].tokens.push_back(t);
      seen[size_t(i)].rounds.push_back(round);
      return true;
    }));
  };
  for (int i = 0; i < 3; ++i) add(i);
  for (; round < 3; ++round) batch.step();  // the three decoding
  add(3);
  const int64_t arrived = round;
  for (; batch.step(); ++round) {
  }
  const int64_t first = seen[3].rounds.front();
  EXPECT_EQ(first, arrived + (300 + 31) / 32 - 1) << "one chunk a round, the first token with the last chunk";
  for (int i = 0; i < 3; ++i)
    for (int64_t r = arrived; r <= first; ++r)
      EXPECT_EQ(std::count(seen[size_t(i)].rounds.begin(), seen[size_t(i)].rounds.end(), r), 1)
          << "request " << i << " in round " << r;
}

// A callback that says stop ends its request in that round: its slot goes to the next in line
// before the next round's step, and the others are unchanged.
TEST(BatchGenerate, CancelledRequestFreesItsSlot) {
  Backend& b = engine().backend();
  BatchGenerator batch(b, {2, 64});
  std::vector<GenerateRequest> requests;
  std::vector<std::unique_ptr<SequenceState>> states;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(request_of({6, 0, 30, 0, greedy()}, 70 + uint32_t(i)));
    states.push_back(state_of(b, requests.back(), 0));
  }
  int count = 0;
  const uint64_t a = batch.add(requests[0], *states[0], [&](const GeneratedToken&) { return ++count < 3; });
  const uint64_t bb = batch.add(requests[1], *states[1], [](const GeneratedToken&) { return true; });
  const uint64_t c = batch.add(requests[2], *states[2], [](const GeneratedToken&) { return true; });
  EXPECT_EQ(batch.waiting(), 3u);
  batch.step();
  EXPECT_EQ(batch.running(), 2u);
  EXPECT_EQ(batch.waiting(), 1u);
  while (count < 3) batch.step();
  EXPECT_EQ(batch.running(), 2u) << "the third took the cancelled one's slot";
  EXPECT_EQ(batch.waiting(), 0u);
  auto cancelled = batch.take(a);
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->result.finish, FinishReason::cancelled);
  EXPECT_EQ(cancelled->result.tokens.size(), 3u);
  while (batch.step()) {
  }
  for (uint64_t id : {bb, c}) {
    auto o = batch.take(id);
    ASSERT_TRUE(o.has_value());
    EXPECT_EQ(o->result.finish, FinishReason::length);
    EXPECT_EQ(o->result.tokens.size(), 30u);
  }
  EXPECT_FALSE(batch.take(a).has_value()) << "an outcome is taken once";
}

// A callback that throws ends its own request, the error kept; the others run to their ends with
// the tokens they have alone.
TEST(BatchGenerate, AnExceptionEndsItsRequestAlone) {
  Backend& b = engine().backend();
  BatchGenerator batch(b, {4, 64});
  std::vector<GenerateRequest> requests;
  std::vector<std::unique_ptr<SequenceState>> states;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(request_of({8 + i, 0, 15, 0, qwen()}, 90 + uint32_t(i)));
    states.push_back(state_of(b, requests.back(), 0));
  }
  std::vector<std::vector<int32_t>> got(3);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i)
    ids.push_back(batch.add(requests[size_t(i)], *states[size_t(i)], [&, i](const GeneratedToken& t) {
      if (i == 1 && got[1].size() == 4) throw std::runtime_error("the client's writer broke");
      got[size_t(i)].push_back(t.id);
      return true;
    }));
  while (batch.step()) {
  }
  auto failed = batch.take(ids[1]);
  ASSERT_TRUE(failed.has_value());
  ASSERT_TRUE(failed->error);
  EXPECT_THROW(std::rethrow_exception(failed->error), std::runtime_error);
  for (int i : {0, 2}) {
    auto o = batch.take(ids[size_t(i)]);
    ASSERT_TRUE(o.has_value());
    EXPECT_FALSE(o->error);
    auto alone_state = state_of(b, requests[size_t(i)], 0);
    const GenerateResult alone = generate(b, *alone_state, requests[size_t(i)],
                                          [](const GeneratedToken&) { return true; });
    EXPECT_EQ(o->result.tokens, alone.tokens) << "request " << i;
  }
}

// A request its state cannot take is refused when it is added, and joins nothing.
TEST(BatchGenerate, BadRequestsAreRefusedWhenAdded) {
  Backend& b = engine().backend();
  BatchGenerator batch(b, {2, 64});
  GenerateRequest r = request_of({10, 0, 600, 0, greedy()}, 5);  // 610 tokens in a state of 512
  auto s = state_of(b, r, 0);
  EXPECT_THROW(batch.add(r, *s, [](const GeneratedToken&) { return true; }), Error);
  GenerateRequest cached = request_of({10, 10, 5, 0, greedy()}, 6);  // nothing left to prefill
  auto full = state_of(b, cached, 10);
  EXPECT_THROW(batch.add(cached, *full, [](const GeneratedToken&) { return true; }), Error);
  EXPECT_EQ(batch.waiting(), 0u);
  EXPECT_FALSE(batch.step());
  EXPECT_THROW(BatchGenerator(b, {0, 64}), Error);
  EXPECT_THROW(BatchGenerator(b, {2, 0}), Error);
}

// A PrefillStop cuts the prefill there (the chat service's template boundary): `reached` runs
// once with the state holding exactly that many tokens, and the tokens are generate()'s.
TEST(BatchGenerate, PrefillStopsWhereAsked) {
  Backend& b = engine().backend();
  BatchGenerator batch(b, {2, 16});
  GenerateRequest r = request_of({60, 0, 8, 0, greedy()}, 11);
  auto state = state_of(b, r, 0);
  std::vector<int64_t> reached;
  const uint64_t id = batch.add(
      r, *state, [](const GeneratedToken&) { return true; },
      PrefillStop{23, [&] { reached.push_back(state->length()); }});
  while (batch.step()) {
  }
  EXPECT_EQ(reached, std::vector<int64_t>{23});
  auto o = batch.take(id);
  ASSERT_TRUE(o.has_value());
  auto alone_state = state_of(b, r, 0);
  EXPECT_EQ(o->result.tokens, generate(b, *alone_state, r, [](const GeneratedToken&) { return true; }).tokens);
}

// cancel(): a waiting request leaves the line, a prefilling one its slot, before the next step;
// both end cancelled, the third goes on.
TEST(BatchGenerate, CancelEndsWaitingAndPrefillingRequests) {
  Backend& b = engine().backend();
  BatchGenerator batch(b, {2, 8});
  std::vector<GenerateRequest> requests;
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(request_of({i == 0 ? 100 : 5, 0, 10, 0, greedy()}, 30 + uint32_t(i)));
    states.push_back(state_of(b, requests.back(), 0));
    ids.push_back(batch.add(requests.back(), *states.back(), [](const GeneratedToken&) { return true; }));
  }
  batch.step();  // 0 and 1 admitted; 0 has prefilled one chunk of its 100 tokens
  EXPECT_EQ(batch.waiting(), 1u);
  batch.cancel(ids[2]);
  EXPECT_EQ(batch.waiting(), 0u);
  batch.cancel(ids[0]);
  batch.step();
  EXPECT_EQ(batch.running(), 1u) << "the cancelled one left its slot";
  EXPECT_LT(states[0]->length(), 100) << "its prefill stopped";
  for (int i : {0, 2}) {
    auto o = batch.take(ids[size_t(i)]);
    ASSERT_TRUE(o.has_value()) << "request " << i;
    EXPECT_EQ(o->result.finish, FinishReason::cancelled);
    EXPECT_TRUE(o->result.tokens.empty());
  }
  while (batch.step()) {
  }
  auto o = batch.take(ids[1]);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->result.tokens.size(), 10u);
  batch.cancel(ids[1]);  // ended: nothing
  EXPECT_FALSE(batch.take(ids[1]).has_value());
}

}  // namespace
}  // namespace lily
