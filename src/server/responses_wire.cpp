// responses_wire.cpp: a Responses API request -> a ChatRequest (see responses_wire.h).
//
// Each field is read under the line of OpenAI's API reference it implements.
#include "server/responses_wire.h"

#include <algorithm>

namespace lily::server {
namespace {

// A message's content: a string, or parts of the given text types (joined).
std::string content_text(const json& content, const std::string& path, std::initializer_list<const char*> types) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(path + " must be a string or an array of content parts", path);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part = item_path(path, i);
    if (!content[i].is_object()) bad_request(part + " must be an object", part);
    const std::string type = string_member(content[i], "type", part);
    if (type == "input_image" || type == "input_file" || type == "input_audio") {
      bad_request(fmt::format("lily reads text only: {} is {}", part, type), part + ".type");
    }
    if (type == "refusal") {
      text += string_member(content[i], "refusal", part);
      continue;
    }
    if (std::none_of(types.begin(), types.end(), [&](const char* t) { return type == t; })) {
      bad_request(fmt::format("{}.type \"{}\" is not a content part lily takes here", part, type), part + ".type");
    }
    text += string_member(content[i], "text", part);
  }
  return text;
}

// The input items as chat messages. Reasoning items wait for the assistant turn they belong
// to; function calls join the assistant message just before them or start one.
class InputReader {
 public:
  explicit InputReader(json& messages) : messages_(messages) {}

  void item(const json& item, const std::string& path) {
    if (!item.is_object()) bad_request(path + " must be an object", path);
    const json* type = member(item, "type");
    if (type && !type->is_string()) bad_request(path + ".type must be a string", path + ".type");
    const std::string kind = type ? type->get<std::string>() : "message";  // an "easy" message has no type
    if (kind == "message") return message(item, path);
    if (kind == "reasoning") return reasoning(item, path);
    if (kind == "function_call") return function_call(item, path);
    if (kind == "function_call_output") return function_call_output(item, path);
    if (kind == "item_reference") bad_request(path + " is an item_reference: lily stores no items", path + ".type");
    bad_request(
        fmt::format("{}.type \"{}\" is not an input item lily takes (hosted tools are not supported)", path, kind),
        path + ".type");
  }

 private:
  void message(const json& item, const std::string& path) {
    const std::string role = string_member(item, "role", path);
    const json* content = member(item, "content");
    if (!content) bad_request(path + ".content is required", path + ".content");
    if (role == "assistant") {
      json m{{"role", "assistant"},
             {"content", content_text(*content, path + ".content", {"output_text", "input_text"})}};
      take_reasoning(m);
      messages_.push_back(std::move(m));
      return;
    }
    if (role != "user" && role != "system" && role != "developer") {
      bad_request(path + ".role must be user, assistant, system or developer", path + ".role");
    }
    messages_.push_back(json{{"role", role}, {"content", content_text(*content, path + ".content", {"input_text"})}});
  }

  void reasoning(const json& item, const std::string& path) {
    std::string text;
    if (const json* content = member(item, "content"); content && content->is_array() && !content->empty()) {
      text = content_text(*content, path + ".content", {"reasoning_text"});
    } else if (const json* summary = member(item, "summary")) {
      text = content_text(*summary, path + ".summary", {"summary_text"});
    }
    reasoning_ += text;
  }

  void function_call(const json& item, const std::string& path) {
    const std::string call_id = string_member(item, "call_id", path);
    const std::string name = string_member(item, "name", path);
    const std::string arguments = string_member(item, "arguments", path);  // the template parses it
    json call{{"id", call_id}, {"type", "function"}, {"function", json{{"name", name}, {"arguments", arguments}}}};
    if (messages_.empty() || messages_.back()["role"] != "assistant") {
      json m{{"role", "assistant"}, {"content", ""}};
      take_reasoning(m);
      messages_.push_back(std::move(m));
    }
    json& m = messages_.back();
    if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
    m["tool_calls"].push_back(std::move(call));
  }

  void function_call_output(const json& item, const std::string& path) {
    const std::string call_id = string_member(item, "call_id", path);
    const json* output = member(item, "output");
    if (!output) bad_request(path + ".output is required", path + ".output");
    messages_.push_back(json{{"role", "tool"},
                             {"tool_call_id", call_id},
                             {"content", content_text(*output, path + ".output", {"input_text", "output_text"})}});
  }

  void take_reasoning(json& assistant) {
    if (!reasoning_.empty()) assistant["reasoning_content"] = std::exchange(reasoning_, std::string());
  }

  json& messages_;
  std::string reasoning_;
};

// instructions and the leading system / developer items become one system message (the
// template takes a system message first only).
json read_input(const json& input, const std::optional<std::string>& instructions) {
  json messages = json::array();
  if (input.is_string()) {
    messages.push_back(json{{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    InputReader reader(messages);
    for (size_t i = 0; i < input.size(); ++i) reader.item(input[i], item_path("input", i));
  } else {
    bad_request("input must be a string or an array of input items", "input");
  }
  std::vector<std::string> system;
  if (instructions) system.push_back(*instructions);
  size_t leading = 0;
  for (; leading < messages.size(); ++leading) {
    const json& role = messages[leading]["role"];
    if (role != "system" && role != "developer") break;
    system.push_back(messages[leading]["content"].get<std::string>());
  }
  messages.erase(messages.begin(), messages.begin() + int64_t(leading));
  if (!system.empty()) {
    std::string text;
    for (const std::string& s : system) text += (text.empty() ? "" : "\n\n") + s;
    messages.insert(messages.begin(), json{{"role", "system"}, {"content", text}});
  }
  return messages;
}

// tools: function tools as chat tools.
json read_tools(const json& in) {
  json tools = json::array();
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string path = item_path("tools", i);
    if (!in[i].is_object()) bad_request(path + " must be an object", path);
    const std::string type = string_member(in[i], "type", path);
    if (type != "function") {
      bad_request(fmt::format("{}.type \"{}\" is a hosted tool; lily runs none (function tools only)", path, type),
                  path + ".type");
    }
    if (const json* strict = member(in[i], "strict"); strict && !strict->is_boolean()) {
      bad_request(path + ".strict must be a boolean", path + ".strict");
    }
    tools.push_back(function_tool(in[i], path, "parameters"));
  }
  return tools;
}

// tool_choice: "none" | "auto" | "required" | {type: "function", name}.
ToolChoice read_tool_choice(const json& v, const json& tools) {
  ToolChoice choice;
  if (v.is_string()) {
    if (v == "auto") return choice;
    if (v == "none") choice.mode = ToolChoice::Mode::none;
    else if (v == "required") choice.mode = ToolChoice::Mode::required;
    else
      bad_request("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}",
                  "tool_choice");
    return choice;
  }
  if (!v.is_object()) bad_request("tool_choice must be a string or an object", "tool_choice");
  const std::string type = string_member(v, "type", "tool_choice");
  if (type != "function") {
    bad_request(fmt::format("tool_choice type \"{}\" is not supported (function only)", type), "tool_choice.type");
  }
  return named_tool_choice(v, tools, "function");
}

// reasoning: {effort, summary}: effort "none" turns Qwen's thinking off.
bool read_reasoning(const json* reasoning) {
  if (!reasoning) return true;
  Fields f(*reasoning);
  const std::optional<std::string> effort = f.string("effort");
  if (!effort) return true;
  static const char* levels[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
  if (std::find(std::begin(levels), std::end(levels), *effort) == std::end(levels)) {
    bad_request("reasoning.effort must be one of none, minimal, low, medium, high, xhigh", "reasoning.effort");
  }
  return *effort != "none";
}

// text: {format}. {type: "text"} (the default), {type: "json_object"}, or {type: "json_schema",
// name, schema, description, strict}: the Responses API's form of chat's response_format (the
// schema sits beside the type, not under json_schema); the reply is held to it by constrained
// decoding, as on /v1/chat/completions.
ResponseFormat read_text_format(const json* text) {
  ResponseFormat format;
  if (!text) return format;
  const json* spec = member(*text, "format");
  if (!spec) return format;
  if (!spec->is_object()) bad_request("text.format must be an object", "text.format");
  const std::string type = string_member(*spec, "type", "text.format");
  if (type == "text") return format;
  if (type == "json_object") {
    format.type = ResponseFormat::Type::json_object;
    return format;
  }
  if (type != "json_schema") {
    bad_request(fmt::format("text.format.type must be \"text\", \"json_object\" or \"json_schema\", not \"{}\"", type),
                "text.format.type");
  }
  return json_schema_format(*spec, "text.format");
}

// The refusals of a stateless server.
void refuse_stateful(const Fields& f) {
  if (f.get("previous_response_id")) {
    bad_request("lily keeps no responses (store is not supported): send the whole conversation in input instead "
                "of previous_response_id",
                "previous_response_id");
  }
  if (f.get("conversation")) bad_request("lily keeps no conversations: send them in input", "conversation");
  if (f.boolean("background").value_or(false))
    bad_request("lily does not run responses in the background", "background");
  if (f.get("prompt")) bad_request("lily stores no prompt templates", "prompt");
}

}  // namespace

ResponsesRequest read_responses_request(const json& body, const SamplingParams& defaults) {
  ResponsesRequest r;
  Fields f(body);
  ChatRequest& chat = r.chat;
  refuse_stateful(f);

  // model: string. lily serves one model and answers under its own name.
  f.string("model");
  // instructions: string. A system (or developer) message inserted into the model's context.
  const std::optional<std::string> instructions = f.string("instructions");
  // input: string or array. Text, or input items: messages, reasoning, function calls and outputs.
  const json* input = f.get("input");
  if (!input) bad_request("input is required", "input");
  chat.messages = read_input(*input, instructions);
  if (chat.messages.empty()) bad_request("input must not be empty", "input");

  // tools: array. tool_choice: how the model picks them. parallel_tool_calls: accepted.
  json tools = json::array();
  if (const json* t = f.array("tools")) tools = read_tools(*t);
  if (!tools.empty()) chat.tools = tools;
  if (const json* choice = f.get("tool_choice")) chat.tool_choice = read_tool_choice(*choice, tools);
  const bool parallel = f.boolean("parallel_tool_calls").value_or(true);

  // max_output_tokens: integer. An upper bound for the tokens generated, reasoning included.
  chat.options.max_tokens = f.integer("max_output_tokens", 1, INT64_MAX / 2);
  // temperature: 0-2. top_p: 0-1.
  chat.options.sampling = defaults;
  if (auto v = f.number("temperature", 0, 2)) chat.options.sampling.temperature = float(*v);
  if (auto v = f.number("top_p", 0, 1)) chat.options.sampling.top_p = float(*v);
  // top_logprobs: integer 0-20. lily returns no logprobs here.
  if (auto v = f.integer("top_logprobs", 0, 20); v && *v > 0) {
    bad_request("lily returns no logprobs on /v1/responses", "top_logprobs");
  }
  // reasoning: {effort, summary}. text: {format, verbosity}.
  const json* reasoning = f.object("reasoning");
  chat.template_options.enable_thinking = read_reasoning(reasoning);
  chat.template_options.add_generation_prompt = true;
  const json* text = f.object("text");
  chat.response_format = read_text_format(text);
  chat.parallel_tool_calls = parallel;
  // stream: boolean. store: boolean (nothing is stored either way). metadata: object.
  r.stream = f.boolean("stream").value_or(false);
  f.boolean("store");
  const json* metadata = f.object("metadata");
  f.array("include");

  r.settings = json{{"instructions", instructions ? json(*instructions) : json(nullptr)},
                    {"max_output_tokens", chat.options.max_tokens ? json(*chat.options.max_tokens) : json(nullptr)},
                    {"parallel_tool_calls", parallel},
                    {"previous_response_id", nullptr},
                    {"reasoning", json{{"effort", reasoning && reasoning->contains("effort") ? (*reasoning)["effort"]
                                                                                             : json(nullptr)},
                                       {"summary", nullptr}}},
                    {"store", false},
                    {"temperature", chat.options.sampling.temperature},
                    {"text", text && text->contains("format") ? *text : json{{"format", json{{"type", "text"}}}}},
                    {"tool_choice", f.get("tool_choice") ? *f.get("tool_choice") : json("auto")},
                    {"tools", f.get("tools") ? *f.get("tools") : json::array()},
                    {"top_p", chat.options.sampling.top_p},
                    {"truncation", "disabled"},
                    {"metadata", metadata ? *metadata : json::object()}};
  return r;
}

}  // namespace lily::server
