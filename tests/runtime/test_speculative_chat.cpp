// Speculative decoding through the chat service (ChatServiceOptions::speculate): on tiny-chat
// with tiny-a's MTP head (the same geometry), reference backend, the drafts forced right so that
// they are kept, a two-turn conversation streams exactly the content of the one without
// speculation, the second turn reuses the session cache as much, and the timings count the drafts.
// On lily-tiny (a trained head): the usage counts them too.
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

// A json_schema reply (the grammar masks the drafts too), with logprobs and a repetition penalty:
// the same tokens, text and logprobs as without speculation, drafts kept (forced right) and
// refused (forced wrong, every third step).
TEST(SpeculativeChat, ConstrainedReplyWithLogprobsAsPlain) {
  auto engine = Engine::load(EngineOptions{kChatModel, "reference", 0, test::kTinyA + "/hf-fused"});
  ChatRequest r = greedy(json::array({json{{"role", "user"}, {"content", "JSON please"}}}));
  r.response_format.type = ResponseFormat::Type::json_schema;
  r.response_format.schema = json::parse(R"({"type": "object", "properties": {"answer": {"type": "string"}},
                                             "required": ["answer"]})");
  r.options.top_logprobs = 2;
  r.options.ignore_eos = false;
  r.options.max_tokens = 30;
  r.options.sampling.repetition_penalty = 1.3f;
  ChatService plain(*engine, Tokenizer::load_from_model_dir(kChatModel));
  const CompletionResult expected = plain.complete_chat(r, [](const ChatDelta&) { return true; });

  for (bool offer : {true, false}) {
    test::ForcedDraftBackend forced(engine->backend(), offer);
    forced.accepts = [](int64_t s) { return s % 3 == 2 ? 0 : 99; };
    ChatServiceOptions options;
    options.backend = &forced;
    options.speculate = 2;
    ChatService spec(*engine, Tokenizer::load_from_model_dir(kChatModel), options);
    forced.truth = spec.prepare_chat(r).prompt;
    forced.truth.insert(forced.truth.end(), expected.tokens.begin(), expected.tokens.end());
    const CompletionResult got = spec.complete_chat(r, [](const ChatDelta&) { return true; });
    EXPECT_EQ(got.tokens, expected.tokens);
    EXPECT_EQ(got.content, expected.content);
    EXPECT_EQ(got.finish_reason, expected.finish_reason);
    ASSERT_EQ(got.logprobs.size(), expected.logprobs.size());
    for (size_t i = 0; i < got.logprobs.size(); ++i) {
      EXPECT_NEAR(got.logprobs[i].chosen.logprob, expected.logprobs[i].chosen.logprob, 1e-4) << i;
      ASSERT_EQ(got.logprobs[i].top.size(), expected.logprobs[i].top.size());
    }
    EXPECT_GT(got.timings.accepted_tokens, 0);
    EXPECT_LT(got.timings.accepted_tokens, got.timings.drafted_tokens)
        << got.tokens.size() << " tokens: " << got.content << " / " << got.reasoning;
  }
}

// Issue 37: a completion that speculated says in its usage what the drafts did (lily-tiny's
// trained head, the fast CPU backend, greedy): kept + refused = the drafts made, every kept
// draft one of the reply's tokens, and the reply plain decoding's; a plain completion's usage
// has no such field.
TEST(SpeculativeChat, UsageCountsTheDraftsOnLilyTiny) {
  const std::string lily_tiny = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";
  auto engine = Engine::load(EngineOptions{lily_tiny, "cpu", 0});
  ChatRequest r;
  r.messages = json::array({json{{"role", "user"}, {"content", "What is 487 + 356?"}}});
  r.options.sampling.temperature = 0;
  r.options.max_tokens = 64;
  ChatService plain(*engine, Tokenizer::load_from_model_dir(lily_tiny));
  const CompletionResult expected = plain.complete_chat(r, [](const ChatDelta&) { return true; });
  EXPECT_FALSE(expected.usage.predictions) << "a plain completion's usage counts no drafts";
  EXPECT_FALSE(expected.timings.speculative);

  for (int drafts : {1, 3}) {
    SCOPED_TRACE(testing::Message() << "--speculate " << drafts);
    ChatServiceOptions options;
    options.speculate = drafts;
    ChatService spec(*engine, Tokenizer::load_from_model_dir(lily_tiny), options);
    const CompletionResult got = spec.complete_chat(r, [](const ChatDelta&) { return true; });
    EXPECT_EQ(got.tokens, expected.tokens);
    ASSERT_TRUE(got.usage.predictions) << "a speculative completion's usage has the drafts";
    const PredictionTokens& p = *got.usage.predictions;
    EXPECT_EQ(p.accepted, got.timings.accepted_tokens);
    EXPECT_EQ(p.accepted + p.rejected, got.timings.drafted_tokens);
    EXPECT_GT(p.accepted, 0) << "lily-tiny's head keeps most of its drafts";
    EXPECT_GE(p.rejected, 0);
    EXPECT_LE(p.accepted, got.usage.completion_tokens - 1) << "the first token comes from the prefill, not a draft";
  }
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
