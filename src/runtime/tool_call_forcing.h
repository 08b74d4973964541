// tool_call_forcing.h: tool_choice "required" or a named function, by putting the start of a
// call in the model's mouth.
//
// The forced text is appended to the model's context as if it had written it (the next
// generation round's prefill computes it) and to the reply's text, so the model must go on
// with a call:
//   required  "<tool_call>\n<function": it picks the function (with one tool there is nothing
//             to pick, and the opening names it too);
//   function  "<tool_call>\n<function=NAME>\n": the call is to NAME.
// Each opening ends where the tokenizer itself ends a token in a written-out call: the
// pre-tokenizer makes "<function" one piece and "=NAME" the next ("=get" is one token in the
// Qwen vocabularies), and ">\n" one piece before the next "<". An opening that ended on the
// "=" put a lone "=" token in the context, which the model never saw before a name: issue 17
// got "_currency", a function not in tools. Whatever name the model writes, the output parser
// returns only calls to functions in tools (chat/tool_call_xml.h); a call to another stays text.
// The opening goes where the answer starts: at once with thinking off, after </think> with
// thinking on. If the model still writes no parseable call (a tiny model may not), the reply
// is returned as it is, with finish_reason "stop": nothing constrains what follows the opening.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "chat/chat_template.h"  // json

namespace lily {

// tool_choice:
//   auto      tool calls are parsed when tools are given;
//   none      the template still lists the tools, but tool-call tags stay plain text;
//   required  a call is forced (above);
//   function  a call to `function` is forced.
struct ToolChoice {
  enum class Mode { automatic, none, required, function };
  Mode mode = Mode::automatic;
  std::string function;  // Mode::function
};

// The function object of a tools entry: {"type": "function", "function": {...}}, or the entry
// itself when it has no "function".
const json& tool_function(const json& tool);

// The text that starts the call ("" for auto and none).
std::string forced_call_opening(const ToolChoice& choice, const json& tools);

// When the opening goes in, over the generation rounds of one reply. Once it is in, nothing
// more is forced.
class ToolCallForcing {
 public:
  // think_end: the id of </think> (without one, a reply that starts in reasoning is not forced).
  ToolCallForcing(std::string opening, bool starts_in_reasoning, std::optional<int32_t> think_end);

  // The text to force before the first round: the opening when the reply starts with the
  // answer (thinking off), else "".
  std::string at_start();
  // While the opening waits for the end of the reasoning, a round also stops at </think>:
  // that id, else nullopt.
  std::optional<int32_t> waits_for() const;

  struct Step {
    std::string text;            // to force now
    bool replaces_last = false;  // the round's last token leaves the reply first
  };
  // A round that waited ended on the stop token `last`. After </think> the opening follows it;
  // a stop token that came first (the model ended its reply without closing its reasoning)
  // is replaced by a closing </think> and the opening, so the reply becomes a call anyway.
  Step after_round(int32_t last);

 private:
  std::string opening_;
  bool starts_in_reasoning_;
  std::optional<int32_t> think_end_;
  bool done_;  // forced, or nothing to force
};

}  // namespace lily
