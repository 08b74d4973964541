// tool_call_xml.h: one Qwen XML tool call -> an OpenAI tool call (name + JSON arguments).
//
// The model writes a call as (spec tokenizer-chat-api.md §3.4)
//   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// parse_tool_call_xml() takes the text between <tool_call> and </tool_call> and returns the call,
// or nothing when the block is malformed (the caller then keeps the text as content).
//
// Block rules:
//   * NAME is the text of <function=NAME>, trimmed; it must be non-empty and on one line, and
//     the name of one of the request's tools when the schemas were built from a tools array
//     (a call to a function the client never offered is not a call: issue 17 saw
//     "_currency" returned for tool_choice "required").
//   * The function body ends at the last </function>; text other than whitespace after it
//     makes the block malformed. A missing </function> is tolerated unless
//     `require_function_end` (used for a block cut off by the end of generation, which is
//     accepted only when its function is complete).
//   * A value is the text after <parameter=ARG>, less exactly one leading and one trailing "\n".
//     It ends at the first </parameter> that is followed, modulo whitespace, by the next
//     <parameter= or by the end of the body: so a literal </parameter> or </function> inside a
//     value (code that writes this format) is kept. A missing </parameter> is tolerated: the
//     value ends at a "\n<parameter=NAME>" that comes first when NAME is another parameter of
//     the function's schema; without any structural closer, at the next "\n<parameter=", else
//     at the end of the body.
//   * Anything else between parameters (stray text, an unclosed tag) makes the block malformed.
//   * A value cannot contain a literal </tool_call>: the caller ends the block at the first one.
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
// Whitespace as the format uses it: space, tab, CR, LF.
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size() && is_space(s[pos])) ++pos;
  return pos;
}
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

// Parses the text between <tool_call> and </tool_call>; nullopt when it is malformed.
std::optional<ParsedToolCall> parse_tool_call_xml(std::string_view body, const ToolSchemas& schemas,
                                                  bool require_function_end);

// Types one parameter's raw text by its schema (nullptr: no schema); see the header comment.
json convert_parameter_value(const std::string& raw, const json* schema);

// `value` as Python's json.dumps(value, ensure_ascii=False) writes it; invalid UTF-8 in
// strings becomes U+FFFD.
std::string dump_json_python_style(const json& value);

}  // namespace lily
