// The chat service on the random-weight test model (tests/server/fixtures/tiny-chat): session
// reuse computes only the new tokens of later turns and gives exactly the tokens of a cold
// run (greedy); tool_choice under its grammar; stop strings; context checks. A named call after
// </think> runs on models/lily-tiny, which closes its reasoning (a random model does not).
// test_structured_output.cpp has the rest of the constrained replies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "candidate_backends.h"
#include "runtime/chat_service.h"

namespace lily {
namespace {

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";
const std::string kLilyTiny = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";
// LILY_TEST_BACKEND=cuda runs these on the GPU (greedy warm == cold must hold there too).
const std::string kBackend = std::getenv("LILY_TEST_BACKEND") ? std::getenv("LILY_TEST_BACKEND") : "cpu";

struct Fixture {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<test::WrappedBackend> chained;  // the engine's backend with chains on the host
  std::unique_ptr<ChatService> service;
  // chain: decode on test::HostChain (Backend::chain_tokens as the GPU does it) over the engine's
  // backend, whatever that offers itself.
  Fixture(int64_t context = 1024, uint64_t cache_bytes = uint64_t(1) << 30, const std::string& model = kModelDir,
          bool chain = false) {
    engine = Engine::load(EngineOptions{model, kBackend, 0});
    ChatServiceOptions options{context, cache_bytes};
    if (chain) {
      chained = std::make_unique<test::WrappedBackend>(engine->backend(), test::WrappedBackend::Mode::chained);
      options.backend = chained.get();
    }
    service = std::make_unique<ChatService>(*engine, Tokenizer::load_from_model_dir(model), options);
  }
};

ChatRequest greedy_request(json messages, int64_t max_tokens) {
  ChatRequest r;
  r.messages = std::move(messages);
  r.options.sampling.temperature = 0;
  r.options.max_tokens = max_tokens;
  return r;
}

CompletionResult run(ChatService& s, const ChatRequest& r) {
  return s.complete_chat(r, [](const ChatDelta&) { return true; });
}

// The reply as a client sends it back: content, reasoning and its tool calls (a call cut off by
// max_tokens is a call too, with what it wrote).
json assistant_turn(const CompletionResult& r) {
  json turn{{"role", "assistant"}, {"content", r.content}, {"reasoning_content", r.reasoning}};
  for (const ToolCall& call : r.tool_calls) {
    turn["tool_calls"].push_back(json{
        {"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return turn;
}

// Greedy warm and cold runs give the same tokens. The CPU backends compute a cached prefix and
// a cold pass the same way to the bit; the GPU's prefill splits differ between the two (the
// cached part was computed by other passes) and round differently in bf16, so there the runs may
// part where the cold run's best two tokens are a near-tie (asked with top_logprobs >= 1).
void expect_same_greedy_tokens(const CompletionResult& warm, const CompletionResult& cold) {
  const size_t n = std::min(warm.tokens.size(), cold.tokens.size());
  size_t i = 0;
  while (i < n && warm.tokens[i] == cold.tokens[i]) ++i;
  if (i == n && warm.tokens.size() == cold.tokens.size()) return;
  ASSERT_EQ(kBackend, "cuda") << "warm and cold part at token " << i;
  ASSERT_LT(i, cold.logprobs.size()) << "no logprobs to tell a near-tie at token " << i;
  const TokenLogprobs& at = cold.logprobs[i];
  ASSERT_GE(at.top.size(), 2u);
  const float gap = at.top[0].logprob - at.top[1].logprob;
  EXPECT_LT(gap, 0.05f) << "warm and cold part at token " << i << " where the cold run's best two differ by " << gap;
}

// The tools lily-tiny was trained with (models/lily-tiny/heldout.json).
json weather_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Get the local time in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
}

TEST(ChatService, LaterTurnsPrefillOnlyTheirNewTokensAndMatchColdRuns) {
  Fixture f;
  json messages = json::array({json{{"role", "system"}, {"content", "You are a helpful assistant."}},
                               json{{"role", "user"}, {"content", "Hello, how are you?"}}});
  const char* next_questions[] = {"What is the weather in Paris?", "And in Oslo?", "Count to ten."};
  int64_t previous_boundary = 0;
  for (int turn = 0; turn < 4; ++turn) {
    ChatRequest request = greedy_request(messages, 24);
    PreparedCompletion prepared = f.service->prepare_chat(request);
    CompletionResult warm = f.service->complete(prepared, [](const ChatDelta&) { return true; });
    ChatRequest cold_request = request;
    cold_request.options.use_cache = false;
    CompletionResult cold = run(*f.service, cold_request);

    EXPECT_EQ(warm.tokens, cold.tokens) << "turn " << turn;
    EXPECT_EQ(warm.reasoning, cold.reasoning);
    EXPECT_EQ(warm.content, cold.content);
    EXPECT_EQ(cold.usage.cached_tokens, 0);
    // Turn k resumes where turn k-1's generation prompt started: only the new tokens are computed.
    EXPECT_EQ(warm.usage.cached_tokens, previous_boundary) << "turn " << turn;
    EXPECT_EQ(warm.timings.prefilled_tokens, warm.usage.prompt_tokens - previous_boundary);
    if (turn > 0) {
      EXPECT_GT(warm.usage.cached_tokens, 0);
    }
    previous_boundary = prepared.reuse_boundary;

    messages.push_back(assistant_turn(warm));
    if (turn < 3) messages.push_back(json{{"role", "user"}, {"content", next_questions[turn]}});
    else break;
  }
}

TEST(ChatService, AToolResultResumesFromTheEndOfThePreviousPrompt) {
  Fixture f;
  json tools = json::array({json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "description": "Get the weather of a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}})")});
  json messages = json::array({json{{"role", "user"}, {"content", "What is the weather in Oslo?"}}});
  ChatRequest first = greedy_request(messages, 16);
  first.tools = tools;
  PreparedCompletion p1 = f.service->prepare_chat(first);
  CompletionResult r1 = f.service->complete(p1, [](const ChatDelta&) { return true; });

  // The assistant turn keeps its reasoning (it is after the last user query), so the prompt of
  // the follow-up extends the first prompt at least up to its end.
  messages.push_back(assistant_turn(r1));
  messages.push_back(json{{"role", "tool"}, {"content", "{\"temp\": 3}"}});
  ChatRequest second = greedy_request(messages, 16);
  second.tools = tools;
  second.options.top_logprobs = 2;  // for a near-tie on the GPU (expect_same_greedy_tokens)
  CompletionResult warm = run(*f.service, second);
  EXPECT_GE(warm.usage.cached_tokens, int64_t(p1.prompt.size()));
  second.options.use_cache = false;
  CompletionResult cold = run(*f.service, second);
  expect_same_greedy_tokens(warm, cold);
}

TEST(ChatService, RegeneratingTheSameRequestIsIdentical) {
  Fixture f;
  ChatRequest r = greedy_request(json::array({json{{"role", "user"}, {"content", "Hello"}}}), 20);
  CompletionResult a = run(*f.service, r);
  CompletionResult b = run(*f.service, r);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(b.usage.cached_tokens, 0);
}

// A named choice's grammar writes the call whatever the model prefers; its one parameter is an
// enum so that a random model finishes it.
TEST(ChatService, NamedToolChoiceAlwaysCallsIt) {
  Fixture f;
  ChatRequest r = greedy_request(json::array({json{{"role", "user"}, {"content", "Weather in Oslo?"}}}), 60);
  r.tools = json::array({json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}}, "required": ["city"]}}})")});
  r.tool_choice = {ToolChoice::Mode::function, "get_weather"};
  r.template_options.enable_thinking = false;
  ChatDelta streamed;
  std::string pieces;  // the arguments as they streamed (issue 18, 2)
  CompletionResult res = f.service->complete_chat(r, [&](const ChatDelta& d) {
    streamed.content += d.content;
    streamed.tool_calls.insert(streamed.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    for (const ToolCallDelta& t : d.tool_call_deltas) pieces += t.arguments;
    return true;
  });
  ASSERT_EQ(res.tool_calls.size(), 1u) << res.content;
  EXPECT_EQ(res.tool_calls[0].name, "get_weather");
  const json args = json::parse(res.tool_calls[0].arguments);
  EXPECT_TRUE(args == json::parse(R"({"city": "Oslo"})") || args == json::parse(R"({"city": "Lima"})")) << args;
  EXPECT_EQ(res.finish_reason, "tool_calls");
  EXPECT_EQ(res.content, "");
  EXPECT_EQ(streamed.content, res.content);
  ASSERT_EQ(streamed.tool_calls.size(), 1u);
  EXPECT_EQ(streamed.tool_calls[0].arguments, res.tool_calls[0].arguments);
  EXPECT_EQ(pieces, res.tool_calls[0].arguments);
}

TEST(ChatService, AConstrainedReplyFromTheCacheIsTheColdRunsReply) {
  Fixture f;
  ChatRequest r = greedy_request(json::array({json{{"role", "user"}, {"content", "Weather in Oslo?"}}}), 40);
  r.tools = json::array({json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"days": {"enum": [1, 2, 3]}}}}})")});
  r.tool_choice = {ToolChoice::Mode::required, ""};
  r.template_options.enable_thinking = false;
  const PreparedCompletion p = f.service->prepare_chat(r);
  CompletionResult first = f.service->complete(p, [](const ChatDelta&) { return true; });
  EXPECT_EQ(first.usage.cached_tokens, 0);
  EXPECT_EQ(first.timings.decoded_tokens, int64_t(first.tokens.size()));  // nothing forced: all decoded
  CompletionResult again = f.service->complete(p, [](const ChatDelta&) { return true; });
  EXPECT_GT(again.usage.cached_tokens, 0);
  ChatRequest cold_request = r;
  cold_request.options.use_cache = false;
  CompletionResult cold = run(*f.service, cold_request);
  EXPECT_EQ(first.tokens, cold.tokens);
  EXPECT_EQ(again.tokens, cold.tokens);
  ASSERT_EQ(cold.tool_calls.size(), 1u) << cold.content;
  EXPECT_EQ(again.tool_calls[0].arguments, cold.tool_calls[0].arguments);
}

// Issue 17 (4): tool_choice "required" with several tools forced "<tool_call>\n<function=" and
// got "_currency" back, a function not in tools. Under the grammar the reply is always a call
// to one of them, with thinking on or off.
TEST(ChatService, regression_required_with_several_tools_returns_only_their_calls_17) {
  Fixture f(4096, uint64_t(256) << 20, kLilyTiny);
  json tools = weather_tools();
  tools.push_back(json::parse(R"({"type": "function", "function": {"name": "convert_currency",
      "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}}}})"));
  for (const char* question : {"Convert 20 euros to dollars"}) {
    for (bool thinking : {false, true}) {
      ChatRequest r = greedy_request(json::array({json{{"role", "user"}, {"content", question}}}), 160);
      r.tools = tools;
      r.tool_choice = {ToolChoice::Mode::required, ""};
      r.template_options.enable_thinking = thinking;
      const CompletionResult res = run(*f.service, r);
      ASSERT_FALSE(res.tool_calls.empty()) << "thinking " << thinking << ": " << res.content;
      for (const ToolCall& call : res.tool_calls) {
        EXPECT_TRUE(call.name == "get_weather" || call.name == "get_time" || call.name == "convert_currency")
            << question << ": a call to " << call.name;
      }
      EXPECT_EQ(res.finish_reason, "tool_calls");
      std::printf("  required, thinking %d: %s -> %s %s\n", int(thinking), question, res.tool_calls[0].name.c_str(),
                  res.tool_calls[0].arguments.c_str());
    }
  }
}

TEST(ChatService, WithThinkingTheNamedCallFollowsTheModelsThinkEnd) {
  Fixture f(4096, uint64_t(256) << 20, kLilyTiny);
  const Tokenizer& tokenizer = f.service->tokenizer();
  json messages = json::array({json{{"role", "user"}, {"content", "What's the weather in Reykjavik?"}}});
  ChatRequest r = greedy_request(messages, 200);
  r.tools = weather_tools();
  r.tool_choice = {ToolChoice::Mode::function, "get_time"};  // not what the question asks: the choice decides
  const PreparedCompletion p = f.service->prepare_chat(r);
  ChatDelta streamed;
  CompletionResult res = f.service->complete(p, [&](const ChatDelta& d) {
    streamed.reasoning += d.reasoning;
    streamed.content += d.content;
    streamed.tool_calls.insert(streamed.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    return true;
  });

  const int32_t think_end = *tokenizer.token_id("</think>");
  const auto at = std::find(res.tokens.begin(), res.tokens.end(), think_end);
  ASSERT_NE(at, res.tokens.end()) << "lily-tiny did not close its reasoning";
  EXPECT_EQ(std::count(res.tokens.begin(), res.tokens.end(), think_end), 1);
  EXPECT_EQ(res.timings.decoded_tokens, int64_t(res.tokens.size()));
  EXPECT_EQ(res.usage.completion_tokens, int64_t(res.tokens.size()));
  ASSERT_EQ(res.tool_calls.size(), 1u) << res.reasoning << "|" << res.content;
  EXPECT_EQ(res.tool_calls[0].name, "get_time");
  EXPECT_TRUE(json::parse(res.tool_calls[0].arguments)["city"].is_string()) << res.tool_calls[0].arguments;
  EXPECT_EQ(res.finish_reason, "tool_calls");
  EXPECT_FALSE(res.reasoning.empty());
  EXPECT_EQ(res.content, "");
  EXPECT_EQ(streamed.reasoning, res.reasoning);
  EXPECT_EQ(streamed.content, res.content);
  ASSERT_EQ(streamed.tool_calls.size(), 1u);
  EXPECT_EQ(streamed.tool_calls[0].arguments, res.tool_calls[0].arguments);

  // The tool result resumes from the end of the first prompt (the snapshot taken at the first
  // token) and gives the tokens of a cold run.
  const ToolCall& call = res.tool_calls[0];
  messages.push_back(
      json{{"role", "assistant"},
           {"content", res.content},
           {"reasoning_content", res.reasoning},
           {"tool_calls", json::array({json{{"type", "function"},
                                            {"id", call.id},
                                            {"function", {{"name", call.name}, {"arguments", call.arguments}}}}})}});
  messages.push_back(json{{"role", "tool"}, {"content", "{\"time\": \"10:00\"}"}});
  ChatRequest next = greedy_request(messages, 60);
  next.tools = weather_tools();
  CompletionResult warm = run(*f.service, next);
  EXPECT_GE(warm.usage.cached_tokens, int64_t(p.prompt.size()));
  next.options.use_cache = false;
  CompletionResult cold = run(*f.service, next);
  EXPECT_EQ(warm.tokens, cold.tokens);
}

TEST(ChatService, UnknownNamedToolIsARequestError) {
  Fixture f;
  ChatRequest r = greedy_request(json::array({json{{"role", "user"}, {"content", "hi"}}}), 4);
  r.tool_choice = {ToolChoice::Mode::function, "nope"};
  EXPECT_THROW(f.service->prepare_chat(r), RequestError);
  r.tool_choice = {ToolChoice::Mode::required, ""};
  EXPECT_THROW(f.service->prepare_chat(r), RequestError);
}

TEST(ChatService, StopStringEndsTheReplyAndNeverShows) {
  Fixture f;
  ChatRequest r = greedy_request(json::array({json{{"role", "user"}, {"content", "Hello"}}}), 30);
  r.template_options.enable_thinking = false;
  CompletionResult full = run(*f.service, r);
  ASSERT_GE(full.content.size(), 6u);
  // Use a piece of the unconstrained answer as the stop string.
  const std::string stop = full.content.substr(3, 3);
  r.options.stop = {stop};
  std::string streamed;
  CompletionResult cut = f.service->complete_chat(r, [&](const ChatDelta& d) {
    streamed += d.content;
    return true;
  });
  EXPECT_EQ(cut.finish_reason, "stop");
  EXPECT_EQ(cut.content, full.content.substr(0, full.content.find(stop)));
  EXPECT_EQ(streamed, cut.content);
}

TEST(ChatService, PromptPlusMaxTokensBeyondTheContextIsRefused) {
  Fixture f(64);
  ChatRequest r = greedy_request(json::array({json{{"role", "user"}, {"content", "Hello"}}}), 60);
  try {
    f.service->prepare_chat(r);
    FAIL() << "expected a RequestError";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_EQ(e.param, "max_tokens");
  }
  r.options.max_tokens.reset();  // fill what the context leaves
  PreparedCompletion p = f.service->prepare_chat(r);
  EXPECT_EQ(int64_t(p.prompt.size()) + p.max_tokens, 64);
}

TEST(ChatService, CancellingStopsAtTheNextToken) {
  Fixture f;
  ChatRequest r = greedy_request(json::array({json{{"role", "user"}, {"content", "Hello"}}}), 50);
  int calls = 0;
  CompletionResult res = f.service->complete_chat(r, [&](const ChatDelta&) { return ++calls < 3; });
  EXPECT_TRUE(res.cancelled);
  EXPECT_EQ(calls, 3);
  EXPECT_LT(res.usage.completion_tokens, 50);
}

// The session cache with chained decoding: a reply that ends on a stop token leaves it in the
// state (the chain's step ahead fed it), a cancelled one its last token. Conversations of
// lily-tiny (its replies end on <|im_end|>) and of the random model, greedy and sampled, with a
// tool grammar, a cancel and a stop string in the middle: every reply's tokens, cached counts and
// finish equal those of the same service stepping one token at a time.
TEST(ChatService, ChainedDecodingKeepsEveryReplyAndTheCacheExact) {
  for (const std::string& model : {kLilyTiny, kModelDir}) {
    SCOPED_TRACE(model);
    Fixture stepwise(1024, uint64_t(1) << 30, model), chained(1024, uint64_t(1) << 30, model, true);
    json messages = json::array({json{{"role", "user"}, {"content", "What is the weather in Paris?"}}});
    const char* follow_ups[] = {"And in Oslo?", "Thanks. Count to five.", "Bye."};
    int stops = 0;
    for (int turn = 0; turn < 4; ++turn) {
      SCOPED_TRACE(testing::Message() << "turn " << turn);
      ChatRequest r = greedy_request(messages, 48);
      if (turn == 1) r.options.sampling = SamplingParams{0.8f, 20, 0.95f, 0.0f, 1.5f, 0.0f, 1.0f, 42};
      if (turn == 2) r.tools = weather_tools(), r.tool_choice = {ToolChoice::Mode::required, ""};
      std::vector<CompletionResult> results;
      for (Fixture* f : {&stepwise, &chained}) {
        int deltas = 0;
        results.push_back(f->service->complete_chat(r, [&](const ChatDelta&) { return turn != 3 || ++deltas < 4; }));
      }
      const CompletionResult &want = results[0], &got = results[1];
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.content, want.content);
      EXPECT_EQ(got.reasoning, want.reasoning);
      EXPECT_EQ(got.finish_reason, want.finish_reason);
      EXPECT_EQ(got.cancelled, want.cancelled);
      EXPECT_EQ(got.usage.cached_tokens, want.usage.cached_tokens);
      EXPECT_EQ(got.usage.prompt_tokens, want.usage.prompt_tokens);
      stops += got.finish_reason != "length" && !got.cancelled;
      if (turn == 3) {
        EXPECT_TRUE(got.cancelled);
        break;
      }
      messages.push_back(assistant_turn(want));
      messages.push_back(json{{"role", "user"}, {"content", follow_ups[turn]}});
    }
    EXPECT_GT(chained.chained->chains, 0);
    if (model == kLilyTiny) {
      EXPECT_GT(stops, 0) << "a reply ended on a stop token";
    }
    // After the cancel: the same request again, from the cache, as stepwise.
    ChatRequest again = greedy_request(messages, 24);
    const CompletionResult a = run(*stepwise.service, again), b = run(*chained.service, again);
    EXPECT_EQ(b.tokens, a.tokens);
    EXPECT_EQ(b.usage.cached_tokens, a.usage.cached_tokens);
  }
}

TEST(ChatService, TextCompletionOfTokenIds) {
  Fixture f;
  TextRequest t;
  t.prompt_tokens = {10, 20, 30};
  t.options.sampling.temperature = 0;
  t.options.max_tokens = 5;
  PreparedCompletion p = f.service->prepare_text(t);
  CompletionResult r = f.service->complete(p, [](const ChatDelta&) { return true; });
  EXPECT_EQ(r.usage.prompt_tokens, 3);
  EXPECT_LE(r.usage.completion_tokens, 5);
  t.prompt_tokens = {10, 100000};
  EXPECT_THROW(f.service->prepare_text(t), RequestError);
}

}  // namespace
}  // namespace lily
