// test_chat_template.cpp: the native chat template against jinja2's renderings
// (tests/fixtures/chat/templates/cases.json, written by tools/make_template_fixtures.py), the
// Python-style formatting it depends on, and `lily render`.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "chat/chat_template.h"
#include "chat/python_format.h"

namespace lily {
namespace {

// ---------------------------------------------------------------------------------------------
// Readable diffs
// ---------------------------------------------------------------------------------------------

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (true) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      lines.push_back(text.substr(start));
      return lines;
    }
    lines.push_back(text.substr(start, end - start + 1));
    start = end + 1;
  }
}

std::string visible(const std::string& line) {
  std::string out;
  for (char c : line) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\x{:02x}", c);
    else out += c;
  }
  return out;
}

// The first differing line, with two lines of context on each side.
std::string line_diff(const std::string& expected, const std::string& actual) {
  if (expected == actual) return "";
  auto want = split_lines(expected);
  auto got = split_lines(actual);
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  std::ostringstream out;
  out << "first difference at line " << i + 1 << " (expected " << expected.size() << " bytes, got " << actual.size()
      << ")\n";
  size_t from = i >= 2 ? i - 2 : 0;
  for (size_t k = from; k < i; ++k) out << "    " << visible(want[k]) << "\n";
  for (size_t k = i; k < std::min(want.size(), i + 3); ++k) out << "  - " << visible(want[k]) << "\n";
  for (size_t k = i; k < std::min(got.size(), i + 3); ++k) out << "  + " << visible(got[k]) << "\n";
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// Golden cases
// ---------------------------------------------------------------------------------------------

json load_cases() {
  std::ifstream in(std::string(LILY_FIXTURES_DIR) + "/chat/templates/cases.json");
  if (!in) return json::array();
  return json::parse(in);
}

const json& cases() {
  static const json all = load_cases();
  return all;
}

// render_chat_request without lily's refusals: the template alone, as jinja2 renders it.
std::string render_as_template(const json& request) {
  ChatTemplateOptions options = chat_template_options(request);
  options.lily_refusals = false;
  static const json kNull;
  auto field = [&](const char* key) -> const json& { return request.contains(key) ? request[key] : kNull; };
  return render_chat_template(field("messages"), field("tools"), options);
}

TEST(chat_template, fixture_corpus_is_large) {
  ASSERT_GE(cases().size(), 40u) << "tests/fixtures/chat/templates/cases.json missing or too small";
}

TEST(chat_template, every_fixture_case_matches_jinja2) {
  size_t matched = 0;
  for (const json& c : cases()) {
    const std::string name = c["name"];
    std::string rendered;
    std::string error;
    try {
      rendered = render_as_template(c["request"]);
    } catch (const TemplateError& e) {
      error = e.what();
    }
    if (c.contains("expected")) {
      if (!error.empty()) {
        ADD_FAILURE() << name << ": lily refused with \"" << error << "\"";
      } else if (rendered != c["expected"].get<std::string>()) {
        ADD_FAILURE() << name << ": " << line_diff(c["expected"], rendered);
      } else {
        ++matched;
      }
    } else {
      std::string want = c.contains("error") ? c["error"] : c["lily_error"];
      bool exact = c.contains("error");
      if (error.empty()) {
        ADD_FAILURE() << name << ": expected the error \"" << want << "\", lily rendered:\n" << rendered;
      } else if (exact ? error != want : error.find(want) == std::string::npos) {
        ADD_FAILURE() << name << ": expected the error \"" << want << "\", got \"" << error << "\"";
      } else {
        ++matched;
      }
    }
  }
  EXPECT_EQ(matched, cases().size());
  std::printf("%zu of %zu fixture cases match\n", matched, cases().size());
}

// ---------------------------------------------------------------------------------------------
// Direct API
// ---------------------------------------------------------------------------------------------

json parse(const char* text) { return json::parse(text); }

TEST(chat_template, options_select_generation_prompt) {
  json messages = parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(render_chat_template(messages, nullptr, {}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(render_chat_template(messages, nullptr, {.enable_thinking = false}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(render_chat_template(messages, nullptr, {.add_generation_prompt = false}),
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(chat_template, arguments_string_and_object_render_alike) {
  json as_string = parse(R"([{"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{\"x\": 1.0, \"y\": [true]}"}}]}])");
  json as_object = parse(R"([{"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1.0, "y": [true]}}}]}])");
  std::string a = render_chat_template(as_string, nullptr, {.add_generation_prompt = false});
  EXPECT_EQ(a, render_chat_template(as_object, nullptr, {.add_generation_prompt = false}));
  EXPECT_NE(a.find("<parameter=x>\n1.0\n</parameter>\n<parameter=y>\n[true]\n</parameter>"), std::string::npos) << a;
}

void expect_refusal(const char* request, const std::string& message) {
  try {
    std::string prompt = render_chat_request(json::parse(request));
    ADD_FAILURE() << "rendered instead of failing with \"" << message << "\":\n" << prompt;
  } catch (const TemplateError& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(chat_template, malformed_requests_name_the_field) {
  expect_refusal(R"([])", "the request must be a JSON object");
  expect_refusal(R"({"messages": {}})", "messages must be an array");
  expect_refusal(R"({"messages": [3]})", "messages[0] must be an object");
  expect_refusal(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": {}}]})",
                 "messages[1].tool_calls must be an array");
  expect_refusal(R"({"messages": [{"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]})",
                 "messages[1].tool_calls[0].function.arguments is not valid JSON");
  expect_refusal(R"({"messages": [{"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": null}}]}]})",
                 "messages[1].tool_calls[0].function.arguments must be a JSON object or a string holding one");
  expect_refusal(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]})",
                 "messages[0].content[0].text must be a string");
  expect_refusal(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": 1}})",
                 "chat_template_kwargs.enable_thinking must be a boolean");
  expect_refusal(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})",
                 "chat_template_kwargs must be an object");
}

// Issue 17 (8): an image part was rendered as image tokens with nothing behind them and the
// request answered 200; audio parts got "Unexpected item type in content.".
TEST(chat_template, regression_media_inputs_are_refused_17) {
  expect_refusal(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})",
                 "lily has no vision encoder: image inputs are refused (messages[0].content[1] is an image)");
  expect_refusal(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"},
                    {"role": "tool", "content": [{"type": "image", "image": "i"}]}]})",
                 "lily has no vision encoder: image inputs are refused (messages[2].content[0] is an image)");
  expect_refusal(R"({"messages": [{"role": "user", "content": [{"type": "video", "video": "v"}]}]})",
                 "lily has no vision encoder: video inputs are refused (messages[0].content[0] is a video)");
  expect_refusal(R"({"messages": [{"role": "user", "content": [{"type": "input_audio",
                    "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]})",
                 "lily has no audio encoder: audio inputs are refused (messages[0].content[0] is audio)");
  // The template alone still renders the placeholders (lily render --template-only, the corpus).
  const json messages = parse(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}])");
  EXPECT_EQ(render_chat_template(messages, nullptr, {.add_generation_prompt = false, .lily_refusals = false}),
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n");
}

// Issue 17 (12): a lone message with an unknown role was answered "No user query found in
// messages.", which names neither the message nor the role.
TEST(chat_template, regression_unknown_role_is_named_17) {
  expect_refusal(R"({"messages": [{"role": "narrator", "content": "once upon a time"}]})",
                 "messages[0].role \"narrator\" is not a role lily knows (system, developer, user, assistant, tool)");
  expect_refusal(R"({"messages": [{"role": "user", "content": "x"}, {"role": "User", "content": "y"}]})",
                 "messages[1].role \"User\" is not a role lily knows (system, developer, user, assistant, tool)");
  // Known roles still render, developer as system.
  EXPECT_EQ(render_chat_request(parse(R"({"messages": [{"role": "developer", "content": "d"},
                                {"role": "user", "content": "u"}], "add_generation_prompt": false})")),
            "<|im_start|>system\nd<|im_end|>\n<|im_start|>user\nu<|im_end|>\n");
}

std::string nested(int levels, const std::string& inner = "1") {
  return std::string(size_t(levels), '[') + inner + std::string(size_t(levels), ']');
}

// Issue 17 (1): JSON nested ~25,000 levels in tools[].function.parameters or in tool-call
// arguments overflowed the stack in the recursive Python-style dumps (SIGSEGV on a worker).
TEST(chat_template, regression_deep_json_is_refused_not_recursed_17) {
  const std::string user = R"({"role": "user", "content": "x"})";
  const std::string deep_tools = R"({"messages": [)" + user +
                                 R"(], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"p": )" +
                                 nested(25000) + "}}}]}";
  // json::parse of the test itself is iterative; the value is then destroyed iteratively too.
  expect_refusal(deep_tools.c_str(), "tools nest JSON deeper than 128 levels");
  const std::string deep_message = R"({"messages": [{"role": "user", "content": "x", "extra": )" + nested(25000) +
                                   "}]}";
  expect_refusal(deep_message.c_str(), "messages nest JSON deeper than 128 levels");
  // Arguments as a string are parsed by the template's pre-processing: bounded there.
  json request = parse(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
                          "tool_calls": [{"function": {"name": "f", "arguments": ""}}]}]})");
  request["messages"][1]["tool_calls"][0]["function"]["arguments"] = R"({"a": )" + nested(25000) + "}";
  expect_refusal(request.dump().c_str(),
                 "messages[1].tool_calls[0].function.arguments nests JSON deeper than 128 levels");
  // 126 levels inside the object (127 with it) is within the bound and renders.
  request["messages"][1]["tool_calls"][0]["function"]["arguments"] = R"({"a": )" + nested(126) + "}";
  EXPECT_NE(render_chat_request(request).find("<parameter=a>\n" + nested(126) + "\n</parameter>"), std::string::npos);
}

TEST(chat_template, template_errors_are_lily_errors) {
  // The server catches lily::Error subclasses; TemplateError must be one.
  try {
    render_chat_template(json::array(), nullptr, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "No messages provided.");
  }
}

// ---------------------------------------------------------------------------------------------
// Python formatting
// ---------------------------------------------------------------------------------------------

TEST(chat_python_format, float_repr_matches_python) {
  struct Case {
    double value;
    const char* repr;
  };
  const Case table[] = {
      {1.0, "1.0"},
      {0.1, "0.1"},
      {1e-05, "1e-05"},
      {0.0001, "0.0001"},
      {0.00012, "0.00012"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {9999999999999998.0, "9999999999999998.0"},
      {123456789.125, "123456789.125"},
      {3.141592653589793, "3.141592653589793"},
      {-2.5e-10, "-2.5e-10"},
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {1e100, "1e+100"},
      {1.5e16, "1.5e+16"},
      {100.0, "100.0"},
      {0.3, "0.3"},
      {2.0 / 3.0, "0.6666666666666666"},
      {1e22, "1e+22"},
      {123e-20, "1.23e-18"},
  };
  for (const Case& c : table) EXPECT_EQ(python::float_repr(c.value), c.repr) << c.repr;
  EXPECT_EQ(python::float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python::float_repr(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(python::float_repr(std::nan("")), "nan");
}

TEST(chat_python_format, json_dumps_matches_python) {
  json value = parse(R"({"z": 1, "a": [1, 2.5, "ü", null, true, false], "n": {"k": {}, "l": []},
                        "big": 18446744073709551615, "neg": -9223372036854775808, "f": 1E5})");
  EXPECT_EQ(python::json_dumps(value), R"({"z": 1, "a": [1, 2.5, "ü", null, true, false], "n": {"k": {}, "l": []}, )"
                                       R"("big": 18446744073709551615, "neg": -9223372036854775808, "f": 100000.0})");
  EXPECT_EQ(python::json_dumps(json("tab\t nl\n cr\r bs\\ q\" \x01 \x1f \x7f é 🚀 \u2028")),
            "\"tab\\t nl\\n cr\\r bs\\\\ q\\\" \\u0001 \\u001f \x7f é 🚀 \u2028\"");
  EXPECT_EQ(python::json_dumps(json("\b\f/")), "\"\\b\\f/\"");
  EXPECT_EQ(python::json_dumps(json(std::nan(""))), "NaN");
  EXPECT_EQ(python::json_dumps(json(-std::numeric_limits<double>::infinity())), "-Infinity");
}

TEST(chat_python_format, str_of_scalars_matches_python) {
  EXPECT_EQ(python::str(json(true)), "True");
  EXPECT_EQ(python::str(json(false)), "False");
  EXPECT_EQ(python::str(json(nullptr)), "None");
  EXPECT_EQ(python::str(json(42)), "42");
  EXPECT_EQ(python::str(json(1e-05)), "1e-05");
  EXPECT_EQ(python::str(json(2.0)), "2.0");
  EXPECT_EQ(python::str(json("raw \"text\"")), "raw \"text\"");
  EXPECT_THROW(python::str(json::array()), Error);
}

TEST(chat_python_format, strip_uses_python_whitespace) {
  EXPECT_EQ(python::strip(" \t\n\r\v\f x y \n"), "x y");
  EXPECT_EQ(python::strip("\u3000\u00a0\u2003\u2028\x1c x \u0085\u205f"), "x");
  EXPECT_EQ(python::strip("\u200bx\u200b"), "\u200bx\u200b");  // zero-width space is not whitespace
  EXPECT_EQ(python::strip("é\u00a0"), "é");
  EXPECT_EQ(python::strip("   "), "");
  EXPECT_EQ(python::strip(""), "");
  EXPECT_EQ(python::lstrip("\n\nab\n", "\n"), "ab\n");
  EXPECT_EQ(python::rstrip("\nab\n\n", "\n"), "\nab");
  EXPECT_EQ(python::rstrip("\n\n", "\n"), "");
}

// ---------------------------------------------------------------------------------------------
// lily render
// ---------------------------------------------------------------------------------------------

struct RunResult {
  int exit_code;
  std::string output;
};

RunResult run_render(const std::string& request, bool capture_stderr) {
  // CTest runs tests in parallel: every call gets its own request file.
  static int calls = 0;
  std::string path = ::testing::TempDir() + "/render_request_" + std::to_string(::getpid()) + "_" +
                     std::to_string(calls++) + ".json";
  std::ofstream(path) << request;
  std::string command = std::string(LILY_BINARY) + " render < " + path + (capture_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, ""};
  std::string output;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(chat_template, cli_render_prints_the_prompt) {
  const json* roundtrip = nullptr;
  for (const json& c : cases()) {
    if (c["name"] == "tool_call_roundtrip") roundtrip = &c;
  }
  ASSERT_NE(roundtrip, nullptr);
  RunResult result = run_render((*roundtrip)["request"].dump(), false);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.output, (*roundtrip)["expected"].get<std::string>())
      << line_diff((*roundtrip)["expected"], result.output);
}

TEST(chat_template, cli_render_reports_the_template_error) {
  RunResult result = run_render(R"({"messages": [{"role": "system", "content": "s"}]})", true);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("No user query found in messages."), std::string::npos) << result.output;
  result = run_render("not json", true);
  EXPECT_EQ(result.exit_code, 1);
}

}  // namespace
}  // namespace lily
