// wire.h: JSON <-> the runtime's structs, shared by the endpoints.
//
// Reading: Fields gives typed access to a request's fields; a field of the wrong type or out of
// range is a 400 naming it. null counts as absent (OpenAI documents most fields "or null").
// Fields the server does not know are ignored (vLLM's policy); fields it knows but cannot honour
// are refused by the endpoint with a 400 saying so.
#pragma once

#include <nlohmann/json.hpp>

#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "runtime/chat_service.h"

namespace lily::server {

using json = nlohmann::ordered_json;

// The body as a JSON object, or a 400: not valid JSON, JSON nested deeper than kMaxJsonNesting
// (chat/json_limits.h: nothing recursive downstream can then run out of stack), a number
// beyond a double's range (1e309), not an object.
json parse_body(const std::string& body);

class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}
  const json* get(const std::string& name) const;  // nullptr when absent or null
  std::optional<double> number(const std::string& name, double lo, double hi) const;
  std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) const;
  std::optional<bool> boolean(const std::string& name) const;
  std::optional<std::string> string(const std::string& name) const;
  const json* object(const std::string& name) const;
  const json* array(const std::string& name) const;
  // "stop": a string or an array of up to `max` strings.
  std::vector<std::string> stop_strings(size_t max) const;

 private:
  const json& object_;
};

// The sampling fields both completion endpoints share (temperature, top_p, top_k, min_p,
// presence/frequency/repetition penalties, seed), over the defaults of generation_config.json;
// best_of other than 1 is refused (lily generates one completion).
SamplingParams read_sampling(const Fields& f, SamplingParams defaults);
// stream_options.include_usage (400 when stream_options is given without stream).
bool read_include_usage(const Fields& f, bool stream);
// response_format (both completion endpoints): text, json_object or json_schema. The schema's
// keywords are checked when the service compiles it (ChatService::prepare_*: a 400 naming the
// keyword lily does not support).
ResponseFormat read_response_format(const Fields& f);

// Reading parts of a request that Fields does not reach (the items of an array), each error a
// 400 naming the JSON path of what it refuses ("messages[2].content").
std::string item_path(const std::string& path, size_t i);  // "path[i]"
const json* member(const json& object, const char* name);  // nullptr when absent or null
// object[name] as a string; a 400 naming path.name when it is absent or not a string.
std::string string_member(const json& object, const char* name, const std::string& path);
// A function tool of the Anthropic and Responses APIs ({name, description, <schema_key>}) as a chat
// tool: {"type": "function", "function": {name, description, parameters}}. The name must be a
// non-empty string, the description a string, the schema an object; absent ones are left out.
json function_tool(const json& tool, const std::string& path, const char* schema_key);
bool has_function_tool(const json& tools, const std::string& name);  // among function_tool()'s results
// A tool_choice object that names one of `tools` ({..., name}); `noun` as the API calls it in the
// 400 when the name is not among them ("tool", "function").
ToolChoice named_tool_choice(const json& choice, const json& tools, const char* noun);
// The json_schema form of a response format, its spec at `path` ({name, strict, schema}, as both
// chat's response_format.json_schema and the Responses API's text.format carry them).
ResponseFormat json_schema_format(const json& spec, const std::string& path);

// One-line JSON; invalid UTF-8 (never expected) becomes U+FFFD instead of throwing.
std::string dump(const json& j);

std::string new_response_id(const std::string& prefix);  // prefix + 24 hex digits
// OpenAI's usage object: prompt / completion / total tokens, prompt_tokens_details.cached_tokens,
// completion_tokens_details (completion_tokens_details_json).
json usage_json(const Usage& usage);
// reasoning_tokens, and, when the decode speculated (Usage::predictions), the drafts kept and
// refused as accepted_prediction_tokens / rejected_prediction_tokens (absent otherwise).
json completion_tokens_details_json(const Usage& usage);

// The fields every object of one response carries (id, object, created, model,
// system_fingerprint) around its choices. usage_chunk: the client asked for a final usage chunk
// (stream_options.include_usage), so every chunk carries "usage": null and usage_event() is that
// final chunk (empty choices, the usage).
struct ResponseEnvelope {
  std::string id, object;
  std::time_t created = 0;
  std::string model;
  bool usage_chunk = false;
  json chunk(json choices) const;
  json usage_event(const Usage& usage) const;
};
json chat_logprobs_json(const std::vector<TokenLogprobs>& logprobs);

}  // namespace lily::server
