// anthropic_wire.cpp: an Anthropic Messages request -> a ChatRequest (see anthropic_wire.h).
//
// Each field is read under the line of Anthropic's API reference it implements.
#include "server/anthropic_wire.h"

#include <algorithm>

#include "server/errors.h"

namespace lily::server {
namespace {

// A content block's "type"; the block must be an object.
std::string block_type(const json& block, const std::string& path) {
  if (!block.is_object()) bad_request(path + " must be an object", path);
  return string_member(block, "type", path);
}

[[noreturn]] void refuse_block(const std::string& type, const std::string& path, const char* where) {
  if (type == "image") {
    bad_request(fmt::format("lily has no vision encoder: image blocks are refused ({})", path), path + ".type");
  }
  if (type == "document") bad_request(fmt::format("lily reads text only: {} is a document", path), path + ".type");
  bad_request(fmt::format("{}.type \"{}\" is not a block lily takes in {}", path, type, where), path + ".type");
}

// A string, or an array of text blocks (joined with `separator`).
std::string text_or_blocks(const json& value, const std::string& path, const char* separator) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) bad_request(path + " must be a string or an array of text blocks", path);
  std::string text;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string block = item_path(path, i);
    const std::string type = block_type(value[i], block);
    if (type != "text") refuse_block(type, block, "text");
    if (i > 0) text += separator;
    text += string_member(value[i], "text", block);
  }
  return text;
}

// A user message: its tool_result blocks become tool messages (Anthropic puts them first), its
// text blocks one user message after them.
void add_user_message(const json& content, const std::string& path, json& messages) {
  if (content.is_string()) {
    messages.push_back(json{{"role", "user"}, {"content", content}});
    return;
  }
  std::string text;
  bool has_text = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block = item_path(path, i);
    const std::string type = block_type(content[i], block);
    if (type == "text") {
      text += string_member(content[i], "text", block);
      has_text = true;
    } else if (type == "tool_result") {
      // tool_result: tool_use_id (string), content (string or blocks, optional), is_error (bool).
      const std::string id = string_member(content[i], "tool_use_id", block);
      const json* result = member(content[i], "content");
      std::string output = result ? text_or_blocks(*result, block + ".content", "\n") : "";
      const json* is_error = member(content[i], "is_error");
      if (is_error && !is_error->is_boolean()) bad_request(block + ".is_error must be a boolean", block + ".is_error");
      if (is_error && is_error->get<bool>()) output = "Error: " + output;
      messages.push_back(json{{"role", "tool"}, {"tool_call_id", id}, {"content", output}});
    } else {
      refuse_block(type, block, "user messages");
    }
  }
  if (has_text) messages.push_back(json{{"role", "user"}, {"content", text}});
}

// An assistant message: text -> content, thinking -> reasoning_content, tool_use -> tool_calls.
void add_assistant_message(const json& content, const std::string& path, json& messages) {
  json message{{"role", "assistant"}, {"content", ""}};
  if (content.is_string()) {
    message["content"] = content;
    messages.push_back(std::move(message));
    return;
  }
  std::string text, reasoning;
  json calls = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block = item_path(path, i);
    const std::string type = block_type(content[i], block);
    if (type == "text") {
      text += string_member(content[i], "text", block);
    } else if (type == "thinking") {
      reasoning += string_member(content[i], "thinking", block);
    } else if (type == "redacted_thinking") {
      continue;  // encrypted by another service: nothing lily can read
    } else if (type == "tool_use") {
      // tool_use: id, name, input (object).
      const std::string id = string_member(content[i], "id", block);
      const std::string name = string_member(content[i], "name", block);
      const json* input = member(content[i], "input");
      if (!input || !input->is_object()) bad_request(block + ".input must be an object", block + ".input");
      calls.push_back(
          json{{"id", id}, {"type", "function"}, {"function", json{{"name", name}, {"arguments", *input}}}});
    } else {
      refuse_block(type, block, "assistant messages");
    }
  }
  message["content"] = text;
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  messages.push_back(std::move(message));
}

json read_messages(const json& in, const std::optional<std::string>& system) {
  json messages = json::array();
  if (system) messages.push_back(json{{"role", "system"}, {"content", *system}});
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string path = item_path("messages", i);
    if (!in[i].is_object()) bad_request(path + " must be an object", path);
    const std::string role = string_member(in[i], "role", path);
    const json* content = member(in[i], "content");
    if (!content || !(content->is_string() || content->is_array())) {
      bad_request(path + ".content must be a string or an array of content blocks", path + ".content");
    }
    if (role == "user") {
      add_user_message(*content, path + ".content", messages);
    } else if (role == "assistant") {
      // A last assistant message asks Anthropic's models to continue it ("prefill"); the Qwen
      // template would close it and start a new turn instead.
      if (i + 1 == in.size()) {
        bad_request(path + " is an assistant message: lily does not continue a prefilled assistant turn", path);
      }
      add_assistant_message(*content, path + ".content", messages);
    } else {
      bad_request(fmt::format("{}.role must be \"user\" or \"assistant\" (system goes in the system field)", path),
                  path + ".role");
    }
  }
  return messages;
}

// tools: custom tools {name, description, input_schema} as OpenAI function tools.
json read_tools(const json& in) {
  json tools = json::array();
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string path = item_path("tools", i);
    if (!in[i].is_object()) bad_request(path + " must be an object", path);
    if (const json* type = member(in[i], "type"); type && *type != "custom") {
      bad_request(fmt::format("{}.type {} is a server tool; lily runs none (custom tools only)", path, dump(*type)),
                  path + ".type");
    }
    json tool = function_tool(in[i], path, "input_schema");
    // input_schema: required by Anthropic; a tool without one takes no arguments here.
    if (!tool["function"].contains("parameters"))
      tool["function"]["parameters"] = json{{"type", "object"}, {"properties", json::object()}};
    tools.push_back(std::move(tool));
  }
  return tools;
}

// tool_choice: {type: auto | any | tool (name) | none, disable_parallel_tool_use}.
ToolChoice read_tool_choice(const json& in, const json& tools) {
  if (!in.is_object()) bad_request("tool_choice must be an object", "tool_choice");
  const std::string type = string_member(in, "type", "tool_choice");
  if (const json* parallel = member(in, "disable_parallel_tool_use"); parallel && !parallel->is_boolean()) {
    bad_request("tool_choice.disable_parallel_tool_use must be a boolean", "tool_choice.disable_parallel_tool_use");
  }
  ToolChoice choice;
  if (type == "auto") return choice;
  if (type == "none") {
    choice.mode = ToolChoice::Mode::none;
    return choice;
  }
  if (type != "any" && type != "tool") {
    bad_request("tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\"", "tool_choice.type");
  }
  if (tools.empty()) bad_request(fmt::format("tool_choice \"{}\" needs tools", type), "tool_choice");
  if (type == "any") {
    choice.mode = ToolChoice::Mode::required;
    return choice;
  }
  return named_tool_choice(in, tools, "tool");
}

// thinking: {type: "enabled", budget_tokens} | {type: "adaptive"} | {type: "disabled"}.
bool read_thinking(const json* in) {
  if (!in) return false;
  if (!in->is_object()) bad_request("thinking must be an object", "thinking");
  const std::string type = string_member(*in, "type", "thinking");
  if (type == "disabled") return false;
  if (type == "adaptive") return true;
  if (type != "enabled")
    bad_request("thinking.type must be \"enabled\", \"adaptive\" or \"disabled\"", "thinking.type");
  // budget_tokens: integer >= 1024 in Anthropic's API; lily checks it is a positive integer.
  const json* budget = member(*in, "budget_tokens");
  if (!budget || !budget->is_number_integer() || budget->get<int64_t>() < 1) {
    bad_request("thinking.budget_tokens must be a positive integer", "thinking.budget_tokens");
  }
  return true;
}

}  // namespace

AnthropicRequest read_anthropic_request(const json& body, const SamplingParams& defaults, bool count_tokens) {
  AnthropicRequest r;
  Fields f(body);
  ChatRequest& chat = r.chat;

  // model: string, required by Anthropic. lily serves one model and answers under its own name.
  f.string("model");
  // max_tokens: integer, required. The maximum number of tokens to generate before stopping.
  chat.options.max_tokens = f.integer("max_tokens", 1, INT64_MAX / 2);
  if (!chat.options.max_tokens && !count_tokens) bad_request("max_tokens is required", "max_tokens");

  // system: string or array of text blocks. A system prompt.
  std::optional<std::string> system;
  if (const json* s = f.get("system")) system = text_or_blocks(*s, "system", "\n\n");
  // messages: array, required. Alternating user and assistant turns.
  const json* messages = f.array("messages");
  if (!messages) bad_request("messages is required", "messages");
  if (messages->empty()) bad_request("messages must not be empty", "messages");
  chat.messages = read_messages(*messages, system);

  // tools: array of {name, description, input_schema}. tool_choice: how the model uses them.
  json tools = json::array();
  if (const json* t = f.array("tools")) tools = read_tools(*t);
  if (!tools.empty()) chat.tools = tools;
  if (const json* choice = f.get("tool_choice")) chat.tool_choice = read_tool_choice(*choice, tools);

  // thinking: {type: "enabled", budget_tokens} turns extended thinking on; off by default.
  chat.template_options.enable_thinking = read_thinking(f.object("thinking"));
  chat.template_options.add_generation_prompt = true;
  if (count_tokens) return r;

  // stop_sequences: array of strings. Custom text sequences that cause the model to stop.
  if (const json* stops = f.array("stop_sequences")) {
    if (stops->size() > 16) bad_request("stop_sequences may hold at most 16 strings", "stop_sequences");
    for (const json& s : *stops) {
      if (!s.is_string()) bad_request("stop_sequences must be an array of strings", "stop_sequences");
      chat.options.stop.push_back(s.get<std::string>());
    }
  }
  // temperature: number 0-1. top_p: number 0-1. top_k: integer. Sampling as usual.
  chat.options.sampling = defaults;
  if (auto v = f.number("temperature", 0, 1)) chat.options.sampling.temperature = float(*v);
  if (auto v = f.number("top_p", 0, 1)) chat.options.sampling.top_p = float(*v);
  if (auto v = f.integer("top_k", 0, INT32_MAX)) chat.options.sampling.top_k = int(*v);
  // stream: boolean. Incrementally stream the response using server-sent events.
  r.stream = f.boolean("stream").value_or(false);
  // metadata: object ({user_id}). Accepted; lily keeps no records.
  f.object("metadata");
  // mcp_servers, container: features of Anthropic's servers.
  if (const json* mcp = f.array("mcp_servers"); mcp && !mcp->empty()) {
    bad_request("lily connects to no MCP servers", "mcp_servers");
  }
  if (f.get("container")) bad_request("lily runs no code containers", "container");
  return r;
}

}  // namespace lily::server
