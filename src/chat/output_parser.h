// output_parser.h: splits the model's streamed text into reasoning, content and tool calls.
//
// The server feeds the decoded text as it streams (push) and, at the end of generation, calls
// finish(). Each call returns the deltas it could decide: reasoning text, content text, and the
// tool calls completed by it. Concatenating every output gives the whole answer, whatever the
// split of the text into pushes (the tests check every split position).
//
// What the model writes (spec tokenizer-chat-api.md §3.4), after a prompt that opens <think>:
//   REASONING\n</think>\n\nCONTENT\n\n<tool_call>\n<function=NAME>...</function>\n</tool_call>
//
// Rules:
//   1. Sections. With starts_in_reasoning the output is reasoning until </think>, content after
//      it. A </think> that never comes leaves everything reasoning (the answer was cut off; vLLM
//      does the same). Without starts_in_reasoning all output is content, and a literal
//      <think> or </think> in it stays content. A <think> that opens the reasoning (older
//      templates made the model write it; leading whitespace allowed) is dropped.
//   2. Tool calls. An opening is <tool_call>, optional whitespace, then <function= . A
//      <tool_call> followed by anything else is plain text (a model talking about the tag).
//      An opening in content starts a call block; one inside reasoning (Qwen3.5/3.6 sometimes
//      skip </think>) ends the reasoning there and starts the block too, as vLLM and SGLang do.
//      After such an implicit end, the first </think> seen later in content is dropped.
//      The call starts when the '>' of <function=NAME> arrives and NAME is accepted
//      (read_function_name, tool_call_stream.h: one of the request's tools): from then on the
//      block is a call, and its arguments stream as the model writes them (tool_call_pieces:
//      the start with the name, then JSON pieces; tool_call_stream.h says how the body is
//      read). It ends at the first </tool_call>, or at the end of generation (a call cut off
//      keeps what it wrote, closed). A block whose name is not accepted goes to content
//      verbatim, tags included, once its </tool_call> (or the end) arrives: nothing is
//      dropped. With parse_tool_calls off, <tool_call> is plain text everywhere.
//   3. Whitespace, so the text round-trips through the chat template (which writes
//      "<think>\n" + reasoning + "\n</think>\n\n" + content + "\n\n<tool_call>..." and trims
//      both on re-render):
//        * reasoning: leading newlines dropped, trailing whitespace dropped;
//        * content: leading newlines dropped (the "\n\n" after </think>); whitespace just
//          before an accepted tool call or at the end of generation dropped. So whitespace-only
//          text between or after tool calls disappears; other text after a tool call is
//          content, with the newlines before it kept when content was already emitted.
//   4. Held back: a suffix that may be the start of a tag (</think>, <tool_call>, a leading
//      <think>), a <tool_call> waiting for its <function=, a block until its name is decided
//      (and a refused one until its end), what of a call's body may still be a closing tag
//      (tool_call_stream.h), trailing whitespace (see 3) and an incomplete UTF-8 character (so
//      every delta is valid UTF-8 even when a push splits a character). finish() releases
//      what is left.
//
// Tool-call ids are the caller's: the parser returns name + arguments, and the index of each
// call in the reply. Stop strings are applied by the server before the text reaches the parser.
#pragma once

#include "chat/tool_call_stream.h"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lily {

// A tool call as it streams. A call's first piece has its name (the call starts); the
// concatenated `arguments` of its pieces are its ParsedToolCall's arguments_json.
struct ToolCallPiece {
  size_t index = 0;       // the call's place among the reply's calls: 0, 1, ...
  std::string name;       // the first piece only
  std::string arguments;  // the next piece of the arguments JSON (may be empty)
};

// What one push()/finish() produced.
struct ParserOutput {
  std::string reasoning;                        // reasoning text delta
  std::string content;                          // content text delta
  std::vector<ParsedToolCall> tool_calls;       // tool calls completed by this push
  std::vector<ToolCallPiece> tool_call_pieces;  // tool calls as they stream, in order (one per call and push)
};

struct OutputParserOptions {
  bool starts_in_reasoning = true;  // the generation prompt ended with "<think>\n" (thinking on)
  json tools = nullptr;             // the request's tools array (for argument types); null = none
  bool parse_tool_calls = true;     // false when tool_choice is "none" or no tools were given
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);

  ParserOutput push(std::string_view text);  // decoded text as it streams
  ParserOutput finish();                     // end of generation: flush what was held back
  // Whether the reply is still in its reasoning (what is pushed next would be reasoning, or
  // the tag that ends it): the server counts reasoning tokens by it.
  bool in_reasoning() const { return mode_ == Mode::kReasoning; }

 private:
  // One section of text (reasoning or content) as it is emitted: applies the whitespace
  // rules and holds back trailing whitespace and an incomplete UTF-8 character.
  class TextSection {
   public:
    explicit TextSection(bool trim_leading_newlines) : trim_leading_(trim_leading_newlines) {}
    std::string write(std::string_view text);  // returns what can be emitted now
    std::string end();                         // the section (or its run before a tool call) ends: the rest, trimmed
   private:
    // [begin, end) of s less the leading newlines (while trimming) and the trailing whitespace.
    std::pair<size_t, size_t> trimmed_range(const std::string& s) const;
    std::string held_;
    bool trim_leading_;
  };

  enum class Mode { kReasoning, kContent, kToolCall };

  // Each step consumes from buffer_ and returns false when it needs more text.
  void process(ParserOutput& out, bool at_end);
  bool step_think_open(bool at_end);
  bool step_text(ParserOutput& out, bool at_end);
  bool step_tool_call(ParserOutput& out, bool at_end);
  bool step_call_name(ParserOutput& out, bool at_end);
  bool step_refused_block(ParserOutput& out, bool at_end);
  bool step_call_body(ParserOutput& out, bool at_end);
  void add_piece(ParserOutput& out, std::string name);

  OutputParserOptions options_;
  ToolSchemas schemas_;
  Mode mode_;
  std::string buffer_;                  // text received and not yet decided
  size_t tool_call_scanned_ = 0;        // a refused block: buffer_ bytes searched for </tool_call> already
  bool block_refused_ = false;          // kToolCall: the block's name was not accepted
  std::optional<ToolCallStream> call_;  // kToolCall: the call whose body streams
  size_t calls_started_ = 0;
  bool think_open_checked_ = false;
  bool implicit_reasoning_end_ = false;  // reasoning ended at a <tool_call>, not at </think>
  bool stray_think_end_dropped_ = false;
  bool finished_ = false;
  TextSection reasoning_{true};
  TextSection content_{true};
};

}  // namespace lily
