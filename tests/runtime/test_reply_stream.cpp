// ReplyStream with the test tokenizer and no model: tokens and forced text in, the exact deltas
// out. Stop strings split over tokens never show; a stop string wins over a client that leaves
// on the same delta; a cancelled reply sends nothing more; logprobs go out with their token
// even when its text is held; reasoning and a forced call opening become one tool call.
#include <gtest/gtest.h>

#include "runtime/reply_stream.h"

namespace lily {
namespace {

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load_from_model_dir(kModelDir);
  return t;
}

// One token per character (every byte has its own token in byte-level BPE), so a stop string
// can be split over tokens anywhere.
std::vector<int32_t> char_tokens(const std::string& text) {
  std::vector<int32_t> ids;
  for (char c : text) {
    std::vector<int32_t> one = tokenizer().encode(std::string(1, c));
    EXPECT_EQ(one.size(), 1u) << "'" << c << "'";
    ids.insert(ids.end(), one.begin(), one.end());
  }
  return ids;
}

GeneratedToken token(int32_t id) { return GeneratedToken{id, std::nullopt, {}}; }

// Records every delta sent; answers `answer(n)` to the n-th (1-based).
struct Client {
  std::vector<ChatDelta> deltas;
  std::function<bool(size_t)> answer = [](size_t) { return true; };
  DeltaCallback callback() {
    return [this](const ChatDelta& d) {
      deltas.push_back(d);
      return answer(deltas.size());
    };
  }
  std::vector<std::string> contents() const {
    std::vector<std::string> out;
    for (const ChatDelta& d : deltas) out.push_back(d.content);
    return out;
  }
};

ReplyStream text_stream(Client& client, std::vector<std::string> stop = {}) {
  return ReplyStream(tokenizer(), std::nullopt, std::move(stop), client.callback());
}

using Strings = std::vector<std::string>;

TEST(ReplyStream, TextIsSentAsSoonAsItIsWhole) {
  Client client;
  ReplyStream reply = text_stream(client);
  for (int32_t id : char_tokens("Hi you")) EXPECT_TRUE(reply.push_token(token(id)));
  reply.finish();
  EXPECT_EQ(client.contents(), (Strings{"H", "i", " ", "y", "o", "u"}));
  EXPECT_EQ(reply.whole().content, "Hi you");
  EXPECT_TRUE(reply.open());
}

TEST(ReplyStream, AStopStringSplitOverTokensNeverShows) {
  Client client;
  ReplyStream reply = text_stream(client, {"STOP"});
  const std::vector<int32_t> ids = char_tokens("abSTxSTOPyz");
  std::vector<bool> open;
  for (size_t i = 0; i < ids.size() && reply.open(); ++i) open.push_back(reply.push_token(token(ids[i])));
  EXPECT_EQ(open, (std::vector<bool>{true, true, true, true, true, true, true, true, false}));
  EXPECT_TRUE(reply.stopped());
  EXPECT_FALSE(reply.cancelled());
  reply.finish();  // nothing held back survives the stop
  EXPECT_EQ(client.contents(), (Strings{"a", "b", "STx"}));
  EXPECT_EQ(reply.whole().content, "abSTx");
}

TEST(ReplyStream, FinishReleasesWhatTheStopStringsHeldBack) {
  Client client;
  ReplyStream reply = text_stream(client, {"XY"});
  EXPECT_TRUE(reply.push_text("a"));
  EXPECT_TRUE(reply.push_text("bX"));
  reply.finish();
  EXPECT_EQ(client.contents(), (Strings{"a", "b", "X"}));
  EXPECT_FALSE(reply.stopped());
}

TEST(ReplyStream, ACancelledReplySendsNothingMore) {
  Client client;
  client.answer = [](size_t n) { return n < 2; };
  ReplyStream reply = text_stream(client, {"XY"});
  EXPECT_TRUE(reply.push_text("a"));
  EXPECT_FALSE(reply.push_text("bX"));  // the client leaves on "b"
  EXPECT_TRUE(reply.cancelled());
  EXPECT_FALSE(reply.stopped());
  reply.finish();  // the held "X" is not sent
  EXPECT_EQ(client.contents(), (Strings{"a", "b"}));
  EXPECT_EQ(reply.whole().content, "ab");
}

TEST(ReplyStream, AStopStringWinsOverAClientLeavingOnTheSameDelta) {
  Client client;
  client.answer = [](size_t) { return false; };
  ReplyStream reply = text_stream(client, {"b"});
  EXPECT_FALSE(reply.push_text("xbz"));
  EXPECT_TRUE(reply.stopped());
  EXPECT_FALSE(reply.cancelled());
  EXPECT_EQ(client.contents(), (Strings{"x"}));
}

TEST(ReplyStream, LogprobsGoOutWithTheirTokenEvenWhenItsTextIsHeld) {
  Client client;
  ReplyStream reply = text_stream(client, {"ST"});
  const std::vector<int32_t> ids = char_tokens("aSx");
  const float lp[] = {-0.5f, -1.5f, -2.5f};
  for (size_t i = 0; i < ids.size(); ++i) {
    GeneratedToken t{ids[i], TokenLogprob{ids[i], lp[i]}, {TokenLogprob{ids[0], -0.25f}}};
    EXPECT_TRUE(reply.push_token(t));
  }
  reply.finish();
  // "S" may start "ST": its text waits for "x", its logprobs do not.
  EXPECT_EQ(client.contents(), (Strings{"a", "", "Sx"}));
  ASSERT_EQ(client.deltas.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(client.deltas[i].logprobs.size(), 1u) << i;
    EXPECT_EQ(client.deltas[i].logprobs[0].chosen.logprob, lp[i]) << i;
  }
  const TokenLogprobs& s = client.deltas[1].logprobs[0];
  EXPECT_EQ(s.chosen.token, "S");
  EXPECT_EQ(s.chosen.bytes, "S");
  ASSERT_EQ(s.top.size(), 1u);
  EXPECT_EQ(s.top[0].token, "a");
  EXPECT_EQ(s.top[0].logprob, -0.25f);
  EXPECT_EQ(reply.whole().logprobs.size(), 3u);
}

TEST(ReplyStream, ReasoningThenAForcedOpeningBecomeOneToolCall) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  Client client;
  ReplyStream reply(tokenizer(), OutputParserOptions{true, tools, true}, {}, client.callback());
  for (int32_t id : tokenizer().encode("Look it up.\n</think>")) EXPECT_TRUE(reply.push_token(token(id)));
  EXPECT_TRUE(reply.push_text("\n\n<tool_call>\n<function=get_weather>\n"));
  for (int32_t id : tokenizer().encode("<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"))
    EXPECT_TRUE(reply.push_token(token(id)));
  reply.finish();

  const ChatDelta& whole = reply.whole();
  EXPECT_EQ(whole.reasoning, "Look it up.");
  EXPECT_EQ(whole.content, "");
  ASSERT_EQ(whole.tool_calls.size(), 1u);
  EXPECT_EQ(whole.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(whole.tool_calls[0].arguments), json::parse(R"({"city": "Oslo"})"));
  EXPECT_TRUE(whole.tool_calls[0].id.starts_with("call_"));
  EXPECT_EQ(whole.tool_calls[0].id.size(), 29u);
  std::string reasoning;
  size_t calls = 0;
  for (const ChatDelta& d : client.deltas) reasoning += d.reasoning, calls += d.tool_calls.size();
  EXPECT_EQ(reasoning, whole.reasoning);
  EXPECT_EQ(calls, 1u);
}

// Issue 18 (2): a call goes out when its name is known, then its arguments as they are
// written; its deltas and its complete ToolCall carry one id, and the pieces add up to its
// arguments. Two calls get two ids and the indexes 0 and 1.
TEST(ReplyStream, ToolCallsStreamUnderOneIdEach) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  Client client;
  ReplyStream reply(tokenizer(), OutputParserOptions{false, tools, true}, {}, client.callback());
  const std::string call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo \"Nord\"\n</parameter>\n"
                           "</function>\n</tool_call>";
  for (int32_t id : char_tokens("Sure.\n\n" + call + "\n" + call)) EXPECT_TRUE(reply.push_token(token(id)));
  reply.finish();

  const ChatDelta& whole = reply.whole();
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  EXPECT_TRUE(whole.tool_call_deltas.empty());
  std::vector<std::string> ids, arguments;
  size_t deltas = 0;
  for (const ChatDelta& d : client.deltas) {
    for (const ToolCallDelta& t : d.tool_call_deltas) {
      ++deltas;
      if (!t.name.empty()) {
        EXPECT_EQ(t.index, int(ids.size()));
        EXPECT_EQ(t.name, "get_weather");
        ids.push_back(t.id);
        arguments.emplace_back();
      } else {
        EXPECT_TRUE(t.id.empty());
      }
      ASSERT_LT(size_t(t.index), arguments.size());
      arguments[size_t(t.index)] += t.arguments;
    }
  }
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_GT(deltas, 10u);  // streamed, not one piece per call
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(whole.tool_calls[i].id, ids[i]);
    EXPECT_EQ(whole.tool_calls[i].arguments, arguments[i]);
    EXPECT_EQ(whole.tool_calls[i].arguments, R"({"city": "Oslo \"Nord\""})");
  }
}

// Issue 18 (6): the tokens pushed while the reply is in its reasoning, its </think> included.
TEST(ReplyStream, CountsTheReasoningTokens) {
  Client client;
  ReplyStream reply(tokenizer(), OutputParserOptions{true, nullptr, false}, {}, client.callback());
  for (int32_t id : char_tokens("Hm, 1+1.\n</think>\n\n2")) EXPECT_TRUE(reply.push_token(token(id)));
  reply.finish();
  EXPECT_EQ(reply.whole().reasoning, "Hm, 1+1.");
  EXPECT_EQ(reply.reasoning_tokens(), int64_t(std::string("Hm, 1+1.\n</think>").size()));

  Client off;
  ReplyStream answer(tokenizer(), OutputParserOptions{false, nullptr, false}, {}, off.callback());
  for (int32_t id : char_tokens("2")) EXPECT_TRUE(answer.push_token(token(id)));
  EXPECT_EQ(answer.reasoning_tokens(), 0);
}

TEST(ReplyStream, TellsWhichStopStringEndedIt) {
  Client client;
  ReplyStream reply = text_stream(client, {"XY", "Z", "XYZ"});
  EXPECT_TRUE(reply.push_text("aX"));
  EXPECT_FALSE(reply.push_text("YZb"));  // "XY" and "XYZ" start at once: the longer one
  EXPECT_TRUE(reply.stopped());
  EXPECT_EQ(reply.stop_string(), "XYZ");
}

}  // namespace
}  // namespace lily
