// BatchScheduler (runtime/batch_scheduler.h): a request arriving while three stream gets its first
// token in the round its prefill completes. Counted in batch steps (the backend's forward_batch
// calls), not wall time: between its submission and its first token the three get one step for
// each round of its prefill but the last (a long prompt holds them one chunk a round, a template
// boundary of its prompt costs no round), each of them a token a step; submitted from another
// thread, at most one more (the step in flight). Its tokens are generate()'s alone. Random-weight
// test model (tests/server/fixtures/tiny-chat), CPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "runtime/batch_scheduler.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace lily {
namespace {

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";
constexpr int64_t kChunk = 16;

Engine& engine() {
  static auto e = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  return *e;
}

// The engine's backend, counting the batch steps.
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
    inner_.forward_batch(states, tokens, logits);
    ++steps;
  }
  std::atomic<int64_t> steps{0};

 private:
  Backend& inner_;
};

GenerateRequest greedy_request(int prompt_length, int max_new_tokens, uint32_t seed) {
  GenerateRequest r;
  std::mt19937 rng(seed);
  for (int i = 0; i < prompt_length; ++i) r.prompt.push_back(int32_t(rng() % uint32_t(engine().config().vocab_size)));
  r.max_new_tokens = max_new_tokens;
  r.sampling.temperature = 0;
  return r;
}

// A request as a job of the scheduler: each token with the batch steps run before it; `on_token`
// (optional) called with the count of tokens so far, on the scheduler thread.
class Job final : public BatchJob {
 public:
  Job(CountingBackend& backend, GenerateRequest request, int64_t stop_at, std::function<void(size_t)> on_token = {})
      : backend_(backend), request_(std::move(request)), stop_at_(stop_at), on_token_(std::move(on_token)) {
    state_ = backend.new_sequence(512);
  }

  std::optional<uint64_t> start(BatchGenerator& batch) override {
    PrefillStop stop{stop_at_, [this] { stop_reached_ = state_->length(); }};
    return batch.add(
        request_, *state_,
        [this](const GeneratedToken& t) {
          tokens.push_back(t.id);
          steps_before.push_back(backend_.steps);
          if (on_token_) on_token_(tokens.size());
          return true;
        },
        std::move(stop));
  }
  void end(BatchOutcome outcome) override {
    std::lock_guard lock(mutex_);
    error = outcome.error;
    done_ = true;
    ended_.notify_all();
  }
  bool cancelled() const override { return false; }

  ::testing::AssertionResult wait() {
    std::unique_lock lock(mutex_);
    if (!ended_.wait_for(lock, std::chrono::seconds(120), [&] { return done_; }))
      return ::testing::AssertionFailure() << "the job never ended";
    return ::testing::AssertionSuccess();
  }

  const GenerateRequest& request() const { return request_; }
  std::vector<int32_t> tokens;        // on the scheduler thread until end()
  std::vector<int64_t> steps_before;  // batch steps run before each token
  int64_t stop_reached_ = -1;         // the state's length when the prefill stop was reached
  std::exception_ptr error;

 private:
  CountingBackend& backend_;
  GenerateRequest request_;
  int64_t stop_at_;
  std::function<void(size_t)> on_token_;
  std::unique_ptr<SequenceState> state_;
  std::mutex mutex_;
  std::condition_variable ended_;
  bool done_ = false;
};

// The request's tokens alone through generate().
std::vector<int32_t> alone(const GenerateRequest& r) {
  auto state = engine().backend().new_sequence(512);
  return generate(engine().backend(), *state, r, [](const GeneratedToken&) { return true; }).tokens;
}

// Every step in (from, to] gave this stream a token.
void expect_a_token_each_step(const Job& stream, int64_t from, int64_t to) {
  for (int64_t s = from + 1; s <= to; ++s)
    EXPECT_EQ(std::count(stream.steps_before.begin(), stream.steps_before.end(), s), 1) << "step " << s;
}

struct Late {
  int prompt_length;
  int64_t stop_at;  // its template boundary: the prefill cuts its forward there
};

// Three streams; once the first has 8 tokens, the late request is submitted from its callback
// (right after a step, on the scheduler thread): the steps between then and its first token.
void late_request_from_a_callback(const Late& late) {
  SCOPED_TRACE(testing::Message() << "a late prompt of " << late.prompt_length << " tokens, boundary at "
                                  << late.stop_at);
  CountingBackend counting(engine().backend());
  BatchScheduler scheduler(counting, {4, kChunk});
  auto late_job = std::make_shared<Job>(counting, greedy_request(late.prompt_length, 6, 77), late.stop_at);
  int64_t submitted_after = -1;  // steps run when it was submitted
  std::vector<std::shared_ptr<Job>> streams;
  for (int i = 0; i < 3; ++i)
    streams.push_back(std::make_shared<Job>(counting, greedy_request(5 + i, 60, 10 + uint32_t(i)), 0, [&, i](size_t n) {
      if (i != 0 || n != 8) return;
      submitted_after = counting.steps;
      scheduler.submit(late_job);
    }));
  for (auto& s : streams) scheduler.submit(s);
  ASSERT_TRUE(late_job->wait());
  for (auto& s : streams) ASSERT_TRUE(s->wait());
  ASSERT_FALSE(late_job->error);
  ASSERT_FALSE(late_job->tokens.empty());
  const int64_t rounds = (late.prompt_length + kChunk - 1) / kChunk;
  const int64_t waited = late_job->steps_before.front() - submitted_after;
  EXPECT_EQ(waited, rounds - 1) << "one step of the streams a round of its prefill, but not in the last";
  for (auto& s : streams) expect_a_token_each_step(*s, submitted_after, late_job->steps_before.front());
  if (late.stop_at > 0) {
    EXPECT_EQ(late_job->stop_reached_, late.stop_at) << "the boundary's snapshot point";
  }
  EXPECT_EQ(late_job->tokens, alone(late_job->request()));
}

TEST(BatchScheduler, LateRequestGetsItsFirstTokenInTheRoundItsPrefillEnds) {
  late_request_from_a_callback({10, 7});   // one chunk, cut at its boundary
  late_request_from_a_callback({40, 20});  // three chunks (16, 4 + 12, 8)
  late_request_from_a_callback({16, 0});   // exactly a chunk, no boundary
}

// The same submitted from another thread at any moment: at most the step in flight before its
// prefill. The count is read after the submission, so a preempted test thread only lowers it.
TEST(BatchScheduler, LateRequestFromAnotherThreadWaitsAtMostTheStepInFlight) {
  CountingBackend counting(engine().backend());
  BatchScheduler scheduler(counting, {4, kChunk});
  std::mutex mutex;
  std::condition_variable streaming;
  bool eight = false;
  std::vector<std::shared_ptr<Job>> streams;
  for (int i = 0; i < 3; ++i)
    streams.push_back(
        std::make_shared<Job>(counting, greedy_request(6 + i, 200, 20 + uint32_t(i)), 0, [&, i](size_t n) {
          if (i != 0 || n != 8) return;
          std::lock_guard lock(mutex);
          eight = true;
          streaming.notify_all();
        }));
  for (auto& s : streams) scheduler.submit(s);
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(streaming.wait_for(lock, std::chrono::seconds(120), [&] { return eight; }));
  }
  auto late_job = std::make_shared<Job>(counting, greedy_request(12, 6, 78), 9);
  scheduler.submit(late_job);
  const int64_t submitted_after = counting.steps;
  ASSERT_TRUE(late_job->wait());
  for (auto& s : streams) ASSERT_TRUE(s->wait());
  ASSERT_FALSE(late_job->tokens.empty());
  EXPECT_LE(late_job->steps_before.front() - submitted_after, 1);
  EXPECT_LT(late_job->steps_before.front(), streams[0]->steps_before.back()) << "it arrived while they streamed";
  EXPECT_EQ(late_job->tokens, alone(late_job->request()));
}

}  // namespace
}  // namespace lily
