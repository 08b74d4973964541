// tool_call_stream.h: one Qwen XML tool call parsed as the model writes it, its arguments
// released as JSON pieces while they stream.
//
// The model writes (spec tokenizer-chat-api.md §3.4)
//   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// The output parser (output_parser.h) reads up to the '>' of <function=NAME> with
// read_function_name(); once NAME is accepted the call is a call (its start goes to the client),
// and the function body goes through a ToolCallStream until the block ends (</tool_call> or the
// end of generation: finish()). take() gives the arguments JSON written since the last take():
//   {                          when the call starts
//   "ARG": "                   when a parameter whose schema allows only a string opens,
//   escaped value text         as it arrives, then "
//   "ARG": VALUE               other parameters, when their value ends (typed as a whole,
//                              tool_call_xml.h: integer, number, object, Python literals, ...)
//   , between parameters, } at the end
// in Python's json.dumps layout, so the pieces concatenate to the arguments_json that
// parse_tool_call_xml() (tool_call_xml.h) gives for the whole text: one code path, whatever the
// split.
//
// Body rules (each decidable with bounded look-ahead, so nothing waits for the end of the block
// that need not):
//   * A value is the text after <parameter=ARG>, less one leading and one trailing "\n". It ends
//     at the first of:
//       - </parameter> followed, modulo whitespace, by <parameter=, by </function> and the end
//         of the block, or by the end of the block;
//       - "\n<parameter=NAME>" when NAME is another parameter of the function's schema (a
//         missing </parameter>);
//       - </function> followed, modulo whitespace, by the end of the block;
//       - the end of the block (a call cut off by the end of generation keeps what it wrote;
//         a closing tag it was writing, e.g. "</para", is dropped).
//     So a literal </parameter> or </function> inside a value (code that writes this format)
//     stays in the value.
//   * Between parameters: whitespace, <parameter=ARG> (ARG trimmed, one line, no '<'), or
//     </function>, which ends the arguments. Other text there, and everything after the
//     function's end, is dropped: the call has already gone out.
//   * A parameter written twice keeps its first value (the first went out already).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "chat/tool_call_xml.h"

namespace lily {

// Where the name of <function=NAME> stands: `text` starts just after "<function=".
struct FunctionName {
  enum class Status { kPending, kAccepted, kRejected };
  Status status = Status::kPending;
  std::string name;  // kAccepted
  size_t end = 0;    // kAccepted: the offset just after the '>'
};

// kAccepted when NAME is a valid tag name (trimmed, non-empty, one line) that `schemas`
// allows; kRejected when it is not, or when no '>' can come (a '<' first, or at_end);
// kPending while the '>' has not arrived.
FunctionName read_function_name(std::string_view text, const ToolSchemas& schemas, bool at_end);

// JSON string content written as the text streams: escapes as nlohmann's dump (Python's
// json.dumps with ensure_ascii=False) does, holds back an incomplete UTF-8 character, and
// writes U+FFFD for each invalid sequence (its maximal valid prefix), so the result does not
// depend on how the text is split.
class JsonStringWriter {
 public:
  void write(std::string_view text, std::string& out);
  void flush(std::string& out);  // the end of the string: an incomplete character becomes U+FFFD

 private:
  std::string held_;  // the start of a UTF-8 sequence, valid so far
};

class ToolCallStream {
 public:
  // `function` was accepted by read_function_name; `schemas` must outlive this object.
  ToolCallStream(std::string function, const ToolSchemas& schemas);

  void push(std::string_view body_text);                       // the function body, after <function=NAME>
  void finish();                                               // the block ended: close what is open
  std::string take();                                          // arguments JSON written since the last take()
  const std::string& arguments() const { return arguments_; }  // all of it so far
  const std::string& function() const { return function_; }
  bool function_closed() const { return function_closed_; }  // a whole </function> ended the arguments

 private:
  enum class State { kBetween, kValue, kDone };
  enum class Closer { kNone, kMaybe, kNextParameter, kParameterEnd, kFunctionEnd };
  struct Match {
    Closer kind = Closer::kNone;
    size_t resume = 0;  // where scanning goes on after the value
  };

  void run(bool at_end);
  bool step_between(bool at_end);
  bool step_value(bool at_end);
  Match classify(size_t lt, bool at_end) const;
  void open_value(std::string name);
  void write_value(size_t from, size_t to);  // value text buf_[from, to)
  void close_value();
  void close_arguments();
  void emit(std::string_view json_text);

  std::string function_;
  const ToolSchemas& schemas_;
  State state_ = State::kBetween;
  std::string buf_;  // body text not yet consumed
  size_t pos_ = 0;   // consumed prefix of buf_ (erased at the end of run())
  std::string arguments_, unread_;
  bool first_parameter_ = true, function_closed_ = false;
  std::set<std::string, std::less<>> seen_;
  // The open value.
  std::string parameter_;
  const json* schema_ = nullptr;
  bool at_value_start_ = false, skip_value_ = false, as_string_ = false;
  std::string raw_;  // typed values: the text, converted when the value ends
  JsonStringWriter string_;
};

}  // namespace lily
