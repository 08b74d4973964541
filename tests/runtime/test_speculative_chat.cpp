// Speculative decoding through the chat service (ChatServiceOptions::speculate): on tiny-chat
// with tiny-a's MTP head (the same geometry), reference backend, the drafts forced right so that
// they are kept, a two-turn conversation streams exactly the content of the one without
// speculation, the second turn reuses the session cache as much, and the timings count the drafts.
#include <gtest/gtest.h>

#include "runtime/chat_service.h"
#include "runtime/engine.h"
#include "test_speculative_backend.h"

namespace lily {
namespace {

const std::string kChatModel = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";

struct Turn {
  std::string streamed;  // the content deltas, concatenated
  CompletionResult result;
};

ChatRequest greedy(json messages) {
  ChatRequest r;
  r.messages = std::move(messages);
  r.options.sampling.temperature = 0;
  r.options.max_tokens = 20;
  r.options.ignore_eos = true;
  r.template_options.enable_thinking = false;
  return r;
}

// Two turns; before each, `before_turn` gets the prepared prompt (to force the drafts).
std::vector<Turn> conversation(ChatService& service, const std::function<void(const ChatRequest&)>& before_turn) {
  json messages = json::array({json{{"role", "user"}, {"content", "Compute 12+35"}}});
  std::vector<Turn> turns;
  for (int t = 0; t < 2; ++t) {
    const ChatRequest request = greedy(messages);
    if (before_turn) before_turn(request);
    Turn turn;
    turn.result = service.complete_chat(request, [&](const ChatDelta& d) {
      turn.streamed += d.content;
      return true;
    });
    messages.push_back(json{{"role", "assistant"}, {"content", turn.result.content}});
    messages.push_back(json{{"role", "user"}, {"content", "And 7 times 6?"}});
    turns.push_back(std::move(turn));
  }
  return turns;
}

TEST(SpeculativeChat, StreamsThePlainAnswerAndReusesTheSessionCache) {
  auto engine = Engine::load(EngineOptions{kChatModel, "reference", 0, test::kTinyA + "/hf-fused"});
  ChatService plain(*engine, Tokenizer::load_from_model_dir(kChatModel));
  const std::vector<Turn> expected = conversation(plain, {});

  test::ForcedDraftBackend forced(engine->backend(), /*offer=*/true);
  forced.accepts = [](int64_t) { return 99; };
  ChatServiceOptions options;
  options.backend = &forced;
  options.speculate = 3;
  ChatService spec(*engine, Tokenizer::load_from_model_dir(kChatModel), options);
  size_t turn = 0;
  const std::vector<Turn> got = conversation(spec, [&](const ChatRequest& r) {
    forced.truth = spec.prepare_chat(r).prompt;
    const std::vector<int32_t>& reply = expected[turn++].result.tokens;
    forced.truth.insert(forced.truth.end(), reply.begin(), reply.end());
  });
  for (size_t t = 0; t < 2; ++t) {
    SCOPED_TRACE(testing::Message() << "turn " << t);
    EXPECT_EQ(got[t].streamed, expected[t].streamed);
    EXPECT_EQ(got[t].result.tokens, expected[t].result.tokens);
    EXPECT_EQ(got[t].result.usage.cached_tokens, expected[t].result.usage.cached_tokens);
    EXPECT_GT(got[t].result.timings.accepted_tokens, 0);
    EXPECT_GT(got[t].result.timings.drafted_tokens, got[t].result.timings.accepted_tokens - 1);
  }
  EXPECT_GT(got[1].result.usage.cached_tokens, 0) << "the second turn reuses the first's state";
}

TEST(SpeculativeChat, RefusedWhenTheModelHasNoHead) {
  auto engine = Engine::load(EngineOptions{kChatModel, "reference", 0});
  ChatServiceOptions options;
  options.speculate = 2;
  try {
    ChatService service(*engine, Tokenizer::load_from_model_dir(kChatModel), options);
    FAIL() << "a service that speculates without a head";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(engine->backend().mtp_unavailable()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lily
