// Speculating requests in the batch generator (runtime/batch_generate.h with GenerateRequest::
// speculate > 0, `lily serve --speculate K` at --parallel > 1): each gives the tokens (and finish
// reason) of the same request run alone by plain generate() under greedy decoding, and of
// speculative_generate() under sampling (the same draws), beside plain requests that still share
// the batch steps; prompts split over rounds (the head fed piece by piece, prefill_with_head) and
// partly cached; the state afterwards as plain decoding leaves it, with the head's cache beside it
// (mtp_length = length); a PrefillStop reached with the head fed to it; a cancelled speculating
// request ends at once; a backend without the head is refused when the request is added. CPU,
// tiny-a (its random head: every step cuts) and lily-tiny (its trained head: drafts kept).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint/load.h"
#include "runtime/batch_generate.h"
#include "runtime/generate.h"
#include "runtime/speculative.h"
#include "test_speculative_backend.h"

namespace lily {
namespace {

using test::load_tiny;

const std::string kLilyTiny = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";

std::vector<int32_t> tiny_a_ids() {
  return test::read_json(test::kTinyA + "/reference.json")["ids"].get<std::vector<int32_t>>();
}

struct Job {
  int prompt_length;
  int cached;  // prompt tokens already in the state
  int max_new_tokens;
  int arrival;    // the round before which it is added
  int speculate;  // 0: a plain request
  float temperature = 0;
  std::vector<int32_t> stop_tokens = {};
};

GenerateRequest request_of(const Job& j, const std::vector<int32_t>& ids, uint32_t seed) {
  GenerateRequest r;
  for (int i = 0; i < j.prompt_length; ++i) r.prompt.push_back(ids[size_t(i * 7 + int(seed)) % ids.size()]);
  r.max_new_tokens = j.max_new_tokens;
  r.sampling.temperature = j.temperature;
  if (j.temperature > 0) r.sampling.top_k = 20;
  r.sampling.seed = seed;
  r.stop_tokens = j.stop_tokens;
  r.speculate = j.speculate;
  return r;
}

std::unique_ptr<SequenceState> state_of(Backend& b, const GenerateRequest& r, int cached) {
  auto s = b.new_sequence(256);
  if (cached > 0) prefill_with_head(b, *s, r.prompt, cached);  // as the session cache leaves it
  return s;
}

// The jobs through one batch generator (max_running slots, prefill chunks of `chunk`), each
// against itself run alone: plain generate() for greedy and plain jobs, speculative_generate() for
// sampled speculating ones.
void check_jobs(Backend& backend, const std::vector<int32_t>& ids, const std::vector<Job>& jobs, int max_running,
                int64_t chunk, bool expect_kept_drafts) {
  SCOPED_TRACE(testing::Message() << jobs.size() << " jobs, " << max_running << " slots, chunks of " << chunk);
  BatchGenerator batch(backend, {max_running, chunk});
  std::vector<GenerateRequest> requests;
  std::vector<std::unique_ptr<SequenceState>> states;
  for (size_t i = 0; i < jobs.size(); ++i) {
    requests.push_back(request_of(jobs[i], ids, 3 + uint32_t(i)));
    states.push_back(state_of(backend, requests.back(), jobs[i].cached));
  }
  std::vector<std::vector<int32_t>> seen(jobs.size());
  std::map<size_t, uint64_t> handles;
  for (int64_t round = 0; handles.size() < jobs.size() || batch.running() + batch.waiting() > 0; ++round) {
    for (size_t i = 0; i < jobs.size(); ++i)
      if (jobs[i].arrival == round)
        handles[i] = batch.add(requests[i], *states[i], [&, i](const GeneratedToken& t) {
          seen[i].push_back(t.id);
          return true;
        });
    batch.step();
    ASSERT_LT(round, 5000) << "the batch never ends";
  }
  int64_t kept = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "job " << i << " (speculate " << jobs[i].speculate << ")");
    auto outcome = batch.take(handles[i]);
    ASSERT_TRUE(outcome.has_value());
    EXPECT_FALSE(outcome->error);
    const GenerateResult& got = outcome->result;
    GenerateRequest alone_request = requests[i];
    if (jobs[i].temperature == 0) alone_request.speculate = 0;  // greedy: plain decoding's tokens
    auto alone_state = state_of(backend, alone_request, jobs[i].cached);
    const GenerateResult want = generate(backend, *alone_state, alone_request,
                                         [](const GeneratedToken&) { return true; });
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(seen[i], got.tokens) << "the tokens handed over";
    EXPECT_EQ(got.finish, want.finish);
    EXPECT_EQ(got.prompt_tokens, jobs[i].prompt_length);
    EXPECT_EQ(got.cached_tokens, jobs[i].cached);
    EXPECT_EQ(states[i]->length(), alone_state->length()) << "what the state holds afterwards";
    if (jobs[i].speculate > 0) {
      EXPECT_GT(got.speculation.steps, 0);
      EXPECT_EQ(got.speculation.step_tokens + 1, int64_t(got.tokens.size()));
      EXPECT_EQ(states[i]->mtp_length(), states[i]->length()) << "the head's teacher-forced rows beside the state";
      for (int64_t a : got.speculation.accepted) kept += a;
    } else {
      EXPECT_EQ(got.speculation.steps, 0);
    }
  }
  if (expect_kept_drafts) {
    EXPECT_GT(kept, 0) << "a trained head's drafts are kept";
  }
}

TEST(SpeculativeBatch, GreedyJobsGivePlainTokensOnTinyA) {
  test::TinyModel t = load_tiny();
  const std::vector<Job> jobs = {
      {7, 0, 14, 0, 1},
      {20, 0, 12, 0, 3},
      {5, 0, 10, 0, 0},  // speculating and plain, together
      {33, 9, 16, 1, 2},
      {1, 0, 9, 2, 2},
      {12, 4, 11, 3, 0},                         // later, partly cached, a 1-token prompt
      {9, 0, 20, 0, 2, 0, {int32_t(t.ids[3])}},  // a stop token
  };
  check_jobs(*t.backend, t.ids, jobs, 4, 8, false);
  check_jobs(*t.backend, t.ids, jobs, 1, 512, false);  // one slot: each alone, in turn
}

TEST(SpeculativeBatch, TrainedHeadKeepsDraftsBesideABatch) {
  auto weights = load_model(kLilyTiny);
  ASSERT_TRUE(weights->mtp);
  auto backend = make_cpu_backend(weights);
  const std::vector<int32_t> ids = tiny_a_ids();  // any ids below lily-tiny's vocabulary
  const std::vector<Job> jobs = {{10, 0, 24, 0, 2}, {6, 0, 24, 0, 0}, {15, 0, 20, 0, 3}, {4, 0, 16, 1, 1}};
  check_jobs(*backend, ids, jobs, 3, 6, true);
}

// Under sampling a speculating job's draws are its own decoder's: the same tokens as
// speculative_generate() alone with the same seed, beside other jobs.
TEST(SpeculativeBatch, SampledJobsMatchSpeculativeGenerateAlone) {
  test::TinyModel t = load_tiny();
  const std::vector<Job> jobs = {{8, 0, 16, 0, 2, 0.8f}, {5, 0, 12, 0, 0, 0.8f}, {11, 3, 14, 0, 1, 1.0f}};
  check_jobs(*t.backend, t.ids, jobs, 3, 4, false);
}

// A PrefillStop on a speculating request: reached with the state there and the head fed to it.
TEST(SpeculativeBatch, PrefillStopIsReachedWithTheHeadFed) {
  test::TinyModel t = load_tiny();
  BatchGenerator batch(*t.backend, {2, 5});
  GenerateRequest r = request_of({30, 0, 6, 0, 2}, t.ids, 1);
  auto state = state_of(*t.backend, r, 0);
  std::vector<std::pair<int64_t, int64_t>> reached;
  const uint64_t id = batch.add(
      r, *state, [](const GeneratedToken&) { return true; },
      PrefillStop{17, [&] { reached.emplace_back(state->length(), state->mtp_length()); }});
  while (batch.step()) {
  }
  ASSERT_EQ(reached.size(), 1u);
  EXPECT_EQ(reached[0], std::make_pair(int64_t(17), int64_t(17)));
  auto o = batch.take(id);
  ASSERT_TRUE(o.has_value());
  GenerateRequest plain = r;
  plain.speculate = 0;
  auto alone = t.backend->new_sequence(256);
  EXPECT_EQ(o->result.tokens, generate(*t.backend, *alone, plain, [](const GeneratedToken&) { return true; }).tokens);
}

// cancel() ends a speculating request before the next round; the plain one beside it goes on.
TEST(SpeculativeBatch, CancelEndsASpeculatingRequest) {
  test::TinyModel t = load_tiny();
  BatchGenerator batch(*t.backend, {2, 64});
  GenerateRequest spec = request_of({6, 0, 40, 0, 2}, t.ids, 1), plain = request_of({6, 0, 10, 0, 0}, t.ids, 2);
  auto s1 = state_of(*t.backend, spec, 0), s2 = state_of(*t.backend, plain, 0);
  int spec_tokens = 0;
  const uint64_t a = batch.add(spec, *s1, [&](const GeneratedToken&) { return ++spec_tokens, true; });
  const uint64_t b = batch.add(plain, *s2, [](const GeneratedToken&) { return true; });
  batch.step();
  batch.step();
  const int before = spec_tokens;
  EXPECT_GT(before, 0);
  batch.cancel(a);
  while (batch.step()) {
  }
  EXPECT_EQ(spec_tokens, before) << "no token after the cancel";
  auto oa = batch.take(a), ob = batch.take(b);
  ASSERT_TRUE(oa && ob);
  EXPECT_EQ(oa->result.finish, FinishReason::cancelled);
  EXPECT_EQ(int(oa->result.tokens.size()), before);
  EXPECT_EQ(ob->result.tokens.size(), 10u);
}

// A backend without the head: a speculating request is refused when added, and joins nothing.
TEST(SpeculativeBatch, ABackendWithoutTheHeadIsRefused) {
  auto no_head = load_model(test::kTinyA + "/mlx-q4");
  ASSERT_FALSE(no_head->mtp);
  auto backend = make_cpu_backend(no_head);
  BatchGenerator batch(*backend, {2, 64});
  GenerateRequest r = request_of({6, 0, 8, 0, 2}, tiny_a_ids(), 1);
  auto state = backend->new_sequence(64);
  EXPECT_THROW(batch.add(r, *state, [](const GeneratedToken&) { return true; }), Error);
  EXPECT_EQ(batch.waiting(), 0u);
  EXPECT_FALSE(batch.step());
}

}  // namespace
}  // namespace lily
