// tool_call_xml.h: what a Qwen XML tool call's arguments become: the request's tool schemas,
// the typing of each parameter's text, and the JSON layout of the arguments.
//
// The model writes a call as (spec tokenizer-chat-api.md §3.4)
//   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// tool_call_stream.h reads that text as it streams (the block rules are there) and uses what
// is here. NAME must be the name of one of the request's tools when the schemas were built from
// a tools array (a call to a function the client never offered is not a call: issue 17 saw
// "_currency" returned for tool_choice "required").
//
// Value types come from the request's tool schema, parameters.properties[ARG]:
//   "type" (a name or a list of names) and anyOf/oneOf options (their "type"s) give the allowed
//   types. null allowed and value null/None -> null. Then, in this order, the first allowed
//   type that accepts the text wins: integer (JSON integer, or an integral number), number (JSON
//   number, or anything strtod reads whole and finite), boolean (true/false in any case),
//   object / array (JSON, else a Python literal: 'quotes', True/False/None, (tuples)). If none
//   does: "string" allowed -> the raw text; else as with no schema. A value whose schema is
//   missing (unknown function or parameter, no "type") is JSON if it parses, else a Python
//   container or True/False/None if it parses as one, else the raw string. Also: null/None
//   for a type without "string" -> null. vLLM's type aliases (int*, float, bool, dict, list,
//   str, text, enum, ...) are understood.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace lily {

using json = nlohmann::ordered_json;

// The lexical pieces of the tool-call format, shared with the output parser.
namespace tool_call_syntax {
inline constexpr std::string_view kFunctionOpen = "<function=";
inline constexpr std::string_view kFunctionClose = "</function>";
inline constexpr std::string_view kParameterOpen = "<parameter=";
inline constexpr std::string_view kParameterClose = "</parameter>";
// Whitespace as the format uses it: space, tab, CR, LF.
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size() && is_space(s[pos])) ++pos;
  return pos;
}
// A tag name: the text of <function=NAME> or <parameter=NAME>, trimmed, one line, no '<'.
std::optional<std::string> tag_name(std::string_view raw);
}  // namespace tool_call_syntax

// One parsed call. arguments_json is a JSON object in Python's json.dumps layout
// (", " and ": " separators, non-ASCII kept raw), e.g. {"city": "Oslo", "days": 3}.
struct ParsedToolCall {
  std::string name;
  std::string arguments_json;
};

// The parameter schemas of a request's `tools` array, by function name. Entries may be
// {"type": "function", "function": {...}} or the bare function object; malformed entries are
// skipped (the server validates the request, this only looks up types).
class ToolSchemas {
 public:
  ToolSchemas() = default;  // no tools array: any function name is accepted
  explicit ToolSchemas(const json& tools);

  // Whether a call may name `function`: built from a tools array, only its functions.
  bool allows(std::string_view function) const;

  // The schema of one parameter, or nullptr when the function or the parameter is unknown.
  const json* find_parameter(std::string_view function, const std::string& parameter) const;

 private:
  std::map<std::string, json, std::less<>> properties_;  // function name -> "properties"
  bool checks_names_ = false;                            // built from a tools array
};

// The whole text between <tool_call> and </tool_call> (a call's block as generation left it),
// read by a ToolCallStream (tool_call_stream.h): nullopt when it does not start with
// <function=NAME> and an accepted NAME (or, with require_function_end, when no </function> ended
// the arguments); else the call, its arguments what the stream gives for that text in any pieces.
std::optional<ParsedToolCall> parse_tool_call_xml(std::string_view body, const ToolSchemas& schemas,
                                                  bool require_function_end = false);

// Types one parameter's raw text by its schema (nullptr: no schema); see the header comment.
json convert_parameter_value(const std::string& raw, const json* schema);

// Whether convert_parameter_value always gives the raw text as a JSON string for this schema:
// it allows "string" and none of the types tried before it (null, integer, number, boolean,
// object, array). Such values can be streamed as they are written.
bool value_is_plain_string(const json* schema);

// `value` as Python's json.dumps(value, ensure_ascii=False) writes it; invalid UTF-8 in
// strings becomes U+FFFD.
std::string dump_json_python_style(const json& value);

}  // namespace lily
