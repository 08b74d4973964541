// anthropic_response.cpp: a completion as Anthropic's message object and its stream of events
// (see anthropic_wire.h).
#include "server/anthropic_wire.h"

#include "chat/json_limits.h"

namespace lily::server {
namespace {

// Not a cryptographic signature: clients expect the field on thinking blocks (and send it
// back, which lily ignores). FNV-1a of the text, so equal thinking has an equal signature.
std::string thinking_signature(const std::string& thinking) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : thinking) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("lily-{:016x}", h);
}

// A tool call's arguments as the input object. The output parser writes them as a JSON object
// whose values were parsed within the nesting limit, one level more with the object itself.
json tool_input(const std::string& arguments) {
  json input = parse_json_bounded(arguments, kMaxJsonNesting + 1);
  return input.is_object() ? input : json::object();
}

}  // namespace

std::string anthropic_tool_id(const std::string& call_id) {
  return "toolu_" + (call_id.starts_with("call_") ? call_id.substr(5) : call_id);
}

std::string anthropic_stop_reason(const CompletionResult& r) {
  if (r.finish_reason == "tool_calls") return "tool_use";
  if (r.finish_reason == "length") return "max_tokens";
  return r.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

// input_tokens counts what was not read from the cache, as Anthropic's API does; the prompt is
// input_tokens + cache_read_input_tokens (what count_tokens gives).
json anthropic_usage_json(const Usage& u) {
  return json{{"input_tokens", u.prompt_tokens - u.cached_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", u.cached_tokens},
              {"output_tokens", u.completion_tokens}};
}

json anthropic_message_json(const CompletionResult& r, const std::string& id, const std::string& model) {
  json content = json::array();
  if (!r.reasoning.empty()) {
    content.push_back(
        json{{"type", "thinking"}, {"thinking", r.reasoning}, {"signature", thinking_signature(r.reasoning)}});
  }
  if (!r.content.empty()) content.push_back(json{{"type", "text"}, {"text", r.content}});
  for (const ToolCall& c : r.tool_calls) {
    content.push_back(json{
        {"type", "tool_use"}, {"id", anthropic_tool_id(c.id)}, {"name", c.name}, {"input", tool_input(c.arguments)}});
  }
  return json{{"id", id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model},
              {"content", std::move(content)},
              {"stop_reason", anthropic_stop_reason(r)},
              {"stop_sequence", r.stop_sequence.empty() ? json(nullptr) : json(r.stop_sequence)},
              {"usage", anthropic_usage_json(r.usage)}};
}

AnthropicEvents::AnthropicEvents(std::string id, std::string model, int64_t prompt_tokens)
    : id_(std::move(id)), model_(std::move(model)), prompt_tokens_(prompt_tokens) {}

// The stream opens before the request's turn: the cache split of the prompt is not known yet,
// so message_start counts the whole prompt as input; message_delta gives the final usage.
std::vector<json> AnthropicEvents::opening() {
  Usage opening;
  opening.prompt_tokens = prompt_tokens_;
  json message{{"id", id_},
               {"type", "message"},
               {"role", "assistant"},
               {"model", model_},
               {"content", json::array()},
               {"stop_reason", nullptr},
               {"stop_sequence", nullptr},
               {"usage", anthropic_usage_json(opening)}};
  return {json{{"type", "message_start"}, {"message", std::move(message)}}, json{{"type", "ping"}}};
}

// In a delta, the text order is: reasoning, the rest of a call already open, content and new
// calls (a call cannot be open while reasoning or content is written).
std::vector<json> AnthropicEvents::on_delta(const ChatDelta& d) {
  std::vector<json> out;
  if (!d.reasoning.empty()) {
    if (open_ != Block::kThinking) start_block(Block::kThinking, json{{"type", "thinking"}, {"thinking", ""}}, out);
    thinking_ += d.reasoning;
    out.push_back(delta_event(json{{"type", "thinking_delta"}, {"thinking", d.reasoning}}));
  }
  auto write_call = [&](const ToolCallDelta& t) {
    if (!t.name.empty()) {
      start_block(
          Block::kToolUse,
          json{{"type", "tool_use"}, {"id", anthropic_tool_id(t.id)}, {"name", t.name}, {"input", json::object()}},
          out);
    }
    if (!t.arguments.empty()) {
      out.push_back(delta_event(json{{"type", "input_json_delta"}, {"partial_json", t.arguments}}));
    }
  };
  size_t next = 0;
  for (; next < d.tool_call_deltas.size() && d.tool_call_deltas[next].name.empty(); ++next) {
    write_call(d.tool_call_deltas[next]);
  }
  if (!d.content.empty()) {
    if (open_ != Block::kText) start_block(Block::kText, json{{"type", "text"}, {"text", ""}}, out);
    out.push_back(delta_event(json{{"type", "text_delta"}, {"text", d.content}}));
  }
  for (; next < d.tool_call_deltas.size(); ++next) write_call(d.tool_call_deltas[next]);
  return out;
}

std::vector<json> AnthropicEvents::closing(const CompletionResult& r) {
  std::vector<json> out;
  stop_block(out);
  out.push_back(
      json{{"type", "message_delta"},
           {"delta", json{{"stop_reason", anthropic_stop_reason(r)},
                          {"stop_sequence", r.stop_sequence.empty() ? json(nullptr) : json(r.stop_sequence)}}},
           {"usage", anthropic_usage_json(r.usage)}});
  out.push_back(json{{"type", "message_stop"}});
  return out;
}

void AnthropicEvents::start_block(Block kind, json content_block, std::vector<json>& out) {
  stop_block(out);
  ++index_;
  open_ = kind;
  out.push_back(json{{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(content_block)}});
}

// A thinking block ends with its signature, as Anthropic's do.
void AnthropicEvents::stop_block(std::vector<json>& out) {
  if (open_ == Block::kNone) return;
  if (open_ == Block::kThinking) {
    out.push_back(delta_event(json{{"type", "signature_delta"}, {"signature", thinking_signature(thinking_)}}));
    thinking_.clear();
  }
  out.push_back(json{{"type", "content_block_stop"}, {"index", index_}});
  open_ = Block::kNone;
}

json AnthropicEvents::delta_event(json delta) const {
  return json{{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}};
}

}  // namespace lily::server
