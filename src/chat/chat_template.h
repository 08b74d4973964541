// chat_template.h: Qwen3.6's chat template (tools/qwen36_chat_template.jinja), rendered natively.
//
// The renderer reproduces what the template renders in transformers' Jinja environment
// (trim_blocks, lstrip_blocks, tojson = json.dumps(ensure_ascii=False)) byte for byte; the golden
// corpus tests/fixtures/chat/templates/cases.json (tools/make_template_fixtures.py) checks it.
// spec: tokenizer-chat-api.md §3.
//
// Before rendering, the messages get the server's pre-processing:
//   * role "developer" is treated as "system";
//   * an assistant's `reasoning` is used as `reasoning_content` when the latter is not a string;
//   * tool-call `arguments` given as a JSON string (OpenAI) are parsed into an object ("" -> {}).
// and lily's own refusals (ChatTemplateOptions::lily_refusals, on by default), checked first:
//   * image / video parts ("lily has no vision encoder: image inputs are refused") and
//     input_audio parts: the template would render placeholder tokens with nothing behind them;
//   * a role the template does not know (it would answer "No user query found in messages."
//     for a lone one): refused naming the role;
//   * messages or tools nested deeper than kMaxJsonNesting (chat/json_limits.h), before any
//     of it is copied or dumped; tool-call arguments strings are parsed with the same bound.
// Every refusal of the template ("No user query found in messages." ...) and every malformed
// input (naming the field: "messages[2].tool_calls[0].function.arguments is not valid JSON")
// throws TemplateError, which the server turns into HTTP 400.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "base/error.h"

namespace lily {

using json = nlohmann::ordered_json;  // insertion order matters for tool dumps

class TemplateError : public Error {
 public:
  using Error::Error;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;     // false: the generation prompt closes an empty think block
  bool preserve_thinking = false;  // true: every assistant turn keeps its <think> block
  // lily's refusals above. Off, the renderer is the template alone (media placeholders
  // rendered, unknown roles as the template raises them): the golden corpus compares it so.
  bool lily_refusals = true;
};

// messages and tools as in an OpenAI chat-completions request (tools may be null).
std::string render_chat_template(const json& messages, const json& tools, const ChatTemplateOptions& options);

// Renders a whole request object: messages, tools, chat_template_kwargs {enable_thinking,
// preserve_thinking}, reasoning_effort ("none" -> thinking off), and the vLLM-style top-level
// add_generation_prompt / enable_thinking. chat_template_kwargs wins over the top-level fields.
ChatTemplateOptions chat_template_options(const json& request);
std::string render_chat_request(const json& request);

}  // namespace lily
