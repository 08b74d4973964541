#include "server/wire.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "chat/json_limits.h"
#include "server/errors.h"

namespace lily::server {

json parse_body(const std::string& body) {
  bool too_deep = false;
  json j = parse_json_bounded(body, kMaxJsonNesting, &too_deep);
  if (too_deep)
    bad_request(fmt::format("the request body nests JSON deeper than {} levels", kMaxJsonNesting), "", "invalid_json");
  if (j.is_discarded()) {
    // Parsed again for the message only: the bounded parse above says just "not JSON". Its
    // nesting is bounded now, and a number beyond a double (1e309) throws out_of_range.
    try {
      const json reparsed = json::parse(body);
      (void)reparsed;
    } catch (const json::out_of_range& e) {
      bad_request(std::string("the request body holds a number out of range: ") + e.what(), "", "invalid_json");
    } catch (const json::exception& e) {
      bad_request(std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
    }
    bad_request("the request body is not valid JSON", "", "invalid_json");
  }
  if (!j.is_object()) bad_request("the request body must be a JSON object");
  return j;
}

const json* Fields::get(const std::string& name) const {
  auto it = object_.find(name);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> Fields::number(const std::string& name, double lo, double hi) const {
  const json* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request(name + " must be a number", name);
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad_request(fmt::format("{} must be between {} and {}", name, lo, hi), name);
  return x;
}

std::optional<int64_t> Fields::integer(const std::string& name, int64_t lo, int64_t hi) const {
  const json* v = get(name);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) bad_request(name + " is too large", name);
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
             std::floor(v->get<double>()) == v->get<double>() && std::fabs(v->get<double>()) < 9e15) {
    x = int64_t(v->get<double>());  // 5.0 is an integer in JSON Schema
  } else {
    bad_request(name + " must be an integer", name);
  }
  if (x < lo || x > hi) bad_request(fmt::format("{} must be between {} and {}", name, lo, hi), name);
  return x;
}

std::optional<bool> Fields::boolean(const std::string& name) const {
  const json* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_request(name + " must be a boolean", name);
  return v->get<bool>();
}

std::optional<std::string> Fields::string(const std::string& name) const {
  const json* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_request(name + " must be a string", name);
  return v->get<std::string>();
}

const json* Fields::object(const std::string& name) const {
  const json* v = get(name);
  if (v && !v->is_object()) bad_request(name + " must be an object", name);
  return v;
}

const json* Fields::array(const std::string& name) const {
  const json* v = get(name);
  if (v && !v->is_array()) bad_request(name + " must be an array", name);
  return v;
}

std::vector<std::string> Fields::stop_strings(size_t max) const {
  const json* v = get("stop");
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) bad_request("stop must be a string or an array of strings", "stop");
  if (v->size() > max) bad_request(fmt::format("stop may hold at most {} strings", max), "stop");
  std::vector<std::string> out;
  for (const json& s : *v) {
    if (!s.is_string()) bad_request("stop must be a string or an array of strings", "stop");
    out.push_back(s.get<std::string>());
  }
  return out;
}

SamplingParams read_sampling(const Fields& f, SamplingParams s) {
  // temperature: number or null, 0 to 2. What sampling temperature to use. Higher values like
  // 0.8 make the output more random, lower values like 0.2 more focused and deterministic.
  if (auto v = f.number("temperature", 0, 2)) s.temperature = float(*v);
  // top_p: number or null. Nucleus sampling: only the tokens comprising the top_p probability
  // mass are considered.
  if (auto v = f.number("top_p", 0, 1)) s.top_p = float(*v);
  // top_k (not OpenAI; vLLM, llama.cpp): integer, -1 or 0 = off.
  if (auto v = f.integer("top_k", -1, INT32_MAX)) s.top_k = int(std::max<int64_t>(*v, 0));
  // min_p (not OpenAI; vLLM, llama.cpp): number 0 to 1, 0 = off.
  if (auto v = f.number("min_p", 0, 1)) s.min_p = float(*v);
  // presence_penalty: number or null, -2.0 to 2.0. Positive values penalize new tokens based on
  // whether they appear in the text so far.
  if (auto v = f.number("presence_penalty", -2, 2)) s.presence_penalty = float(*v);
  // frequency_penalty: number or null, -2.0 to 2.0. Positive values penalize new tokens based on
  // their existing frequency in the text so far.
  if (auto v = f.number("frequency_penalty", -2, 2)) s.frequency_penalty = float(*v);
  // repetition_penalty (not OpenAI; vLLM, llama.cpp): number > 0, 1 = off.
  if (auto v = f.number("repetition_penalty", 1e-6, 10)) s.repetition_penalty = float(*v);
  // best_of (legacy completions, vLLM's chat before its V1 engine): integer or null, defaults to
  // 1. Generates best_of completions server-side and returns the best. lily generates one: a
  // request for more is refused rather than answered as if it had been honoured.
  if (auto b = f.integer("best_of", 1, INT32_MAX); b && *b != 1)
    bad_request("lily generates one completion per request: best_of must be 1", "best_of");
  // seed: integer or null. If specified, repeated requests with the same seed and parameters
  // should return the same result.
  if (const json* v = f.get("seed")) {
    if (!v->is_number_integer()) bad_request("seed must be an integer", "seed");
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
  }
  return s;
}

bool read_include_usage(const Fields& f, bool stream) {
  // stream_options: object or null. Options for streaming response. Only set this when you set
  // stream: true. include_usage: boolean. If set, an additional chunk will be streamed before
  // the data: [DONE] message, with the token usage statistics for the entire request.
  const json* o = f.object("stream_options");
  if (!o) return false;
  if (!stream) bad_request("stream_options is only allowed when stream is true", "stream_options");
  Fields options(*o);
  try {
    return options.boolean("include_usage").value_or(false);
  } catch (const ApiError& e) {
    bad_request(std::string(e.what()), "stream_options.include_usage");
  }
}

ResponseFormat read_response_format(const Fields& f) {
  // response_format: object. {"type": "text"} (the default), {"type": "json_object"} (JSON
  // mode: the reply is a JSON object), or {"type": "json_schema", "json_schema": {name,
  // description, schema, strict}} (Structured Outputs: the reply matches the JSON schema).
  ResponseFormat format;
  const json* o = f.object("response_format");
  if (!o) return format;
  const json type = o->value("type", json("text"));
  if (type == "text") return format;
  if (type == "json_object") {
    format.type = ResponseFormat::Type::json_object;
    return format;
  }
  if (type != "json_schema") {
    bad_request("response_format.type must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
  }
  auto spec = o->find("json_schema");
  if (spec == o->end() || !spec->is_object()) {
    bad_request("response_format.json_schema must be an object with the schema", "response_format.json_schema");
  }
  return json_schema_format(*spec, "response_format.json_schema");
}

ResponseFormat json_schema_format(const json& spec, const std::string& path) {
  // name: string, required by OpenAI (a-z, A-Z, 0-9, _ and -, at most 64): lily only checks the type.
  if (spec.contains("name") && !spec["name"].is_string()) bad_request(path + ".name must be a string", path + ".name");
  // strict: boolean or null. lily holds the reply to the schema either way.
  if (spec.contains("strict") && !spec["strict"].is_boolean() && !spec["strict"].is_null())
    bad_request(path + ".strict must be a boolean", path + ".strict");
  // schema: object. The schema for the response format, described as a JSON Schema object.
  ResponseFormat format;
  format.type = ResponseFormat::Type::json_schema;
  if (auto schema = spec.find("schema"); schema != spec.end() && !schema->is_null()) {
    if (!schema->is_object()) bad_request(path + ".schema must be a JSON schema object", path + ".schema");
    format.schema = *schema;
  }
  return format;
}

std::string item_path(const std::string& path, size_t i) { return fmt::format("{}[{}]", path, i); }

const json* member(const json& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::string string_member(const json& object, const char* name, const std::string& path) {
  const json* v = member(object, name);
  if (!v || !v->is_string()) bad_request(fmt::format("{}.{} must be a string", path, name), path + "." + name);
  return v->get<std::string>();
}

json function_tool(const json& tool, const std::string& path, const char* schema_key) {
  const std::string name = string_member(tool, "name", path);
  if (name.empty()) bad_request(path + ".name must not be empty", path + ".name");
  json function{{"name", name}};
  if (const json* description = member(tool, "description")) {
    if (!description->is_string()) bad_request(path + ".description must be a string", path + ".description");
    function["description"] = *description;
  }
  if (const json* schema = member(tool, schema_key)) {
    const std::string at = path + "." + schema_key;
    if (!schema->is_object()) bad_request(at + " must be an object", at);
    function["parameters"] = *schema;
  }
  return json{{"type", "function"}, {"function", std::move(function)}};
}

bool has_function_tool(const json& tools, const std::string& name) {
  return std::any_of(tools.begin(), tools.end(), [&](const json& t) { return t["function"]["name"] == name; });
}

ToolChoice named_tool_choice(const json& choice_object, const json& tools, const char* noun) {
  ToolChoice choice;
  choice.mode = ToolChoice::Mode::function;
  choice.function = string_member(choice_object, "name", "tool_choice");
  if (!has_function_tool(tools, choice.function)) {
    bad_request(fmt::format("tool_choice names the {} \"{}\", which is not in tools", noun, choice.function),
                "tool_choice.name");
  }
  return choice;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string new_response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() % 16];
  return id;
}

json completion_tokens_details_json(const Usage& u) {
  json details{{"reasoning_tokens", u.reasoning_tokens}};
  // accepted_prediction_tokens: "When using Predicted Outputs, the number of tokens in the
  // prediction that appeared in the completion." rejected_prediction_tokens: "... the number of
  // tokens in the prediction that did not appear in the completion. However, like reasoning
  // tokens, these tokens are still counted in the total completion tokens for purposes of
  // billing". Here the prediction is the MTP head's drafts (--speculate).
  if (u.predictions) {
    details["accepted_prediction_tokens"] = u.predictions->accepted;
    details["rejected_prediction_tokens"] = u.predictions->rejected;
  }
  return details;
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", json{{"cached_tokens", u.cached_tokens}}},
              {"completion_tokens_details", completion_tokens_details_json(u)}};
}

json ResponseEnvelope::chunk(json choices) const {
  json c{{"id", id},
         {"object", object},
         {"created", created},
         {"model", model},
         {"system_fingerprint", "lily"},
         {"choices", std::move(choices)}};
  if (usage_chunk) c["usage"] = nullptr;
  return c;
}

json ResponseEnvelope::usage_event(const Usage& usage) const {
  json u = chunk(json::array());
  u["usage"] = usage_json(usage);
  return u;
}

namespace {
json bytes_json(const std::string& bytes) {
  json a = json::array();
  for (unsigned char c : bytes) a.push_back(int(c));
  return a;
}
}  // namespace

json chat_logprobs_json(const std::vector<TokenLogprobs>& logprobs) {
  json content = json::array();
  for (const TokenLogprobs& t : logprobs) {
    json top = json::array();
    for (const LogprobAlternative& a : t.top) {
      top.push_back(json{{"token", a.token}, {"logprob", a.logprob}, {"bytes", bytes_json(a.bytes)}});
    }
    content.push_back(json{{"token", t.chosen.token},
                           {"logprob", t.chosen.logprob},
                           {"bytes", bytes_json(t.chosen.bytes)},
                           {"top_logprobs", top}});
  }
  return json{{"content", content}, {"refusal", nullptr}};
}

}  // namespace lily::server
