// Wire validation: every typed field reader refuses the wrong type with a 400 naming the field.
#include <gtest/gtest.h>

#include "server/errors.h"
#include "server/wire.h"

namespace lily::server {
namespace {

// The param of the ApiError that `fn` throws ("" if none).
template <typename Fn>
std::string refused_param(Fn fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param;
  }
  return "";
}

TEST(Wire, MalformedBodies) {
  EXPECT_EQ(refused_param([] { parse_body("{"); }), "");
  EXPECT_THROW(parse_body("{"), ApiError);
  EXPECT_THROW(parse_body("[]"), ApiError);
  EXPECT_THROW(parse_body(""), ApiError);
  EXPECT_TRUE(parse_body("{\"a\": 1}").is_object());
}

// The message of the 400 that parse_body(body) answers ("" if it accepts the body).
std::string refusal(const std::string& body) {
  try {
    parse_body(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    return e.what();
  }
  return "";
}

std::string nested(int levels) { return std::string(size_t(levels), '[') + std::string(size_t(levels), ']'); }

// Issue 17 (1): 25,000 levels of nesting in tools[].function.parameters (50 KB) parsed fine and
// then overflowed a worker's stack in the template's recursive dumps. Refused while parsing.
TEST(Wire, regression_deep_nesting_is_a_400_17) {
  const std::string deep = R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
      "function": {"name": "f", "parameters": {"type": "object", "properties": {"p": )" +
                           nested(25000) + "}}}}]}";
  EXPECT_EQ(refusal(deep), "the request body nests JSON deeper than 128 levels");
  EXPECT_EQ(refusal(nested(129)), "the request body nests JSON deeper than 128 levels");
  // 128 containers in all is the bound, objects and arrays alike.
  EXPECT_EQ(refusal(R"({"a": )" + nested(127) + "}"), "");
  std::string objects;
  for (int i = 0; i < 128; ++i) objects += R"({"k": )";
  objects += "1" + std::string(128, '}');
  EXPECT_EQ(refusal(objects), "");
  EXPECT_EQ(refusal(R"({"k": )" + objects + "}"), "the request body nests JSON deeper than 128 levels");
  // Brackets inside strings are text, escaped quotes included.
  EXPECT_EQ(refusal(R"({"a": ")" + std::string(1000, '[') + R"(\"[[[", "b": [1]})"), "");
  // Too deep and invalid too: refused as too deep (the scan comes first); shallow and invalid:
  // named as invalid.
  EXPECT_EQ(refusal(R"({"a": [1,, )" + nested(1000) + "]}"), "the request body nests JSON deeper than 128 levels");
  EXPECT_NE(refusal(R"({"a": [1,, 2]})").find("not valid JSON"), std::string::npos);
}

// Issue 17 (9): a number beyond a double (1e309) anywhere in the body was a 500.
TEST(Wire, regression_numbers_out_of_range_are_a_400_17) {
  for (const char* body : {R"({"temperature": 1e309})", R"({"messages": [{"role": "user", "content": "x",
                           "extra": [1, -1e400]}]})",
                           R"({"tools": [{"function": {"parameters": {"maximum": 1E999}}}]})"}) {
    const std::string message = refusal(body);
    EXPECT_NE(message.find("number out of range"), std::string::npos) << body << ": " << message;
  }
  // Integers beyond 64 bits are doubles to nlohmann: in range they parse, beyond 1e308 not.
  EXPECT_EQ(refusal(R"({"n": 123456789012345678901234567890})"), "");
  EXPECT_NE(refusal(R"({"n": 1)" + std::string(400, '0') + "}").find("number out of range"), std::string::npos);
  EXPECT_EQ(refusal(R"({"t": 1e308, "u": -2.2e-308, "v": 5e-324})"), "");
}

// Issue 17 (12): best_of on chat was accepted and ignored. One completion is all lily makes.
TEST(Wire, regression_best_of_above_one_is_refused_17) {
  const SamplingParams defaults;
  json two{{"best_of", 2}};
  EXPECT_EQ(refused_param([&] { read_sampling(Fields(two), defaults); }), "best_of");
  json zero{{"best_of", 0}};
  EXPECT_EQ(refused_param([&] { read_sampling(Fields(zero), defaults); }), "best_of");
  json wrong{{"best_of", "3"}};
  EXPECT_EQ(refused_param([&] { read_sampling(Fields(wrong), defaults); }), "best_of");
  json one{{"best_of", 1}}, null{{"best_of", nullptr}};
  EXPECT_NO_THROW(read_sampling(Fields(one), defaults));
  EXPECT_NO_THROW(read_sampling(Fields(null), defaults));
}

TEST(Wire, SamplingFieldsOfTheWrongTypeNameTheField) {
  const SamplingParams defaults;
  for (const char* field : {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                            "repetition_penalty", "seed"}) {
    json body{{field, "text"}};
    EXPECT_EQ(refused_param([&] { read_sampling(Fields(body), defaults); }), field);
  }
  json out_of_range{{"temperature", 2.5}};
  EXPECT_EQ(refused_param([&] { read_sampling(Fields(out_of_range), defaults); }), "temperature");
}

TEST(Wire, SamplingFieldsOverrideTheDefaults) {
  SamplingParams defaults;
  defaults.temperature = 0.7f;
  defaults.top_k = 20;
  json body{{"temperature", 0}, {"top_p", 0.5}, {"top_k", -1}, {"seed", 42}, {"min_p", nullptr}};
  SamplingParams s = read_sampling(Fields(body), defaults);
  EXPECT_EQ(s.temperature, 0.0f);
  EXPECT_EQ(s.top_p, 0.5f);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_EQ(s.seed, 42u);
  EXPECT_EQ(s.min_p, defaults.min_p);  // null = not given
}

TEST(Wire, IntegersAcceptIntegralNumbersOnly) {
  json body{{"a", 5.0}, {"b", 5.5}, {"c", "5"}, {"d", true}};
  Fields f(body);
  EXPECT_EQ(f.integer("a", 0, 10), 5);
  EXPECT_EQ(refused_param([&] { f.integer("b", 0, 10); }), "b");
  EXPECT_EQ(refused_param([&] { f.integer("c", 0, 10); }), "c");
  EXPECT_EQ(refused_param([&] { f.integer("d", 0, 10); }), "d");
  EXPECT_EQ(refused_param([&] { f.integer("a", 6, 10); }), "a");
  EXPECT_FALSE(f.integer("missing", 0, 10));
}

TEST(Wire, StopIsAStringOrAListOfStrings) {
  json one{{"stop", "x"}}, list{{"stop", {"a", "b"}}}, bad{{"stop", {"a", 1}}}, many{{"stop", {"1", "2", "3"}}};
  EXPECT_EQ(Fields(one).stop_strings(4), (std::vector<std::string>{"x"}));
  EXPECT_EQ(Fields(list).stop_strings(4), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(refused_param([&] { Fields(bad).stop_strings(4); }), "stop");
  EXPECT_EQ(refused_param([&] { Fields(many).stop_strings(2); }), "stop");
}

TEST(Wire, StreamOptionsNeedStream) {
  json body{{"stream_options", {{"include_usage", true}}}};
  EXPECT_EQ(refused_param([&] { read_include_usage(Fields(body), false); }), "stream_options");
  EXPECT_TRUE(read_include_usage(Fields(body), true));
  json bad{{"stream_options", {{"include_usage", 1}}}};
  EXPECT_EQ(refused_param([&] { read_include_usage(Fields(bad), true); }), "stream_options.include_usage");
}

// The request helpers the Anthropic and Responses readers share (wire.h).
TEST(Wire, FunctionToolsAreCheckedAndConverted) {
  const json tool = json::parse(R"({"name": "f", "description": "d", "input_schema": {"type": "object"}})");
  const json chat = function_tool(tool, "tools[3]", "input_schema");
  EXPECT_EQ(chat, json::parse(R"({"type": "function", "function": {"name": "f", "description": "d",
      "parameters": {"type": "object"}}})"));
  // Absent (or null) fields are left out; the schema is read under the key the API names.
  EXPECT_EQ(function_tool(json::parse(R"({"name": "g", "description": null})"), "tools[0]", "parameters"),
            json::parse(R"({"type": "function", "function": {"name": "g"}})"));
  EXPECT_FALSE(function_tool(tool, "tools[0]", "parameters")["function"].contains("parameters"));
  auto refused = [](const char* body) {
    return refused_param([&] { function_tool(json::parse(body), "tools[3]", "input_schema"); });
  };
  EXPECT_EQ(refused(R"({"description": "no name"})"), "tools[3].name");
  EXPECT_EQ(refused(R"({"name": 7})"), "tools[3].name");
  EXPECT_EQ(refused(R"({"name": ""})"), "tools[3].name");
  EXPECT_EQ(refused(R"({"name": "f", "description": ["d"]})"), "tools[3].description");
  EXPECT_EQ(refused(R"({"name": "f", "input_schema": "{}"})"), "tools[3].input_schema");

  const json tools = json::array({chat, function_tool(json::parse(R"({"name": "h"})"), "tools[1]", "x")});
  EXPECT_TRUE(has_function_tool(tools, "f"));
  EXPECT_TRUE(has_function_tool(tools, "h"));
  EXPECT_FALSE(has_function_tool(tools, "g"));
  const ToolChoice choice = named_tool_choice(json::parse(R"({"type": "tool", "name": "h"})"), tools, "tool");
  EXPECT_EQ(choice.mode, ToolChoice::Mode::function);
  EXPECT_EQ(choice.function, "h");
  EXPECT_EQ(refused_param([&] { named_tool_choice(json::parse(R"({"name": "g"})"), tools, "tool"); }),
            "tool_choice.name");
  EXPECT_EQ(refused_param([&] { named_tool_choice(json::parse(R"({"type": "tool"})"), tools, "tool"); }),
            "tool_choice.name");
}

TEST(Wire, JsonSchemaFormatsNameTheirPath) {
  const ResponseFormat format = json_schema_format(
      json::parse(R"({"name": "n", "strict": null, "schema": {"type": "integer"}})"), "text.format");
  EXPECT_EQ(format.type, ResponseFormat::Type::json_schema);
  EXPECT_EQ(format.schema.dump(), R"({"type":"integer"})");
  auto refused = [](const char* spec) {
    return refused_param([&] { json_schema_format(json::parse(spec), "text.format"); });
  };
  EXPECT_EQ(refused(R"({"name": 1})"), "text.format.name");
  EXPECT_EQ(refused(R"({"strict": "yes"})"), "text.format.strict");
  EXPECT_EQ(refused(R"({"schema": []})"), "text.format.schema");
  EXPECT_EQ(refused(R"({"schema": null})"), "");
}

TEST(Wire, ErrorObjectShape) {
  json e = error_json(400, "bad", "temperature", "");
  EXPECT_EQ(e.dump(),
            R"({"error":{"message":"bad","type":"invalid_request_error","param":"temperature","code":null}})");
  EXPECT_EQ(error_json(503, "busy")["error"]["type"], "server_overloaded");
  EXPECT_EQ(error_json(401, "key")["error"]["type"], "authentication_error");
}

// 10 prompt tokens (7 cached), 5 generated (3 of them reasoning).
Usage usage_10_5_7_3() {
  Usage u;
  u.prompt_tokens = 10, u.completion_tokens = 5, u.cached_tokens = 7, u.reasoning_tokens = 3;
  return u;
}

TEST(Wire, UsageShape) {
  json u = usage_json(usage_10_5_7_3());
  EXPECT_EQ(
      u.dump(),
      R"({"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":7},)"
      R"("completion_tokens_details":{"reasoning_tokens":3}})");
}

// Issue 37: a speculative decode's usage has the drafts kept and refused, under OpenAI's
// Predicted Outputs names, zeros included; a plain one's is as above (UsageShape).
TEST(Wire, UsageWithSpeculationCountsTheDrafts) {
  Usage usage = usage_10_5_7_3();
  usage.predictions = PredictionTokens{4, 2};
  EXPECT_EQ(
      usage_json(usage).dump(),
      R"({"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":7},)"
      R"("completion_tokens_details":{"reasoning_tokens":3,"accepted_prediction_tokens":4,)"
      R"("rejected_prediction_tokens":2}})");
  usage.predictions = PredictionTokens{0, 0};  // speculated, nothing drafted (a one-token reply)
  const json details = usage_json(usage)["completion_tokens_details"];
  EXPECT_EQ(details["accepted_prediction_tokens"], 0);
  EXPECT_EQ(details["rejected_prediction_tokens"], 0);
}

}  // namespace
}  // namespace lily::server
