// anthropic_wire.h: Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens)
// over the chat service: its request turned into a ChatRequest, its response and its stream of
// events built from what the chat service gives.
//
// Request -> ChatRequest (read_anthropic_request; every refusal a 400 naming the field):
//   system (string or text blocks)      a system message (blocks joined with "\n\n")
//   messages: user text blocks          a user message (text blocks joined)
//             user tool_result blocks   tool messages (before the user text), content a string
//                                       or text blocks; is_error: the content prefixed "Error: "
//             assistant text / thinking / tool_use blocks
//                                       content / reasoning_content / tool_calls (input as
//                                       the arguments object); redacted_thinking is dropped
//             image, document and other blocks: 400 (lily reads text only)
//   tools: {name, description, input_schema} -> function tools; server tools (a "type" other
//          than "custom"): 400
//   tool_choice: auto, any (= required), tool {name} (must be in tools), none;
//                disable_parallel_tool_use accepted
//   thinking: {type: "enabled", budget_tokens} or "adaptive" -> Qwen's thinking on;
//             "disabled" or absent -> off (Anthropic's default). budget_tokens is checked, not
//             enforced: max_tokens bounds reasoning and answer together.
//   max_tokens (required; beyond what the context leaves, cut to it), stop_sequences,
//   temperature (0-1), top_p, top_k, stream, metadata (accepted), model (lily answers as itself).
//
// Response: {id: "msg_...", type: "message", role: "assistant", model, content: [thinking
// {thinking, signature}, text, tool_use {id: "toolu_...", name, input}], stop_reason (end_turn,
// max_tokens, stop_sequence, tool_use), stop_sequence, usage {input_tokens (not from the
// cache), cache_creation_input_tokens: 0, cache_read_input_tokens, output_tokens}}.
// The signature is not cryptographic: "lily-" + a hash of the thinking text (clients expect
// the field; lily ignores signatures it is sent).
//
// Stream (AnthropicEvents), Anthropic's order: message_start, ping, for each block
// content_block_start, content_block_delta (thinking_delta + signature_delta, text_delta,
// input_json_delta as the arguments stream), content_block_stop; message_delta {stop_reason,
// stop_sequence, usage}, message_stop.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/wire.h"

namespace lily::server {

struct AnthropicRequest {
  ChatRequest chat;  // chat.options.max_tokens: max_tokens, as asked (the endpoint cuts it to the context)
  bool stream = false;
};

// A /v1/messages body (count_tokens: max_tokens not required). Throws ApiError 400.
AnthropicRequest read_anthropic_request(const json& body, const SamplingParams& defaults, bool count_tokens);

// "toolu_" + the call id's random part: Anthropic's tool_use id for a ToolCall id.
std::string anthropic_tool_id(const std::string& call_id);
// end_turn, max_tokens, stop_sequence or tool_use.
std::string anthropic_stop_reason(const CompletionResult& r);
json anthropic_usage_json(const Usage& usage);
// The whole response.
json anthropic_message_json(const CompletionResult& r, const std::string& id, const std::string& model);

// The stream's events, one completion's worth (not thread safe; the job calls it in order).
class AnthropicEvents {
 public:
  AnthropicEvents(std::string id, std::string model, int64_t prompt_tokens);
  std::vector<json> opening();  // message_start, ping
  std::vector<json> on_delta(const ChatDelta& d);
  std::vector<json> closing(const CompletionResult& r);

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  void start_block(Block kind, json content_block, std::vector<json>& out);
  void stop_block(std::vector<json>& out);
  json delta_event(json delta) const;

  std::string id_, model_;
  int64_t prompt_tokens_;
  Block open_ = Block::kNone;
  int index_ = -1;
  std::string thinking_;  // the open thinking block's text, for its signature
};

}  // namespace lily::server
