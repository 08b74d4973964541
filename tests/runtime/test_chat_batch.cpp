// Parallel completions (ChatServiceOptions::parallel > 1, runtime/chat_batch.cpp): conversations
// on several threads at once, arriving at different times with prompts of different lengths,
// get token for token (and text, logprobs, finish reason, session-cache reuse) what the same
// conversations get one at a time on a serial service; their deltas are their own; a caller
// that stops frees its slot; a request that fails (its prefill throwing, its caller's on_delta
// throwing) fails alone; the slots' memory is refused up front when the host cannot hold it.
// Greedy, sampled, logprobs, stop strings and a JSON-schema grammar among the conversations.
// Random-weight test model (tests/server/fixtures/tiny-chat), CPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "runtime/chat_service.h"

namespace lily {
namespace {

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";

Engine& engine() {
  static auto e = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  return *e;
}

// The engine's backend; a prefill of a prompt that holds `poison` throws (a failure of that
// request's own).
class PoisonedBackend final : public Backend {
 public:
  explicit PoisonedBackend(Backend& inner, int32_t poison) : inner_(inner), poison_(poison) {}
  std::string name() const override { return inner_.name(); }
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return inner_.new_sequence(capacity); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    if (std::find(tokens.begin(), tokens.end(), poison_) != tokens.end())
      throw Error("the poisoned token reached the backend");
    inner_.forward(state, tokens, wanted, logits);
  }
  void forward_batch(std::span<SequenceState* const> states, std::span<const int32_t> tokens,
                     std::vector<float>& logits) override {
    if (states.size() > widest) widest = states.size();
    inner_.forward_batch(states, tokens, logits);
  }
  std::atomic<size_t> widest = 0;

 private:
  Backend& inner_;
  int32_t poison_;
};

std::unique_ptr<ChatService> service(int parallel, Backend* backend = nullptr, int64_t chunk = 512) {
  ChatServiceOptions o;
  o.context_size = 1024;
  o.cache_bytes = uint64_t(1) << 30;
  o.backend = backend;
  o.parallel = parallel;
  o.prefill_chunk = chunk;
  return std::make_unique<ChatService>(engine(), Tokenizer::load_from_model_dir(kModelDir), o);
}

// Conversation i: a first message of its own length, a second turn that resumes the first.
ChatRequest turn_of(int i, const json& messages) {
  ChatRequest r;
  r.messages = messages;
  r.options.sampling.temperature = 0;
  r.options.max_tokens = 10 + 3 * (i % 5);
  if (i % 3 == 1) r.options.top_logprobs = 2;
  if (i % 4 == 3) r.options.sampling = SamplingParams{0.8f, 20, 0.95f, 0.0f, 1.2f, 0.0f, 1.0f, uint64_t(7 + i)};
  if (i % 5 == 2) r.options.stop = {"e", "a"};
  if (i % 6 == 5) {  // a grammar: the reply held to a JSON schema
    r.response_format.type = ResponseFormat::Type::json_schema;
    r.response_format.schema = json::parse(R"({"type": "object", "properties": {"n": {"type": "integer"}}})");
  }
  return r;
}

json first_message(int i) {
  std::string text = "Conversation " + std::to_string(i) + ":";
  for (int w = 0; w < 3 + 11 * i % 40; ++w) text += " word" + std::to_string(w * 7 % 13);
  return json::array({json{{"role", "user"}, {"content", text}}});
}

struct Turn {
  CompletionResult result;
  ChatDelta streamed;  // the deltas, concatenated
};

// Two turns of conversation i on `s`.
std::vector<Turn> converse(ChatService& s, int i) {
  std::vector<Turn> turns;
  json messages = first_message(i);
  for (int t = 0; t < 2; ++t) {
    Turn turn;
    turn.result = s.complete_chat(turn_of(i, messages), [&](const ChatDelta& d) {
      turn.streamed.content += d.content;
      turn.streamed.reasoning += d.reasoning;
      return true;
    });
    messages.push_back(json{{"role", "assistant"}, {"content", turn.result.content}});
    messages.push_back(json{{"role", "user"}, {"content", "And then? " + std::to_string(t)}});
    turns.push_back(std::move(turn));
  }
  return turns;
}

// The tokens must agree exactly; the logprobs within a tolerance. The CPU fast path's batch step
// reads each weight once for all its rows (a GEMM where a lone step runs the GEMV kernels), and its
// prefill is not the same to the bit when a prompt is cut into other pieces (a piece of one token
// runs the decode kernels): the same sums in another order, ~1e-4 on a logprob.
constexpr float kBatchLogprobTolerance = 2e-3f;

void expect_same(const CompletionResult& got, const CompletionResult& want) {
  const float logprob_tolerance = kBatchLogprobTolerance;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.content, want.content);
  EXPECT_EQ(got.reasoning, want.reasoning);
  EXPECT_EQ(got.finish_reason, want.finish_reason);
  EXPECT_EQ(got.stop_sequence, want.stop_sequence);
  EXPECT_EQ(got.cancelled, want.cancelled);
  EXPECT_EQ(got.usage.prompt_tokens, want.usage.prompt_tokens);
  EXPECT_EQ(got.usage.cached_tokens, want.usage.cached_tokens);
  EXPECT_EQ(got.usage.completion_tokens, want.usage.completion_tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t k = 0; k < got.logprobs.size(); ++k) {
    EXPECT_EQ(got.logprobs[k].chosen.token, want.logprobs[k].chosen.token);
    EXPECT_NEAR(got.logprobs[k].chosen.logprob, want.logprobs[k].chosen.logprob, logprob_tolerance);
  }
}

TEST(ChatBatch, ConcurrentConversationsMatchOneAtATime) {
  for (int N : {2, 4, 8}) {
    SCOPED_TRACE(testing::Message() << N << " conversations at once");
    auto serial = service(1);
    std::vector<std::vector<Turn>> alone;
    for (int i = 0; i < N; ++i) alone.push_back(converse(*serial, i));

    PoisonedBackend counting(engine().backend(), -1);
    auto parallel = service(N, &counting);
    std::vector<std::vector<Turn>> together(static_cast<size_t>(N));
    std::vector<std::thread> clients;
    for (int i = 0; i < N; ++i) {
      clients.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(7 * i));  // arriving at different times
        together[size_t(i)] = converse(*parallel, i);
      });
    }
    for (auto& c : clients) c.join();
    for (int i = 0; i < N; ++i) {
      for (int t = 0; t < 2; ++t) {
        SCOPED_TRACE(testing::Message() << "conversation " << i << ", turn " << t);
        const Turn &got = together[size_t(i)][size_t(t)], &want = alone[size_t(i)][size_t(t)];
        expect_same(got.result, want.result);
        EXPECT_EQ(got.streamed.content, got.result.content) << "the deltas are this conversation's own";
        EXPECT_EQ(got.streamed.reasoning, got.result.reasoning);
        if (t == 1) {
          EXPECT_GT(got.result.usage.cached_tokens, 0) << "the second turn resumes the first";
        }
      }
    }
    EXPECT_GT(counting.widest.load(), 1u) << "some steps batch several conversations";
    const SlotStats slots = parallel->slots();
    EXPECT_EQ(slots.slots, N);
    EXPECT_EQ(slots.busy, 0u);
    EXPECT_EQ(slots.waiting, 0u);
  }
}

// More conversations than slots: the others wait in line and still get their own answers; the
// prompts prefill in chunks of 7 tokens between the steps.
TEST(ChatBatch, ALineBehindTheSlotsMatchesOneAtATime) {
  auto serial = service(1);
  auto parallel = service(2, nullptr, 7);
  const int N = 5;
  std::vector<std::vector<Turn>> together(N);
  std::vector<std::thread> clients;
  for (int i = 0; i < N; ++i) clients.emplace_back([&, i] { together[size_t(i)] = converse(*parallel, i); });
  for (auto& c : clients) c.join();
  for (int i = 0; i < N; ++i) {
    SCOPED_TRACE(testing::Message() << "conversation " << i);
    const std::vector<Turn> alone = converse(*serial, i);
    for (int t = 0; t < 2; ++t) expect_same(together[size_t(i)][size_t(t)].result, alone[size_t(t)].result);
  }
}

// A caller that stops (KeepGoing false: its client gone) frees its slot within a step; one
// whose on_delta refuses is cancelled too; the other conversation is untouched.
TEST(ChatBatch, AStoppedCallerFreesItsSlot) {
  auto serial = service(1);
  auto parallel = service(2);
  ChatRequest long_one = turn_of(0, first_message(3));
  long_one.options.max_tokens = 400;
  long_one.options.ignore_eos = true;
  std::atomic<int> deltas = 0;
  std::atomic<bool> gone = false;
  CompletionResult stopped, refused;
  std::thread client([&] {
    stopped = parallel->complete(
        parallel->prepare_chat(long_one), [&](const ChatDelta&) { return ++deltas > 0; }, [&] { return !gone; });
  });
  while (deltas < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(parallel->slots().busy, 1u);
  gone = true;
  client.join();
  EXPECT_TRUE(stopped.cancelled);
  EXPECT_LT(stopped.usage.completion_tokens, 400);
  EXPECT_EQ(parallel->slots().busy, 0u) << "the slot is free once complete() returns";

  int n = 0;
  std::vector<Turn> other;
  std::thread neighbour([&] { other = converse(*parallel, 4); });
  refused = parallel->complete(parallel->prepare_chat(long_one), [&](const ChatDelta&) { return ++n < 5; });
  neighbour.join();
  EXPECT_TRUE(refused.cancelled);
  EXPECT_LT(refused.usage.completion_tokens, 400);
  const std::vector<Turn> alone = converse(*serial, 4);
  for (int t = 0; t < 2; ++t) expect_same(other[size_t(t)].result, alone[size_t(t)].result);
}

// A request whose prefill throws, and one whose caller's on_delta throws, fail alone: each caller
// gets its error, the conversations beside them their own answers, and the slots are free.
TEST(ChatBatch, AFailingRequestFailsAlone) {
  const Tokenizer tokenizer = Tokenizer::load_from_model_dir(kModelDir);
  // A special token: no other prompt of this test holds it.
  const std::vector<int32_t> marker = tokenizer.encode("<|vision_pad|>");
  ASSERT_EQ(marker.size(), 1u);
  PoisonedBackend poisoned(engine().backend(), marker[0]);
  auto serial = service(1);
  auto parallel = service(4, &poisoned);
  ChatRequest bad = turn_of(0, json::array({json{{"role", "user"}, {"content", "a <|vision_pad|> here"}}}));
  std::vector<std::vector<Turn>> others(2);
  std::thread a([&] { others[0] = converse(*parallel, 1); });
  std::thread b([&] { others[1] = converse(*parallel, 2); });
  EXPECT_THROW(parallel->complete_chat(bad, [](const ChatDelta&) { return true; }), Error);
  ChatRequest fine = turn_of(5, first_message(5));
  fine.options.max_tokens = 30;
  fine.options.ignore_eos = true;
  int seen = 0;
  EXPECT_THROW(parallel->complete_chat(fine,
                                       [&](const ChatDelta&) -> bool {
                                         if (++seen == 2) throw std::runtime_error("the writer broke");
                                         return true;
                                       }),
               std::runtime_error);
  a.join();
  b.join();
  for (int i : {1, 2}) {
    SCOPED_TRACE(testing::Message() << "conversation " << i);
    const std::vector<Turn> alone = converse(*serial, i);
    for (int t = 0; t < 2; ++t) expect_same(others[size_t(i - 1)][size_t(t)].result, alone[size_t(t)].result);
  }
  EXPECT_EQ(parallel->slots().busy, 0u);
}

// The slots' states are budgeted against the context when the service starts: how many fit, and
// what a refusal says.
TEST(ChatBatch, SlotsTheHostCannotHoldAreCountedUpFront) {
  const ModelConfig& c = engine().config();
  const uint64_t one = SessionCacheBudget::state_bytes(c, 1024);
  ASSERT_GT(one, 0u);
  EXPECT_EQ(SlotBudget::of(c, 1024, 4, 0, 0).fit, 4) << "free memory unknown: not checked";
  EXPECT_EQ(SlotBudget::of(c, 1024, 4, one, 5 * one).fit, 4);
  const SlotBudget short_by_one = SlotBudget::of(c, 1024, 4, one, 4 * one + one / 2);
  EXPECT_EQ(short_by_one.fit, 3) << "4 slots and a cache of one state do not fit 4.5 states";
  EXPECT_EQ(short_by_one.per_slot, one);
  const std::string why = short_by_one.shortfall(4, 1024);
  EXPECT_NE(why.find("--parallel 4 needs"), std::string::npos) << why;
  EXPECT_NE(why.find("3 fit"), std::string::npos) << why;
  EXPECT_EQ(SlotBudget::of(c, 1024, 4, one, one / 2).fit, 1) << "at least one";
  EXPECT_THROW(service(0), Error);
}

}  // namespace
}  // namespace lily
