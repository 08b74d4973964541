// chat_template.cpp: tools/qwen36_chat_template.jinja, rendered natively (see chat_template.h).
//
// The functions follow the template top to bottom; each block quotes the template lines it
// implements. Errors are raised in the order the template evaluates them, so an input with
// several faults fails with the same message as in Python.
#include "chat/chat_template.h"

#include <string_view>
#include <utility>

#include "chat/json_limits.h"
#include "chat/python_format.h"

namespace lily {
namespace {

constexpr std::string_view kImagePlaceholder = "<|vision_start|><|image_pad|><|vision_end|>";
constexpr std::string_view kVideoPlaceholder = "<|vision_start|><|video_pad|><|vision_end|>";

constexpr std::string_view kToolsHeader = "# Tools\n\nYou have access to the following functions:\n\n<tools>";

constexpr std::string_view kToolsInstructions =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must "
    "be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the "
    "function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>";

// A refusal spelled exactly as the template's raise_exception(...) spells it.
[[noreturn]] void refuse(std::string_view message) { throw TemplateError(std::string(message)); }

// A malformed request, naming the field.
template <typename... Args>
[[noreturn]] void invalid(fmt::format_string<Args...> format, Args&&... args) {
  throw TemplateError(fmt::format(format, std::forward<Args>(args)...));
}

const json* find(const json& object, std::string_view key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// Roles were checked to be strings by prepare_messages().
const std::string& role_of(const json& message) { return message["role"].get_ref<const std::string&>(); }

// ---------------------------------------------------------------------------------------------
// Pre-processing (what the server does before the template sees the messages)
// ---------------------------------------------------------------------------------------------

// OpenAI sends tool-call arguments as a JSON string; the template iterates `arguments|items`,
// so it needs the object (vLLM chat_utils _postprocess_messages: "" -> {}).
json parse_arguments(const std::string& text, const std::string& path) {
  if (text.find_first_not_of(" \t\n\r") == std::string::npos) return json::object();
  bool too_deep = false;
  json parsed = parse_json_bounded(text, kMaxJsonNesting, &too_deep);
  if (too_deep) invalid("{} nests JSON deeper than {} levels", path, kMaxJsonNesting);
  if (parsed.is_discarded()) invalid("{} is not valid JSON", path);
  if (!parsed.is_object()) invalid("{} is not a JSON object", path);
  return parsed;
}

void prepare_tool_call(json& call, const std::string& path) {
  if (!call.is_object()) invalid("{} must be an object", path);
  // {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}
  json* function = &call;
  std::string function_path = path;
  if (call.contains("function")) {
    function = &call["function"];
    function_path += ".function";
    if (!function->is_object()) invalid("{} must be an object", function_path);
  }
  const json* name = find(*function, "name");
  if (!name || !name->is_string()) invalid("{}.name must be a string", function_path);
  auto arguments = function->find("arguments");
  if (arguments == function->end()) return;
  if (arguments->is_string()) {
    *arguments = parse_arguments(arguments->get<std::string>(), function_path + ".arguments");
  } else if (!arguments->is_object()) {
    invalid("{}.arguments must be a JSON object or a string holding one", function_path);
  }
}

void prepare_assistant(json& message, const std::string& path) {
  // vLLM sends both names; the template reads reasoning_content.
  const json* reasoning_content = find(message, "reasoning_content");
  const json* reasoning = find(message, "reasoning");
  if (!(reasoning_content && reasoning_content->is_string()) && reasoning && reasoning->is_string()) {
    message["reasoning_content"] = *reasoning;
  }
  auto calls = message.find("tool_calls");
  if (calls == message.end() || calls->is_null()) return;
  if (!calls->is_array()) invalid("{}.tool_calls must be an array", path);
  for (size_t j = 0; j < calls->size(); ++j) {
    prepare_tool_call((*calls)[j], fmt::format("{}.tool_calls[{}]", path, j));
  }
}

// What the template would render without lily being able to honour it: media parts (there is
// no vision or audio encoder behind the placeholder tokens).
void refuse_media(const json& message, const std::string& path) {
  const json* content = find(message, "content");
  if (!content || !content->is_array()) return;
  for (size_t j = 0; j < content->size(); ++j) {
    const json& item = (*content)[j];
    if (!item.is_object()) continue;  // the renderer names it
    const json* type = find(item, "type");
    auto type_is = [&](std::string_view t) { return type && type->is_string() && *type == t; };
    const std::string part = fmt::format("{}.content[{}]", path, j);
    // The template's own tests: 'image' in item or 'image_url' in item or item.type == 'image'.
    if (item.contains("image") || item.contains("image_url") || type_is("image") || type_is("image_url"))
      invalid("lily has no vision encoder: image inputs are refused ({} is an image)", part);
    if (item.contains("video") || type_is("video") || type_is("video_url"))
      invalid("lily has no vision encoder: video inputs are refused ({} is a video)", part);
    if (item.contains("input_audio") || item.contains("audio") || type_is("input_audio") || type_is("audio"))
      invalid("lily has no audio encoder: audio inputs are refused ({} is audio)", part);
  }
}

bool is_known_role(const json& role) {
  for (const char* known : {"system", "developer", "user", "assistant", "tool"})
    if (role == known) return true;
  return false;
}

json prepare_messages(const json& messages, const ChatTemplateOptions& options) {
  if (messages.is_null()) return json::array();
  if (!messages.is_array()) invalid("messages must be an array");
  if (options.lily_refusals) {
    // Before the copy below, which recurses once per level.
    if (json_nests_deeper_than(messages, kMaxJsonNesting))
      invalid("messages nest JSON deeper than {} levels", kMaxJsonNesting);
    for (size_t i = 0; i < messages.size(); ++i) {
      const json& message = messages[i];
      const std::string path = fmt::format("messages[{}]", i);
      if (!message.is_object()) continue;  // named below
      auto role = message.find("role");
      if (role != message.end() && role->is_string() && !is_known_role(*role))
        invalid("{}.role \"{}\" is not a role lily knows (system, developer, user, assistant, tool)", path,
                role->get<std::string>());
      refuse_media(message, path);
    }
  }
  json prepared = messages;
  for (size_t i = 0; i < prepared.size(); ++i) {
    json& message = prepared[i];
    std::string path = fmt::format("messages[{}]", i);
    if (!message.is_object()) invalid("{} must be an object", path);
    auto role = message.find("role");
    if (role == message.end() || !role->is_string()) invalid("{}.role must be a string", path);
    if (*role == "developer") *role = "system";
    if (*role == "assistant") prepare_assistant(message, path);
  }
  return prepared;
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

// {%- macro render_content(content, do_vision_count, is_system_content=false) %}
// (vision ids are off: add_vision_id is never set, so the counters never show.)
std::string render_content(const json& message, const std::string& path, bool is_system_content) {
  const json* content = find(message, "content");
  // {%- elif content is none or content is undefined %}
  if (!content || content->is_null()) return "";
  if (content->is_string()) return content->get<std::string>();
  // {%- elif content is iterable and content is not mapping %} ... {%- else %} raise
  if (!content->is_array()) refuse("Unexpected content type.");
  std::string out;
  for (size_t j = 0; j < content->size(); ++j) {
    const json& item = (*content)[j];
    if (!item.is_object()) invalid("{}.content[{}] must be an object", path, j);
    const json* type = find(item, "type");
    auto type_is = [&](std::string_view t) { return type && type->is_string() && *type == t; };
    // {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
    if (item.contains("image") || item.contains("image_url") || type_is("image")) {
      if (is_system_content) refuse("System message cannot contain images.");
      out += kImagePlaceholder;
    } else if (item.contains("video") || type_is("video")) {
      if (is_system_content) refuse("System message cannot contain videos.");
      out += kVideoPlaceholder;
    } else if (const json* text = find(item, "text")) {
      // {{- item.text }}: Python str() of the value.
      if (text->is_object() || text->is_array()) invalid("{}.content[{}].text must be a string", path, j);
      out += python::str(*text);
    } else {
      refuse("Unexpected item type in content.");
    }
  }
  return out;
}

// render_content(...)|trim
std::string trimmed_content(const json& message, const std::string& path, bool is_system_content) {
  return std::string(python::strip(render_content(message, path, is_system_content)));
}

// The system turn: the tools preamble first, then the system prompt (spec §3.2).
void render_system(std::string& out, const json& messages, const json& tools) {
  const json& first = messages[0];
  bool first_is_system = role_of(first) == "system";
  // {%- if tools and tools is iterable and tools is not mapping %}
  if (tools.is_array() && !tools.empty()) {
    out += "<|im_start|>system\n";
    out += kToolsHeader;
    for (const json& tool : tools) {
      out += '\n';
      out += python::json_dumps(tool);  // tool | tojson
    }
    out += "\n</tools>";
    out += kToolsInstructions;
    if (first_is_system) {
      std::string content = trimmed_content(first, "messages[0]", /*is_system_content=*/true);
      if (!content.empty()) out += "\n\n" + content;
    }
    out += "<|im_end|>\n";
  } else if (first_is_system) {
    std::string content = trimmed_content(first, "messages[0]", /*is_system_content=*/true);
    out += "<|im_start|>system\n" + content + "<|im_end|>\n";
  }
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// ns.last_query_index: the last user message that is not a wrapped tool response.
size_t last_query_index(const json& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    const json& message = messages[i];
    if (role_of(message) != "user") continue;
    std::string content = trimmed_content(message, fmt::format("messages[{}]", i), false);
    if (!(starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>"))) return i;
  }
  refuse("No user query found in messages.");
}

// Splits "<think>R</think>C" content when reasoning_content is not given:
//   reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
//   content   = content.split('</think>')[-1].lstrip('\n')
void split_reasoning(std::string& content, std::string& reasoning) {
  size_t first_close = content.find("</think>");
  if (first_close == std::string::npos) return;
  std::string_view before = python::rstrip(std::string_view(content).substr(0, first_close), "\n");
  size_t open = before.rfind("<think>");
  if (open != std::string_view::npos) before = before.substr(open + std::string_view("<think>").size());
  reasoning = std::string(python::lstrip(before, "\n"));
  size_t last_close = content.rfind("</think>");
  content = std::string(python::lstrip(std::string_view(content).substr(last_close + 8), "\n"));
}

void render_tool_calls(std::string& out, const json& calls, const std::string& content) {
  bool first = true;
  for (const json& call : calls) {
    const json& function = call.contains("function") ? call["function"] : call;
    const std::string& name = function["name"].get_ref<const std::string&>();
    if (!first) {
      out += '\n';
    } else if (!python::strip(content).empty()) {  // {%- if content|trim %}
      out += "\n\n";
    }
    first = false;
    out += "<tool_call>\n<function=" + name + ">\n";
    if (const json* arguments = find(function, "arguments")) {
      for (const auto& [key, value] : arguments->items()) {
        // args_value | string if args_value is string else args_value | tojson | safe
        out += "<parameter=" + key + ">\n";
        out += value.is_string() ? value.get<std::string>() : python::json_dumps(value);
        out += "\n</parameter>\n";
      }
    }
    out += "</function>\n</tool_call>";
  }
}

void render_assistant(std::string& out, const json& message, std::string content, bool keep_thinking) {
  std::string reasoning;
  const json* reasoning_content = find(message, "reasoning_content");
  if (reasoning_content && reasoning_content->is_string()) {
    reasoning = reasoning_content->get<std::string>();
  } else {
    split_reasoning(content, reasoning);
  }
  reasoning = std::string(python::strip(reasoning));
  // (preserve_thinking is true) or (loop.index0 > ns.last_query_index)
  if (keep_thinking) {
    out += "<|im_start|>assistant\n<think>\n" + reasoning + "\n</think>\n\n" + content;
  } else {
    out += "<|im_start|>assistant\n" + content;
  }
  const json* calls = find(message, "tool_calls");
  if (calls && calls->is_array()) render_tool_calls(out, *calls, content);
  out += "<|im_end|>\n";
}

// Consecutive tool results share one user turn.
void render_tool(std::string& out, const json& messages, size_t i, const std::string& content) {
  // {%- if loop.previtem and loop.previtem.role != "tool" %}
  if (i > 0 && role_of(messages[i - 1]) != "tool") out += "<|im_start|>user";
  out += "\n<tool_response>\n" + content + "\n</tool_response>";
  if (i + 1 == messages.size() || role_of(messages[i + 1]) != "tool") out += "<|im_end|>\n";
}

std::string render_prepared(const json& messages, const json& tools, const ChatTemplateOptions& options) {
  if (messages.empty()) refuse("No messages provided.");
  std::string out;
  render_system(out, messages, tools);
  size_t last_query = last_query_index(messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& message = messages[i];
    std::string content = trimmed_content(message, fmt::format("messages[{}]", i), false);
    const std::string& role = role_of(message);
    if (role == "system") {
      if (i != 0) refuse("System message must be at the beginning.");
    } else if (role == "user") {
      out += "<|im_start|>user\n" + content + "<|im_end|>\n";
    } else if (role == "assistant") {
      render_assistant(out, message, std::move(content), options.preserve_thinking || i > last_query);
    } else if (role == "tool") {
      render_tool(out, messages, i, content);
    } else {
      refuse("Unexpected message role.");
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += options.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return out;
}

// Reads an optional boolean field; null counts as absent.
void read_bool(const json& object, const char* key, std::string_view path, bool& field) {
  const json* value = find(object, key);
  if (!value || value->is_null()) return;
  if (!value->is_boolean()) invalid("{} must be a boolean", path);
  field = value->get<bool>();
}

}  // namespace

std::string render_chat_template(const json& messages, const json& tools, const ChatTemplateOptions& options) {
  if (!tools.is_null() && !tools.is_array()) invalid("tools must be an array");
  if (options.lily_refusals && json_nests_deeper_than(tools, kMaxJsonNesting))
    invalid("tools nest JSON deeper than {} levels", kMaxJsonNesting);
  return render_prepared(prepare_messages(messages, options), tools, options);
}

ChatTemplateOptions chat_template_options(const json& request) {
  ChatTemplateOptions options;
  read_bool(request, "add_generation_prompt", "add_generation_prompt", options.add_generation_prompt);
  // OpenAI reasoning_effort "none" switches thinking off (as llama.cpp does).
  if (const json* effort = find(request, "reasoning_effort"); effort && *effort == "none") {
    options.enable_thinking = false;
  }
  read_bool(request, "enable_thinking", "enable_thinking", options.enable_thinking);
  const json* kwargs = find(request, "chat_template_kwargs");
  if (kwargs && !kwargs->is_null()) {
    if (!kwargs->is_object()) invalid("chat_template_kwargs must be an object");
    read_bool(*kwargs, "enable_thinking", "chat_template_kwargs.enable_thinking", options.enable_thinking);
    read_bool(*kwargs, "preserve_thinking", "chat_template_kwargs.preserve_thinking", options.preserve_thinking);
  }
  return options;
}

std::string render_chat_request(const json& request) {
  if (!request.is_object()) invalid("the request must be a JSON object");
  const json* messages = find(request, "messages");
  const json* tools = find(request, "tools");
  // References, not `messages ? *messages : json()`: that copies, and a copy recurses once per
  // level before render_chat_template can measure the nesting.
  static const json kNull;
  return render_chat_template(messages ? *messages : kNull, tools ? *tools : kNull, chat_template_options(request));
}

}  // namespace lily
