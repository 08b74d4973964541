// test_output_parser.cpp: the streaming reasoning / content / tool-call parser.
//
// Every crafted stream is fed whole, split at every byte position, one byte at a time and in
// random multi-splits; the concatenated outputs must equal the expected (reasoning, content,
// tool calls) each time, every delta must be valid UTF-8, and each call's streamed pieces
// (start with its name, then argument pieces) must add up to the call returned whole.
#include "chat/output_parser.h"

#include "base/error.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

namespace lily {
namespace {

struct Result {
  std::string reasoning;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments_json

  bool operator==(const Result&) const = default;
};

std::string show(const Result& r) {
  auto quote = [](const std::string& t) { return json(t).dump(-1, ' ', false, json::error_handler_t::replace); };
  std::string s = "reasoning=" + quote(r.reasoning) + "\ncontent=" + quote(r.content) + "\ncalls:";
  for (const auto& [name, args] : r.calls) s += "\n  " + name + " " + args;
  return s;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Feeds `pieces` and collects the outputs; `utf8_ok` turns false if a delta is not valid UTF-8,
// `pieces_ok` if the streamed tool-call pieces do not add up to the calls.
Result run(const OutputParserOptions& options, const std::vector<std::string_view>& pieces, bool& utf8_ok,
           bool& pieces_ok) {
  OutputParser parser(options);
  Result result;
  std::vector<std::pair<std::string, std::string>> streamed;  // name, arguments, from the pieces
  auto add = [&](ParserOutput out) {
    utf8_ok = utf8_ok && valid_utf8(out.reasoning) && valid_utf8(out.content);
    result.reasoning += out.reasoning;
    result.content += out.content;
    for (const ToolCallPiece& piece : out.tool_call_pieces) {
      if (!piece.name.empty()) {  // a call starts: the next index
        pieces_ok = pieces_ok && piece.index == streamed.size();
        streamed.emplace_back(piece.name, "");
      }
      if (piece.index >= streamed.size()) {
        pieces_ok = false;
        continue;
      }
      streamed[piece.index].second += piece.arguments;
    }
    for (ParsedToolCall& call : out.tool_calls) result.calls.emplace_back(call.name, call.arguments_json);
  };
  for (std::string_view piece : pieces) add(parser.push(piece));
  add(parser.finish());
  pieces_ok = pieces_ok && streamed == result.calls;
  return result;
}

// The pieces of a split, bytes escaped where they are not printable ASCII.
std::string describe(const std::vector<std::string_view>& pieces) {
  std::string s;
  for (std::string_view piece : pieces) {
    s += '[';
    for (char c : piece) {
      unsigned char b = static_cast<unsigned char>(c);
      s += (b >= 0x20 && b < 0x7F) ? std::string(1, c) : fmt::format("\\x{:02X}", b);
    }
    s += ']';
  }
  return s;
}

// Checks one split; reports at most one failure per call.
bool check_split(const OutputParserOptions& options, const std::vector<std::string_view>& pieces,
                 const Result& expected) {
  bool utf8_ok = true, pieces_ok = true;
  Result got = run(options, pieces, utf8_ok, pieces_ok);
  if (got == expected && utf8_ok && pieces_ok) return true;
  ADD_FAILURE() << "split " << describe(pieces) << "\nexpected:\n"
                << show(expected) << "\ngot:\n"
                << show(got) << (utf8_ok ? "" : "\n(a delta was not valid UTF-8)")
                << (pieces_ok ? "" : "\n(the streamed pieces do not add up to the calls)");
  return false;
}

void check_stream(const std::string& stream, const Result& expected, OutputParserOptions options = {}) {
  std::string_view s = stream;
  if (!check_split(options, {s}, expected)) return;
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    if (!check_split(options, {s.substr(0, cut), s.substr(cut)}, expected)) return;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < s.size(); ++i) bytes.push_back(s.substr(i, 1));
  if (!check_split(options, bytes, expected)) return;
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string_view> pieces;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t n = std::uniform_int_distribution<size_t>(0, 7)(rng);
      n = std::min(n, s.size() - pos);
      pieces.push_back(s.substr(pos, n));
      pos += n;
    }
    if (!check_split(options, pieces, expected)) return;
  }
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"},
    "days": {"type": "integer"},
    "temp": {"type": "number"},
    "metric": {"type": "boolean"},
    "options": {"type": "object"},
    "tags": {"type": "array"},
    "nothing": {"type": "null"},
    "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    "either": {"type": ["integer", "string"]},
    "note": {"type": ["string", "null"]}}}}},
  {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "text": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "get_time"}}
])");

OutputParserOptions with_tools() {
  OutputParserOptions options;
  options.tools = kTools;
  return options;
}

OutputParserOptions thinking_off() {
  OutputParserOptions options = with_tools();
  options.starts_in_reasoning = false;
  return options;
}

const std::string kOsloCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";

// ---- reasoning and content ------------------------------------------------------------------

TEST(output_parser, ReasoningThenContent) {
  check_stream("Let me think.\nAbout it.\n</think>\n\nHello!\nBye.", {"Let me think.\nAbout it.", "Hello!\nBye.", {}});
}

TEST(output_parser, LeadingAndTrailingNewlinesTrimmed) {
  check_stream("\n\nR1\n\n</think>\n\n\nC1\n", {"R1", "C1", {}});
}

TEST(output_parser, LeadingThinkTagDropped) {
  check_stream("<think>\nR1\n</think>\n\nC1", {"R1", "C1", {}});
  check_stream("\n<think>R1</think>C1", {"R1", "C1", {}});
}

TEST(output_parser, MissingThinkEndIsAllReasoning) {
  check_stream("Still thinking about <b>this</b> and < that\n",
               {"Still thinking about <b>this</b> and < that", "", {}});
}

TEST(output_parser, PartialTagAtEndIsReleased) {
  check_stream("Answer </thi", {"Answer </thi", "", {}});
  check_stream("</think>\n\nAnswer <tool_ca", {"", "Answer <tool_ca", {}}, with_tools());
}

TEST(output_parser, EmptyOutputs) {
  check_stream("", {"", "", {}});
  check_stream("</think>", {"", "", {}});
  check_stream("\n\n</think>\n\n", {"", "", {}});
  check_stream("", {"", "", {}}, thinking_off());
}

TEST(output_parser, ThinkingOffIsAllContent) {
  check_stream("\n\nHello </think> <think> world", {"", "Hello </think> <think> world", {}}, thinking_off());
}

TEST(output_parser, WhitespaceInsideTextKept) {
  check_stream("a  b\n\n c\t\n</think>\n\n  x \n\n y", {"a  b\n\n c", "  x \n\n y", {}});
}

TEST(output_parser, UnicodeAtEverySplit) {
  check_stream(
      "Размышляю 🤔 über Ünïcode.\n</think>\n\n答案是 42 🙂\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\n東京 🗼\n</parameter>\n</function>\n</tool_call>",
      {"Размышляю 🤔 über Ünïcode.", "答案是 42 🙂", {{"get_weather", R"({"city": "東京 🗼"})"}}},
      with_tools());
}

// ---- tool calls -----------------------------------------------------------------------------

TEST(output_parser, ContentThenToolCall) {
  check_stream("User wants weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
               "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
               {"User wants weather.", "Let me check.", {{"get_weather", R"({"city": "Oslo", "days": 3})"}}},
               with_tools());
}

TEST(output_parser, ValuesTypedBySchema) {
  std::string stream = "</think>\n\n<tool_call>\n<function=get_weather>\n"
                       "<parameter=city>\nSão Paulo\n</parameter>\n"
                       "<parameter=days>\n7\n</parameter>\n"
                       "<parameter=temp>\n21.5\n</parameter>\n"
                       "<parameter=metric>\nTrue\n</parameter>\n"
                       "<parameter=options>\n{\"units\": \"C\", \"detail\": [1, 2]}\n</parameter>\n"
                       "<parameter=tags>\n['a', 'b']\n</parameter>\n"
                       "<parameter=nothing>\nNone\n</parameter>\n"
                       "<parameter=maybe>\nnull\n</parameter>\n"
                       "<parameter=either>\n12\n</parameter>\n"
                       "<parameter=note>\nnull\n</parameter>\n"
                       "<parameter=extra>\n{\"x\": 1}\n</parameter>\n"
                       "<parameter=extra2>\nhello world\n</parameter>\n"
                       "</function>\n</tool_call>";
  std::string args =
      R"({"city": "São Paulo", "days": 7, "temp": 21.5, "metric": true, "options": {"units": "C", "detail": [1, 2]}, )"
      R"("tags": ["a", "b"], "nothing": null, "maybe": null, "either": 12, "note": null, "extra": {"x": 1}, )"
      R"("extra2": "hello world"})";
  check_stream(stream, {"", "", {{"get_weather", args}}}, with_tools());
}

TEST(output_parser, StringValuesKeepTheirText) {
  // One newline stripped on each side only; a number-looking string stays a string.
  check_stream("</think>\n\n<tool_call>\n<function=write_file>\n<parameter=path>\n42\n</parameter>\n"
               "<parameter=text>\n\n  line1\n\n\tline2 \"q\"  \n\n</parameter>\n</function>\n</tool_call>",
               {"", "", {{"write_file", R"({"path": "42", "text": "\n  line1\n\n\tline2 \"q\"  \n"})"}}}, with_tools());
}

TEST(output_parser, TwoToolCallsAndNoArguments) {
  check_stream(
      "Two calls.\n</think>\n\n" + kOsloCall + "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n",
      {"Two calls.", "", {{"get_weather", R"({"city": "Oslo"})"}, {"get_time", "{}"}}}, with_tools());
}

// Issue 17 (4): tool_choice "required" with several tools returned a call to "_currency", a
// function not in tools. A call to a function the request did not offer is not a call: the
// block stays content, verbatim, and a valid call next to it is still returned.
TEST(output_parser, regression_unknown_function_is_content_17) {
  const std::string unknown =
      "<tool_call>\n<function=_currency>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>";
  check_stream("</think>\n\n" + unknown, {"", unknown, {}}, with_tools());
  check_stream("</think>\n\n" + kOsloCall + "\n" + unknown, {"", unknown, {{"get_weather", R"({"city": "Oslo"})"}}},
               with_tools());
  // Names are compared exactly: a near miss is not the function.
  const std::string near_miss = "<tool_call>\n<function=Get_Weather>\n</function>\n</tool_call>";
  check_stream("</think>\n\n" + near_miss, {"", near_miss, {}}, with_tools());
  // Cut off by the end of generation with its </function>: still checked.
  const std::string cut = "<tool_call>\n<function=nope>\n</function>";
  check_stream("</think>\n\n" + cut, {"", cut, {}}, with_tools());
  // With no tools array there is nothing to check against (the server never parses then).
  check_stream("</think>\n\n" + unknown, {"", "", {{"_currency", R"({"x": 1})"}}});
}

// Issue 17 (1): tool-call values are parsed as JSON, and dumped back recursively; a model that
// writes "[[[[..." thousands deep gets its value kept as text, not a stack overflow.
TEST(output_parser, regression_deep_value_stays_text_17) {
  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  const std::string call = "<tool_call>\n<function=get_weather>\n<parameter=city>\n" + deep +
                           "\n</parameter>\n<parameter=tags>\n" + deep + "\n</parameter>\n</function>\n</tool_call>";
  OutputParser parser(with_tools());
  ParserOutput out = parser.push("</think>\n\n" + call);
  ParserOutput end = parser.finish();
  out.tool_calls.insert(out.tool_calls.end(), end.tool_calls.begin(), end.tool_calls.end());
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments_json, R"({"city": ")" + deep + R"(", "tags": ")" + deep + R"("})");
  // Within the bound, an array is an array.
  const std::string shallow = std::string(100, '[') + std::string(100, ']');
  OutputParser ok(with_tools());
  ParserOutput a = ok.push("</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=tags>\n" + shallow +
                           "\n</parameter>\n</function>\n</tool_call>");
  ParserOutput b = ok.finish();
  a.tool_calls.insert(a.tool_calls.end(), b.tool_calls.begin(), b.tool_calls.end());
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_EQ(a.tool_calls[0].arguments_json, R"({"tags": )" + shallow + "}");
}

TEST(output_parser, NoSchemaTriesJsonThenString) {
  check_stream("</think><tool_call><function=anything><parameter=a>\n5\n</parameter><parameter=b>\nOslo\n"
               "</parameter><parameter=c>\n[1, 2]\n</parameter><parameter=d>\ntrue\n</parameter>"
               "<parameter=e>\n{'k': None}\n</parameter></function></tool_call>",
               {"", "", {{"anything", R"({"a": 5, "b": "Oslo", "c": [1, 2], "d": true, "e": {"k": null}})"}}});
}

TEST(output_parser, ToolCallInsideReasoningEndsIt) {
  check_stream("I should call the tool.\n\n" + kOsloCall,
               {"I should call the tool.", "", {{"get_weather", R"({"city": "Oslo"})"}}}, with_tools());
  // The </think> the model writes afterwards is dropped.
  check_stream("Thinking.\n" + kOsloCall + "\n</think>\n\nDone.",
               {"Thinking.", "Done.", {{"get_weather", R"({"city": "Oslo"})"}}}, with_tools());
}

TEST(output_parser, ToolCallTagWithoutFunctionIsText) {
  check_stream("The format uses <tool_call> tags.\n</think>\n\nOK <tool_call>x",
               {"The format uses <tool_call> tags.", "OK <tool_call>x", {}}, with_tools());
  check_stream("Consider <tool_call>\n <func", {"Consider <tool_call>\n <func", "", {}}, with_tools());
}

TEST(output_parser, ThinkingOffToolCall) {
  check_stream("Sure.\n\n" + kOsloCall, {"", "Sure.", {{"get_weather", R"({"city": "Oslo"})"}}}, thinking_off());
}

TEST(output_parser, TextAroundToolCalls) {
  check_stream("</think>\n\nA\n\n" + kOsloCall + "\n\nB\n", {"", "A\n\nB", {{"get_weather", R"({"city": "Oslo"})"}}},
               with_tools());
  check_stream("</think>\n\n" + kOsloCall + "\nAfter.", {"", "After.", {{"get_weather", R"({"city": "Oslo"})"}}},
               with_tools());
}

TEST(output_parser, ParsingOffKeepsToolCallText) {
  OutputParserOptions options;
  options.parse_tool_calls = false;
  check_stream("</think>\n\n" + kOsloCall, {"", kOsloCall, {}}, options);
  check_stream("R " + kOsloCall, {"R " + kOsloCall, "", {}}, options);
}

// ---- malformed and cut-off calls ------------------------------------------------------------

TEST(output_parser, BlocksWithoutAnAcceptedNameStayContent) {
  std::string no_name_end = "<tool_call>\n<function=get_weather\n</tool_call>";
  check_stream("</think>\n\n" + no_name_end, {"", no_name_end, {}}, with_tools());
  std::string stray_text = "<tool_call>\n<function=f>\nhello\n</function>\n</tool_call>";
  check_stream("</think>\n\n" + stray_text + "\n" + kOsloCall,
               {"", stray_text, {{"get_weather", R"({"city": "Oslo"})"}}}, with_tools());
  std::string empty_name = "<tool_call>\n<function= >\n</function>\n</tool_call>";
  check_stream("</think>\n\n" + empty_name, {"", empty_name, {}}, with_tools());
}

// Once its name is accepted a call has gone out (streamed): what follows cannot turn it back
// into text. Text inside it that is no parameter is dropped.
TEST(output_parser, AnAcceptedCallStaysACall) {
  std::string bad_tag = "<tool_call>\n<function=get_weather>\n<oops>\n</function>\n</tool_call>";
  check_stream("</think>\n\nTry: " + bad_tag + " done", {"", "Try: done", {{"get_weather", "{}"}}}, with_tools());
  check_stream("</think>\n\n<tool_call><function=get_weather>x <b><parameter=city\n>Oslo</parameter></function>"
               "</tool_call>",
               {"", "", {{"get_weather", R"({"city": "Oslo"})"}}}, with_tools());
  // Written twice: the first value went out, it stays.
  check_stream("</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=days>\n1\n</parameter>\n"
               "<parameter=city>\nA\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
               {"", "", {{"get_weather", R"({"days": 1, "city": "A"})"}}}, with_tools());
}

TEST(output_parser, CutOffCalls) {
  // Complete function, no </tool_call>: accepted.
  check_stream("</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n",
               {"", "", {{"get_weather", R"({"city": "Oslo"})"}}}, with_tools());
  // Cut inside a value: the call keeps what it wrote, closed.
  check_stream("</think>\n\nX <tool_call>\n<function=get_weather>\n<parameter=city>\nOs",
               {"", "X", {{"get_weather", R"({"city": "Os"})"}}}, with_tools());
  // Cut inside a closing tag: the unfinished tag is not the value's.
  check_stream("</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=days>\n12\n</para",
               {"", "", {{"get_weather", R"({"days": 12})"}}}, with_tools());
  check_stream("</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</fun",
               {"", "", {{"get_weather", R"({"city": "A"})"}}}, with_tools());
  // Cut off inside reasoning: the reasoning still ends at the call.
  check_stream("R\n<tool_call>\n<function=get_weather>\n", {"R", "", {{"get_weather", "{}"}}}, with_tools());
  // Cut off before the name is whole: not a call.
  check_stream("</think>\n\nX <tool_call>\n<function=get_wea", {"", "X <tool_call>\n<function=get_wea", {}},
               with_tools());
}

TEST(output_parser, ToleratedMissingClosers) {
  check_stream("</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</tool_call>",
               {"", "", {{"get_weather", R"({"city": "Oslo"})"}}}, with_tools());
  check_stream("</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n"
               "</parameter>\n</function>\n</tool_call>",
               {"", "", {{"get_weather", R"({"city": "Oslo", "days": 2})"}}}, with_tools());
}

TEST(output_parser, LiteralClosersInsideValue) {
  check_stream("</think>\n\n<tool_call>\n<function=write_file>\n<parameter=text>\na</parameter>b\n</function>\n"
               "</parameter>\n</function>\n</tool_call>",
               {"", "", {{"write_file", R"({"text": "a</parameter>b\n</function>"})"}}}, with_tools());
}

// ---- streaming behaviour --------------------------------------------------------------------

TEST(output_parser, EmitsAsSoonAsDecided) {
  OutputParser parser(thinking_off());
  EXPECT_EQ(parser.push("Hello, world").content, "Hello, world");
  EXPECT_EQ(parser.push(" and <").content, " and");  // "<" may open a tag, " " may precede one
  EXPECT_EQ(parser.push("b>").content, " <b>");
  EXPECT_EQ(parser.push("\xC3").content, "");  // half of "é"
  EXPECT_EQ(parser.push("\xA9!").content, "\xC3\xA9!");
  ParserOutput out = parser.push("\n\n<tool_call>\n<function=get_weather");
  EXPECT_EQ(out.content, "");
  EXPECT_TRUE(out.tool_call_pieces.empty());  // the name may go on
  out = parser.push(">\n");
  EXPECT_TRUE(out.tool_calls.empty());
  ASSERT_EQ(out.tool_call_pieces.size(), 1u);  // the call starts
  EXPECT_EQ(out.tool_call_pieces[0].name, "get_weather");
  EXPECT_EQ(out.tool_call_pieces[0].arguments, "{");
  out = parser.push("<parameter=city>\nOs");
  ASSERT_EQ(out.tool_call_pieces.size(), 1u);  // a string value streams as it is written
  EXPECT_EQ(out.tool_call_pieces[0].name, "");
  EXPECT_EQ(out.tool_call_pieces[0].arguments, R"("city": "Os)");
  out = parser.push("lo\n</param");
  ASSERT_EQ(out.tool_call_pieces.size(), 1u);
  EXPECT_EQ(out.tool_call_pieces[0].arguments, "lo");  // the newline may be the format's
  out = parser.push("eter>\n<parameter=days>\n3");
  ASSERT_EQ(out.tool_call_pieces.size(), 1u);  // an integer goes out whole
  EXPECT_EQ(out.tool_call_pieces[0].arguments, R"(", "days": )");
  out = parser.push("\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(out.tool_call_pieces.size(), 1u);
  EXPECT_EQ(out.tool_call_pieces[0].arguments, "3}");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments_json, R"({"city": "Oslo", "days": 3})");
  out = parser.finish();
  EXPECT_EQ(out.content, "");
  EXPECT_THROW(parser.push("x"), Error);
}

TEST(output_parser, ReasoningStreams) {
  OutputParser parser(with_tools());
  EXPECT_EQ(parser.push("\nStep one").reasoning, "Step one");
  EXPECT_EQ(parser.push(" and two.\n</").reasoning, " and two.");
  ParserOutput out = parser.push("think>\n\nAnswer");
  EXPECT_EQ(out.reasoning, "");
  EXPECT_EQ(out.content, "Answer");
}

TEST(output_parser, LongValueInSmallPieces) {
  // A 256 KiB file written through a tool call, pushed 3 bytes at a time (stays linear).
  std::string text;
  for (int i = 0; text.size() < 256 * 1024; ++i) text += "line " + std::to_string(i) + " </parameter> ü\n";
  std::string stream = "Writing.\n</think>\n\n<tool_call>\n<function=write_file>\n<parameter=text>\n" + text +
                       "\n</parameter>\n</function>\n</tool_call>";
  OutputParser parser(with_tools());
  std::vector<ParsedToolCall> calls;
  for (size_t pos = 0; pos < stream.size(); pos += 3) {
    ParserOutput out = parser.push(std::string_view(stream).substr(pos, 3));
    EXPECT_TRUE(out.content.empty());
    for (ParsedToolCall& call : out.tool_calls) calls.push_back(std::move(call));
  }
  parser.finish();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments_json, dump_json_python_style(json{{"text", text}}));
}

}  // namespace
}  // namespace lily
