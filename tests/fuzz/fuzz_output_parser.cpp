// fuzz_output_parser.cpp: model output text as the reply stream feeds it to the output parser
// (src/chat/output_parser.h: reasoning / content / tool calls, tool_call_xml.h's typing).
//
// Input: byte 0 = options: bit 0 starts_in_reasoning, bit 1 parse_tool_calls, bit 2 the tools
// below, bit 3 the first line of the text is the tools array instead (JSON, the schemas the
// arguments are typed by). Byte 1 seeds the split of the text into pushes. The rest is the text.
// Seeds are readable: "7a" + text is reasoning, tool calls on, the tools below.
//
// A finding: a crash, a sanitizer report, a leak, an exception, or a broken promise of the
// header: (1) the outputs do not depend on how the text is split into pushes (one push vs
// pushes of 1..16 bytes); (2) for valid UTF-8 text, every delta is valid UTF-8; (3) each tool
// call's streamed pieces (its start, then argument pieces) add up to the call returned whole.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "chat/output_parser.h"

namespace {

const char* const kTools = R"([
 {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
   "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
   "lat": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"},
   "unit": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}},
 {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
   "code": {"type": "string"}, "n": {"type": ["integer", "null"]}}}}}
])";

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

struct Totals {
  std::string reasoning, content, calls;
  std::vector<std::string> streamed;  // name + '\0' + arguments per call, from the pieces
};

void add(Totals& t, const lily::ParserOutput& out, bool check_utf8) {
  if (check_utf8 && (!valid_utf8(out.reasoning) || !valid_utf8(out.content))) {
    std::fprintf(stderr, "a delta is not valid UTF-8\n");
    std::abort();
  }
  t.reasoning += out.reasoning;
  t.content += out.content;
  for (const auto& p : out.tool_call_pieces) {
    if (!p.name.empty()) {
      if (p.index != t.streamed.size()) {
        std::fprintf(stderr, "a tool call started with index %zu, not %zu\n", p.index, t.streamed.size());
        std::abort();
      }
      t.streamed.push_back(p.name + '\0');
    }
    if (p.index >= t.streamed.size()) {
      std::fprintf(stderr, "a tool-call piece for index %zu, which never started\n", p.index);
      std::abort();
    }
    t.streamed[p.index] += p.arguments;
  }
  for (const auto& c : out.tool_calls) t.calls += c.name + '\0' + c.arguments_json + '\0';
}

// The calls as the pieces gave them, in Totals::calls' form.
std::string streamed_calls(const Totals& t) {
  std::string calls;
  for (const std::string& call : t.streamed) calls += call + '\0';
  return calls;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  uint32_t seed = data[1];
  std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);

  lily::OutputParserOptions options;
  options.starts_in_reasoning = flags & 1;
  options.parse_tool_calls = flags & 2;
  if (flags & 8) {
    const size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    options.tools = lily::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (options.tools.is_discarded()) options.tools = nullptr;
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
  } else if (flags & 4) {
    options.tools = lily::json::parse(kTools);
  }
  const bool check_utf8 = valid_utf8(text);

  Totals whole, split;
  {
    lily::OutputParser parser(options);
    add(whole, parser.push(text), check_utf8);
    add(whole, parser.finish(), check_utf8);
  }
  {
    lily::OutputParser parser(options);
    for (size_t pos = 0; pos < text.size();) {
      seed = seed * 1103515245u + 12345u;
      const size_t n = std::min<size_t>(1 + (seed >> 16) % 16, text.size() - pos);
      add(split, parser.push(text.substr(pos, n)), check_utf8);
      pos += n;
    }
    add(split, parser.finish(), check_utf8);
  }
  if (whole.reasoning != split.reasoning || whole.content != split.content || whole.calls != split.calls) {
    std::fprintf(
        stderr,
        "the split changed the output:\n  whole: reasoning [%s] content [%s]\n  split: reasoning [%s] content [%s]\n",
        whole.reasoning.c_str(), whole.content.c_str(), split.reasoning.c_str(), split.content.c_str());
    std::abort();
  }
  if (streamed_calls(whole) != whole.calls || streamed_calls(split) != split.calls) {
    std::fprintf(stderr, "the streamed tool-call pieces do not add up to the calls\n");
    std::abort();
  }
  return 0;
}
