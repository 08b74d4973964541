// test_tool_call_stream.cpp: a tool call's arguments streamed as the model writes them.
//
// The reference is nlohmann's dump (what the arguments were before they streamed) for the JSON
// string writer, and the whole-text parse for the call: random bodies built from the format's
// pieces, fed in every chunking (one push, byte by byte, random pieces), must give the same
// arguments, valid JSON objects, with string values released before they end.
#include "chat/tool_call_stream.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace lily {
namespace {

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "text": {"type": "string"},
    "tags": {"type": "array"}, "note": {"type": ["string", "null"]}}}}}])");

// Splits `s` into pieces of 0-`max_piece` bytes.
std::vector<std::string> random_split(const std::string& s, std::mt19937& rng, size_t max_piece) {
  std::vector<std::string> pieces;
  for (size_t pos = 0; pos < s.size();) {
    const size_t n = std::min(s.size() - pos, std::uniform_int_distribution<size_t>(0, max_piece)(rng));
    pieces.push_back(s.substr(pos, n));
    pos += n;
  }
  return pieces;
}

std::string write_string(const std::vector<std::string>& pieces) {
  JsonStringWriter writer;
  std::string out;
  for (const std::string& piece : pieces) writer.write(piece, out);
  writer.flush(out);
  return out;
}

// A random string of ASCII (controls, quotes, backslashes included) and 2-4 byte characters.
std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> atoms = {
      "a",    "Z",    " ",    "\"", "\\", "/",    "\n",          "\r", "\t", "\b", "\f", std::string(1, '\0'),
      "\x01", "\x1F", "\x7F", "é",  "東", "🙂", "\xEF\xBF\xBD"};
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, 40)(rng);
  for (int i = 0; i < n; ++i) s += atoms[std::uniform_int_distribution<size_t>(0, atoms.size() - 1)(rng)];
  return s;
}

TEST(JsonStringWriter, EscapesAsNlohmannDumpsWhateverTheSplit) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = random_text(rng);
    const std::string dumped = dump_json_python_style(json(text));
    const std::string expected = dumped.substr(1, dumped.size() - 2);
    ASSERT_EQ(write_string({text}), expected) << json(text).dump();
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    ASSERT_EQ(write_string(bytes), expected) << json(text).dump();
    ASSERT_EQ(write_string(random_split(text, rng, 5)), expected) << json(text).dump();
  }
}

TEST(JsonStringWriter, InvalidBytesBecomeOneReplacementEachWhateverTheSplit) {
  EXPECT_EQ(write_string({"a\xC3"}), "a\xEF\xBF\xBD");                                // cut off
  EXPECT_EQ(write_string({"\xC3", "x"}), "\xEF\xBF\xBDx");                            // broken off
  EXPECT_EQ(write_string({"\x80\xFF"}), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // no lead byte
  EXPECT_EQ(write_string({"\xE0\x80"}), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(write_string({"\xED\xA0\x80"}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(write_string({"\xF0\x9F", "\x99\x82"}), "🙂");
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes;
    const int n = std::uniform_int_distribution<int>(0, 24)(rng);
    for (int i = 0; i < n; ++i) bytes += char(std::uniform_int_distribution<int>(0x60, 0xFF)(rng));
    const std::string whole = write_string({bytes});
    ASSERT_EQ(write_string(random_split(bytes, rng, 3)), whole);
    ASSERT_FALSE(json::parse("\"" + whole + "\"", nullptr, false).is_discarded());  // valid UTF-8 JSON
  }
}

struct Streamed {
  std::string arguments;
  size_t pieces = 0;  // non-empty take()s
};

Streamed stream_call(const std::vector<std::string>& pieces, const ToolSchemas& schemas) {
  ToolCallStream call("f", schemas);
  Streamed out;
  auto take = [&] {
    const std::string piece = call.take();
    out.arguments += piece;
    out.pieces += piece.empty() ? 0 : 1;
  };
  for (const std::string& piece : pieces) {
    call.push(piece);
    take();
  }
  call.finish();
  take();
  EXPECT_EQ(out.arguments, call.arguments());
  return out;
}

// A body of the format's pieces in random order: tags, partial tags, newlines, values.
std::string random_body(std::mt19937& rng) {
  static const std::vector<std::string> atoms = {"<parameter=city>",
                                                 "<parameter=days>",
                                                 "<parameter=text>",
                                                 "<parameter=tags>",
                                                 "<parameter=note>",
                                                 "<parameter=other>",
                                                 "\n<parameter=days>\n",
                                                 "</parameter>",
                                                 "</parameter>\n",
                                                 "</function>",
                                                 "\n",
                                                 "\n\n",
                                                 " ",
                                                 "<",
                                                 "</",
                                                 "<param",
                                                 "</parameter",
                                                 "Oslo",
                                                 "12",
                                                 "ü",
                                                 "🙂",
                                                 "\"q\"",
                                                 "\\",
                                                 "\t",
                                                 "[1, 2]",
                                                 "{'k': None}",
                                                 "None",
                                                 "null",
                                                 "true",
                                                 "x",
                                                 ">",
                                                 "</tool"};
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, 30)(rng);
  for (int i = 0; i < n; ++i) s += atoms[std::uniform_int_distribution<size_t>(0, atoms.size() - 1)(rng)];
  return s;
}

TEST(ToolCallStream, AnyChunkingGivesTheWholeTextsArguments) {
  const ToolSchemas schemas(kTools);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string body = random_body(rng);
    const std::string whole = stream_call({body}, schemas).arguments;
    const json parsed = json::parse(whole, nullptr, false);
    ASSERT_TRUE(parsed.is_object()) << json(body).dump() << " -> " << whole;
    std::vector<std::string> bytes;
    for (char c : body) bytes.emplace_back(1, c);
    ASSERT_EQ(stream_call(bytes, schemas).arguments, whole) << json(body).dump();
    ASSERT_EQ(stream_call(random_split(body, rng, 9), schemas).arguments, whole) << json(body).dump();
  }
}

TEST(ToolCallStream, AStringValueStreamsAndTypedValuesGoOutWhole) {
  const ToolSchemas schemas(kTools);
  std::string text;
  for (int i = 0; i < 50; ++i) text += "line " + std::to_string(i) + " <b> </parameter> x\n";
  const std::string body = "\n<parameter=text>\n" + text + "\n</parameter>\n<parameter=days>\n" + "7" +
                           "\n</parameter>\n</function>\n";
  std::vector<std::string> pieces;
  for (size_t pos = 0; pos < body.size(); pos += 4) pieces.push_back(body.substr(pos, 4));
  const Streamed s = stream_call(pieces, schemas);
  EXPECT_EQ(s.arguments, dump_json_python_style(json{{"text", text}, {"days", 7}}));
  EXPECT_GT(s.pieces, 100u);  // the text went out as it came, not in one piece at its end
}

TEST(ToolCallStream, FunctionNames) {
  const ToolSchemas schemas(kTools), any;
  using Status = FunctionName::Status;
  EXPECT_EQ(read_function_name("f", schemas, false).status, Status::kPending);
  EXPECT_EQ(read_function_name("f", schemas, true).status, Status::kRejected);
  const FunctionName f = read_function_name(" f \n>\n<parameter=", schemas, false);
  EXPECT_EQ(f.status, Status::kAccepted);
  EXPECT_EQ(f.name, "f");
  EXPECT_EQ(f.end, 5u);
  EXPECT_EQ(read_function_name("g>", schemas, false).status, Status::kRejected);  // not in tools
  EXPECT_EQ(read_function_name("g>", any, false).status, Status::kAccepted);      // no tools array
  EXPECT_EQ(read_function_name("f\nx>", schemas, false).status, Status::kRejected);
  EXPECT_EQ(read_function_name("f</tool_call>", schemas, false).status, Status::kRejected);
  EXPECT_EQ(read_function_name(" >", any, false).status, Status::kRejected);
}

}  // namespace
}  // namespace lily
