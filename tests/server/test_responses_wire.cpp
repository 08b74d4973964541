// OpenAI's Responses API over the chat service (src/server/responses_wire.h): input items become
// the chat messages the Qwen template renders, bad requests are 400s naming the field, and the
// response object and its event stream are built from what the chat service gives.
#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "server/responses_wire.h"

namespace lily::server {
namespace {

ResponsesRequest read(const std::string& body) { return read_responses_request(json::parse(body), SamplingParams{}); }

std::string refused(const std::string& body) {
  try {
    read(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    return e.param;
  }
  return "accepted";
}

TEST(ResponsesWire, InputItemsBecomeTheTemplatesMessages) {
  const ResponsesRequest r = read(R"({
    "model": "gpt-x", "instructions": "Be brief.",
    "input": [
      {"role": "developer", "content": "Use tools."},
      {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Oslo?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
       "content": [{"type": "reasoning_text", "text": "Call it."}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "3 C"},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Again."}]},
      {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "4 C"}]}],
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather", "strict": true,
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "max_output_tokens": 64, "temperature": 0.3, "top_p": 0.8, "reasoning": {"effort": "low"},
    "text": {"format": {"type": "text"}}, "store": true, "stream": true, "metadata": {"k": "v"}})");
  const json expected = json::parse(R"([
    {"role": "system", "content": "Be brief.\n\nUse tools."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "Call it.", "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3 C"},
    {"role": "assistant", "content": "", "reasoning_content": "Again.", "tool_calls": [
      {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_2", "content": "4 C"}])");
  EXPECT_EQ(r.chat.messages, expected) << r.chat.messages.dump(1);
  EXPECT_EQ(r.chat.tools, json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])"));
  EXPECT_EQ(r.chat.tool_choice.mode, ToolChoice::Mode::function);
  EXPECT_EQ(r.chat.tool_choice.function, "get_weather");
  EXPECT_EQ(r.chat.options.max_tokens, 64);
  EXPECT_FLOAT_EQ(r.chat.options.sampling.temperature, 0.3f);
  EXPECT_TRUE(r.chat.template_options.enable_thinking);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.settings["store"], false);
  EXPECT_EQ(r.settings["reasoning"]["effort"], "low");
  EXPECT_EQ(r.settings["metadata"]["k"], "v");
  const std::string prompt = render_chat_template(r.chat.messages, r.chat.tools, r.chat.template_options);
  EXPECT_NE(prompt.find("<tool_response>\n3 C\n</tool_response>"), std::string::npos) << prompt;
}

TEST(ResponsesWire, AStringInputAndTheThinkingSwitch) {
  const ResponsesRequest r = read(R"({"input": "Hi", "reasoning": {"effort": "none"}})");
  EXPECT_EQ(r.chat.messages, json::parse(R"([{"role": "user", "content": "Hi"}])"));
  EXPECT_FALSE(r.chat.template_options.enable_thinking);
  EXPECT_FALSE(r.chat.options.max_tokens.has_value());
  EXPECT_EQ(r.chat.tool_choice.mode, ToolChoice::Mode::automatic);
  EXPECT_TRUE(read(R"({"input": "Hi"})").chat.template_options.enable_thinking);
  EXPECT_EQ(read(R"({"input": "Hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"})")
                .chat.tool_choice.mode,
            ToolChoice::Mode::required);
}

// text.format is chat's response_format with the schema beside the type.
TEST(ResponsesWire, TextFormatBecomesTheResponseFormat) {
  EXPECT_EQ(read(R"({"input": "x"})").chat.response_format.type, ResponseFormat::Type::text);
  EXPECT_EQ(read(R"({"input": "x", "text": {"format": {"type": "text"}}})").chat.response_format.type,
            ResponseFormat::Type::text);
  EXPECT_EQ(read(R"({"input": "x", "text": {"format": {"type": "json_object"}}})").chat.response_format.type,
            ResponseFormat::Type::json_object);
  const ResponsesRequest r = read(R"({"input": "x", "parallel_tool_calls": false, "text": {"format":
      {"type": "json_schema", "name": "s", "strict": true, "schema": {"type": "object", "properties": {"a": {"enum": [1]}}}}}})");
  EXPECT_EQ(r.chat.response_format.type, ResponseFormat::Type::json_schema);
  EXPECT_EQ(r.chat.response_format.schema, json::parse(R"({"type": "object", "properties": {"a": {"enum": [1]}}})"));
  EXPECT_FALSE(r.chat.parallel_tool_calls);
  EXPECT_EQ(r.settings["text"]["format"]["name"], "s");  // echoed in the response
}

TEST(ResponsesWire, BadRequestsAre400sNamingTheField) {
  EXPECT_EQ(refused(R"({"model": "m"})"), "input");
  EXPECT_EQ(refused(R"({"input": 3})"), "input");
  EXPECT_EQ(refused(R"({"input": "x", "previous_response_id": "resp_1"})"), "previous_response_id");
  EXPECT_EQ(refused(R"({"input": "x", "conversation": "c"})"), "conversation");
  EXPECT_EQ(refused(R"({"input": "x", "background": true})"), "background");
  EXPECT_EQ(refused(R"({"input": "x", "text": {"format": {"type": "xml"}}})"), "text.format.type");
  EXPECT_EQ(refused(R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": 3}}})"),
            "text.format.schema");
  EXPECT_EQ(refused(R"({"input": "x", "text": {"format": {"type": "json_schema", "strict": "yes"}}})"),
            "text.format.strict");
  EXPECT_EQ(refused(R"({"input": "x", "text": {"format": 1}})"), "text.format");
  EXPECT_EQ(refused(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})"),
            "input[0].content[0].type");
  EXPECT_EQ(refused(R"({"input": [{"type": "item_reference", "id": "msg_1"}]})"), "input[0].type");
  EXPECT_EQ(refused(R"({"input": [{"type": "web_search_call", "id": "ws_1"}]})"), "input[0].type");
  EXPECT_EQ(refused(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]})"), "input[0].arguments");
  EXPECT_EQ(refused(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})"), "input[0].output");
  EXPECT_EQ(refused(R"({"input": [{"role": "tool", "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(refused(R"({"input": "x", "tools": [{"type": "web_search"}]})"), "tools[0].type");
  EXPECT_EQ(refused(R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice":
      {"type": "function", "name": "g"}})"),
            "tool_choice.name");
  EXPECT_EQ(refused(R"({"input": "x", "tool_choice": "sometimes"})"), "tool_choice");
  EXPECT_EQ(refused(R"({"input": "x", "reasoning": {"effort": "max"}})"), "reasoning.effort");
  EXPECT_EQ(refused(R"({"input": "x", "max_output_tokens": 0})"), "max_output_tokens");
  EXPECT_EQ(refused(R"({"input": "x", "temperature": 3})"), "temperature");
  EXPECT_EQ(refused(R"({"input": "x", "top_logprobs": 2})"), "top_logprobs");
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
  r.tool_calls = {{"call_0123", "get_weather", R"({"city": "Oslo"})"}};
  r.finish_reason = std::move(finish);
  r.usage.prompt_tokens = 100, r.usage.completion_tokens = 20, r.usage.cached_tokens = 60, r.usage.reasoning_tokens = 5;
  return r;
}

TEST(ResponsesWire, TheResponseObject) {
  const ResponseHead head{"resp_1", "lily", 1700000000, read(R"({"input": "x"})").settings};
  const CompletionResult r = result("tool_calls");
  const json o = response_json(head, response_status(r), response_output_json(r), responses_usage_json(r.usage));
  EXPECT_EQ(o["object"], "response");
  EXPECT_EQ(o["status"], "completed");
  EXPECT_EQ(o["incomplete_details"], nullptr);
  EXPECT_EQ(o["created_at"], 1700000000);
  ASSERT_EQ(o["output"].size(), 3u);
  EXPECT_EQ(o["output"][0]["type"], "reasoning");
  EXPECT_EQ(o["output"][0]["content"][0], json::parse(R"({"type": "reasoning_text", "text": "Think."})"));
  EXPECT_EQ(o["output"][1]["type"], "message");
  EXPECT_EQ(o["output"][1]["content"][0]["type"], "output_text");
  EXPECT_EQ(o["output"][1]["content"][0]["text"], "Hi.");
  EXPECT_EQ(o["output"][2]["call_id"], "call_0123");
  EXPECT_EQ(o["output"][2]["id"], "fc_0123");
  EXPECT_EQ(o["output"][2]["arguments"], R"({"city": "Oslo"})");
  EXPECT_EQ(o["usage"], json::parse(R"({"input_tokens": 100, "input_tokens_details": {"cached_tokens": 60},
      "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 5}, "total_tokens": 120})"));
  EXPECT_EQ(o["store"], false);
  CompletionResult speculated = result("stop");  // issue 37: the drafts, as chat's usage has them
  speculated.usage.predictions = PredictionTokens{12, 3};
  EXPECT_EQ(
      responses_usage_json(speculated.usage)["output_tokens_details"],
      json::parse(R"({"reasoning_tokens": 5, "accepted_prediction_tokens": 12, "rejected_prediction_tokens": 3})"));
  EXPECT_EQ(response_status(result("length")), "incomplete");
  EXPECT_EQ(response_json(head, "incomplete", json::array(), nullptr)["incomplete_details"]["reason"],
            "max_output_tokens");
}

TEST(ResponsesWire, TheEventsInOrderWithSequenceNumbers) {
  ResponsesEvents events(ResponseHead{"resp_1", "lily", 1700000000, read(R"({"input": "x"})").settings});
  std::vector<json> all = events.opening();
  auto add = [&](const ChatDelta& d) {
    for (json& e : events.on_delta(d)) all.push_back(std::move(e));
  };
  add(delta("Think.", ""));
  add(delta("", "H"));
  add(delta("", "i."));
  add(delta("", "", {{0, "call_0123", "get_weather", R"({"city": )"}}));
  add(delta("", "", {{0, "", "", R"("Oslo"})"}}));
  for (json& e : events.closing(result("tool_calls"))) all.push_back(std::move(e));

  std::vector<std::string> types;
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i]["sequence_number"], i);
    types.push_back(all[i]["type"]);
  }
  const std::vector<std::string> expected = {"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done",
                                             "response.completed"};
  EXPECT_EQ(types, expected);
  EXPECT_EQ(all[0]["response"]["status"], "in_progress");
  EXPECT_EQ(all[12]["text"], "Hi.");
  EXPECT_EQ(all[12]["output_index"], 1);
  EXPECT_EQ(all[18]["arguments"], R"({"city": "Oslo"})");
  const json& done = all.back()["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "Hi.");
  EXPECT_EQ(done["output"][1]["id"], all[10]["item_id"]);
  EXPECT_EQ(done["output"][2], json::parse(R"({"type": "function_call", "id": "fc_0123", "call_id": "call_0123",
      "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}", "status": "completed"})"));
  EXPECT_EQ(done["usage"]["output_tokens_details"]["reasoning_tokens"], 5);
  EXPECT_EQ(events.error_event(ApiError(400, "bad", "x"))["sequence_number"], all.size());
}

}  // namespace
}  // namespace lily::server
