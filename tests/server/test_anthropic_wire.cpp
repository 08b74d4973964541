// Anthropic's Messages API over the chat service (src/server/anthropic_wire.h): requests become
// the chat messages the Qwen template renders, bad requests are 400s naming the field, and the
// response and the event stream are built from what the chat service gives.
#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "server/anthropic_wire.h"
#include "server/errors.h"

namespace lily::server {
namespace {

AnthropicRequest read(const std::string& body, bool count_tokens = false) {
  return read_anthropic_request(json::parse(body), SamplingParams{}, count_tokens);
}

// The param of the 400 that reading `body` answers ("accepted" when it is read).
std::string refused(const std::string& body, bool count_tokens = false) {
  try {
    read(body, count_tokens);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    return e.param;
  }
  return "accepted";
}

TEST(AnthropicWire, AToolRoundTripBecomesTheTemplatesMessages) {
  const AnthropicRequest r = read(R"({
    "model": "claude-x", "max_tokens": 100,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
    "messages": [
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Call it.", "signature": "x"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 C"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
         "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "data"}]},
        {"type": "text", "text": "And tomorrow?"}]}],
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object",
               "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "stop_sequences": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 20, "stream": true,
    "metadata": {"user_id": "u"}})");
  const json expected = json::parse(R"([
    {"role": "system", "content": "Be brief.\n\nUse tools."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "Call it.", "tool_calls": [
      {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": "3 C"},
    {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no\ndata"},
    {"role": "user", "content": "And tomorrow?"}])");
  EXPECT_EQ(r.chat.messages, expected) << r.chat.messages.dump(1);
  EXPECT_EQ(r.chat.tools, json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])"));
  EXPECT_EQ(r.chat.tool_choice.mode, ToolChoice::Mode::automatic);
  EXPECT_TRUE(r.chat.template_options.enable_thinking);
  EXPECT_EQ(r.chat.options.max_tokens, 100);
  EXPECT_EQ(r.chat.options.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(r.chat.options.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.chat.options.sampling.top_p, 0.9f);
  EXPECT_EQ(r.chat.options.sampling.top_k, 20);
  EXPECT_TRUE(r.stream);
  // The template renders it (tool results in one user turn, the call as Qwen writes it).
  const std::string prompt = render_chat_template(r.chat.messages, r.chat.tools, r.chat.template_options);
  EXPECT_NE(prompt.find("<tool_response>\n3 C\n</tool_response>\n<tool_response>\nError: no\ndata\n</tool_response>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<function=get_weather>\n<parameter=city>\nOslo\n</parameter>"), std::string::npos) << prompt;
}

TEST(AnthropicWire, ToolChoiceAndThinking) {
  const std::string tools = R"("tools": [{"name": "a", "input_schema": {"type": "object"}}, {"name": "b"}])";
  auto choice = [&](const std::string& c) {
    return read(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], )" + tools +
                R"(, "tool_choice": )" + c + "}")
        .chat.tool_choice;
  };
  EXPECT_EQ(choice(R"({"type": "any"})").mode, ToolChoice::Mode::required);
  EXPECT_EQ(choice(R"({"type": "none"})").mode, ToolChoice::Mode::none);
  const ToolChoice named = choice(R"({"type": "tool", "name": "b"})");
  EXPECT_EQ(named.mode, ToolChoice::Mode::function);
  EXPECT_EQ(named.function, "b");
  const AnthropicRequest r = read(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], )" + tools +
                                  "}");
  EXPECT_EQ(r.chat.tools[1]["function"]["parameters"], json::parse(R"({"type": "object", "properties": {}})"));
  EXPECT_FALSE(r.chat.template_options.enable_thinking);  // Anthropic's default: off
  EXPECT_FALSE(r.stream);
  auto thinking = [&](const std::string& t) {
    return read(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": )" + t + "}")
        .chat.template_options.enable_thinking;
  };
  EXPECT_TRUE(thinking(R"({"type": "adaptive"})"));
  EXPECT_FALSE(thinking(R"({"type": "disabled"})"));
}

TEST(AnthropicWire, BadRequestsAre400sNamingTheField) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(refused("{" + user + "}"), "max_tokens");
  EXPECT_EQ(refused("{" + user + "}", /*count_tokens=*/true), "accepted");
  EXPECT_EQ(refused(R"({"max_tokens": 0, )" + user + "}"), "max_tokens");
  EXPECT_EQ(refused(R"({"max_tokens": 5})"), "messages");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": []})"), "messages");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})"), "messages[0].role");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image",
      "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t",
      "name": "f", "input": {}}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant",
      "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}, {"role": "user", "content": "y"}]})"),
            "messages[1].content[0].input");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})"),
            "messages[0].content[0].tool_use_id");
  // A last assistant message (a prefill) would not be continued: refused.
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": "The answer is"}]})"),
            "messages[1]");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "system": [{"type": "image"}], )" + user + "}"), "system[0].type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "tools": [{"name": "f"}], "tool_choice": {"type": "tool",
      "name": "g"}})"),
            "tool_choice.name");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "tool_choice": {"type": "any"}})"), "tool_choice");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "tools": [{"name": "f"}], "tool_choice": {"type": "some"}})"),
            "tool_choice.type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "tools": [{"type": "web_search_20250305", "name": "w"}]})"),
            "tools[0].type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "tools": [{"description": "no name"}]})"), "tools[0].name");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "thinking": {"type": "enabled"}})"),
            "thinking.budget_tokens");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "thinking": {"type": "on"}})"), "thinking.type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "temperature": 1.5})"), "temperature");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "stop_sequences": [1]})"), "stop_sequences");
  EXPECT_EQ(refused(R"({"max_tokens": 5, )" + user + R"(, "mcp_servers": [{"url": "x"}]})"), "mcp_servers");
}

// A delta of the chat service (designated initializers would leave fields out, which -Wextra refuses).
ChatDelta delta(std::string reasoning, std::string content, std::vector<ToolCallDelta> calls = {}) {
  ChatDelta d;
  d.reasoning = std::move(reasoning);
  d.content = std::move(content);
  d.tool_call_deltas = std::move(calls);
  return d;
}

CompletionResult result(std::string finish) {
  CompletionResult r;
  r.reasoning = "Think.";
  r.content = "Hi.";
  r.tool_calls = {{"call_0123", "get_weather", R"({"city": "Oslo", "days": [1, 2]})"}};
  r.finish_reason = std::move(finish);
  r.usage.prompt_tokens = 100, r.usage.completion_tokens = 20, r.usage.cached_tokens = 60, r.usage.reasoning_tokens = 5;
  return r;
}

TEST(AnthropicWire, TheResponseMessage) {
  const json m = anthropic_message_json(result("tool_calls"), "msg_1", "lily");
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["stop_sequence"], nullptr);
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "Think.");
  EXPECT_TRUE(m["content"][0]["signature"].get<std::string>().starts_with("lily-"));
  EXPECT_EQ(m["content"][1], json::parse(R"({"type": "text", "text": "Hi."})"));
  EXPECT_EQ(m["content"][2], json::parse(R"({"type": "tool_use", "id": "toolu_0123", "name": "get_weather",
      "input": {"city": "Oslo", "days": [1, 2]}})"));
  EXPECT_EQ(m["usage"], json::parse(R"({"input_tokens": 40, "cache_creation_input_tokens": 0,
      "cache_read_input_tokens": 60, "output_tokens": 20})"));
  EXPECT_EQ(anthropic_stop_reason(result("length")), "max_tokens");
  EXPECT_EQ(anthropic_stop_reason(result("stop")), "end_turn");
  CompletionResult stopped = result("stop");
  stopped.stop_sequence = "END";
  EXPECT_EQ(anthropic_stop_reason(stopped), "stop_sequence");
  EXPECT_EQ(anthropic_message_json(stopped, "m", "lily")["stop_sequence"], "END");
}

TEST(AnthropicWire, TheEventsComeInAnthropicsOrder) {
  AnthropicEvents events("msg_1", "lily", 100);
  std::vector<json> all = events.opening();
  auto add = [&](const ChatDelta& d) {
    for (json& e : events.on_delta(d)) all.push_back(std::move(e));
  };
  add(delta("Th", ""));
  add(delta("ink.", ""));
  add(delta("", "Hi."));
  add(delta("", "", {{0, "call_01", "get_weather", R"({"city": )"}}));
  // The end of the call and text after it in one delta: the call's piece goes first.
  add(delta("", "More.", {{0, "", "", R"("Oslo", "days": [1, 2]})"}}));
  for (json& e : events.closing(result("tool_calls"))) all.push_back(std::move(e));

  std::vector<std::string> types;
  std::string partial_json;
  for (const json& e : all) {
    std::string type = e["type"];
    if (type == "content_block_start") type += ":" + e["content_block"]["type"].get<std::string>();
    if (type == "content_block_delta") {
      type += ":" + e["delta"]["type"].get<std::string>();
      if (e["delta"]["type"] == "input_json_delta") {
        EXPECT_EQ(e["index"], 2);
        partial_json += e["delta"]["partial_json"];
      }
    }
    types.push_back(type);
  }
  const std::vector<std::string> expected = {"message_start",
                                             "ping",
                                             "content_block_start:thinking",
                                             "content_block_delta:thinking_delta",
                                             "content_block_delta:thinking_delta",
                                             "content_block_delta:signature_delta",
                                             "content_block_stop",
                                             "content_block_start:text",
                                             "content_block_delta:text_delta",
                                             "content_block_stop",
                                             "content_block_start:tool_use",
                                             "content_block_delta:input_json_delta",
                                             "content_block_delta:input_json_delta",
                                             "content_block_stop",
                                             "content_block_start:text",
                                             "content_block_delta:text_delta",
                                             "content_block_stop",
                                             "message_delta",
                                             "message_stop"};
  EXPECT_EQ(types, expected);
  EXPECT_EQ(partial_json, R"({"city": "Oslo", "days": [1, 2]})");
  EXPECT_EQ(all[10]["content_block"]["id"], "toolu_01");
  EXPECT_EQ(all[0]["message"]["usage"]["input_tokens"], 100);
  EXPECT_EQ(all[17]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(all[17]["usage"]["cache_read_input_tokens"], 60);
}

TEST(AnthropicWire, ErrorsInAnthropicsShape) {
  EXPECT_EQ(anthropic_error_json(ApiError(400, "bad")),
            json::parse(R"({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})"));
  EXPECT_EQ(anthropic_error_type(401), "authentication_error");
  EXPECT_EQ(anthropic_error_type(404), "not_found_error");
  EXPECT_EQ(anthropic_error_type(503), "overloaded_error");
  EXPECT_EQ(anthropic_error_type(500), "api_error");
  EXPECT_EQ(error_json_for_path(ApiError(401, "k"), "/v1/messages/count_tokens")["error"]["type"],
            "authentication_error");
  EXPECT_TRUE(error_json_for_path(ApiError(401, "k"), "/v1/messagesx")["error"].contains("code"));  // OpenAI's
}

}  // namespace
}  // namespace lily::server
