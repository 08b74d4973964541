// output_constraint.cpp: choosing a reply's constraint, and the LRU of compiled grammars.
#include "runtime/output_constraint.h"

#include <algorithm>

#include "base/error.h"

namespace lily {

const json& tool_function(const json& tool) { return tool.contains("function") ? tool["function"] : tool; }

namespace {

bool is_nonempty_array(const json& j) { return j.is_array() && !j.empty(); }

std::optional<OutputConstraint> format_constraint(const ResponseFormat& format, bool thinking) {
  OutputConstraint c;
  c.thinking = thinking;
  switch (format.type) {
    case ResponseFormat::Type::text: return std::nullopt;
    case ResponseFormat::Type::json_object: c.kind = OutputConstraint::Kind::json_object; return c;
    case ResponseFormat::Type::json_schema:
      c.kind = OutputConstraint::Kind::json_schema;
      c.schema = format.schema;
      return c;
  }
  return std::nullopt;
}

}  // namespace

std::optional<OutputConstraint> chat_constraint(const ResponseFormat& format, const json& tools,
                                                const ToolChoice& choice, bool parallel_tool_calls, bool thinking) {
  OutputConstraint c;
  c.thinking = thinking;
  switch (choice.mode) {
    case ToolChoice::Mode::required:
    case ToolChoice::Mode::function:
      c.kind = OutputConstraint::Kind::tool_call;
      c.tools = tools;
      // A named choice asks for that function's call, not for several (OpenAI's behaviour).
      if (choice.mode == ToolChoice::Mode::function) c.tool_call = {choice.function, false};
      else c.tool_call = {std::nullopt, parallel_tool_calls};
      return c;
    case ToolChoice::Mode::none:
    case ToolChoice::Mode::automatic: break;
  }
  auto json_answer = format_constraint(format, thinking);
  if (json_answer && choice.mode == ToolChoice::Mode::automatic && is_nonempty_array(tools)) {
    json_answer->kind = OutputConstraint::Kind::tool_call_or_json;  // schema stays null for json_object
    json_answer->tools = tools;
    json_answer->tool_call = {std::nullopt, parallel_tool_calls};
    return json_answer;
  }
  if (json_answer) return json_answer;
  if (choice.mode == ToolChoice::Mode::none && is_nonempty_array(tools)) {
    c.kind = OutputConstraint::Kind::no_tool_call;
    return c;
  }
  return std::nullopt;
}

std::optional<OutputConstraint> text_constraint(const ResponseFormat& format) {
  return format_constraint(format, false);
}

std::string OutputConstraint::key() const {
  std::string k = std::to_string(int(kind)) + (thinking ? " thinking" : " answer");
  if (kind == Kind::tool_call || kind == Kind::tool_call_or_json) {
    k += tool_call.parallel ? " parallel" : " single";
    k += tool_call.function ? " function=" + *tool_call.function : " any";
  }
  // Replace, not throw, on invalid UTF-8: the server's JSON parser lets none through, but a key
  // is no place to fail.
  const auto compact = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  return k + "\n" + compact(schema) + "\n" + compact(tools);
}

grammar::Grammar OutputConstraint::build() const {
  grammar::GrammarOptions options;
  options.thinking = thinking;
  switch (kind) {
    case Kind::json_object: return grammar::json_object_grammar(options);
    case Kind::json_schema: return grammar::json_schema_grammar(schema, options);
    case Kind::tool_call: return grammar::tool_call_grammar(tools, tool_call, options);
    case Kind::tool_call_or_json:
      return grammar::tool_calls_or_json_grammar(tools, tool_call.parallel, schema.is_null() ? nullptr : &schema,
                                                 options);
    case Kind::no_tool_call: return grammar::no_tool_call_grammar(options);
  }
  throw Error("internal: an output constraint of an unknown kind");
}

const char* OutputConstraint::param(const std::string& refused_at) const {
  if (kind == Kind::tool_call_or_json) return refused_at.starts_with("#/tools/") ? "tools" : "response_format";
  return kind == Kind::tool_call ? "tools" : kind == Kind::no_tool_call ? "tool_choice" : "response_format";
}

GrammarCache::GrammarCache(const Tokenizer& tokenizer, int32_t vocab_size, size_t capacity)
    : tokenizer_(tokenizer), vocab_size_(vocab_size), capacity_(capacity) {}

std::shared_ptr<const grammar::Vocabulary> GrammarCache::vocabulary() {
  // Built once, on the first constrained request: ~250K token strings and their trie are worth
  // not building for a server that never sees one.
  std::call_once(vocabulary_once_, [&] {
    vocabulary_ = std::make_shared<const grammar::Vocabulary>(
        grammar::Vocabulary::from_tokenizer(tokenizer_, std::max(vocab_size_, tokenizer_.vocab_size())));
  });
  return vocabulary_;
}

std::shared_ptr<const grammar::CompiledGrammar> GrammarCache::get(const OutputConstraint& constraint) {
  const std::string key = constraint.key();
  {
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.hits;
      return it->second->second;
    }
    ++stats_.misses;
  }
  // Compiled outside the lock: another request's lookup need not wait for this one's schema.
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(constraint.build(), vocabulary());
  std::lock_guard lock(mutex_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;  // compiled meanwhile
  if (capacity_ == 0) return compiled;
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  stats_.entries = lru_.size();
  return compiled;
}

GrammarCache::Stats GrammarCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace lily
