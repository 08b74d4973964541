// output_constraint.h: what a request holds its reply to (tool_choice, response_format), as a
// grammar for constrained decoding (src/grammar, docs/grammar.md), and the service's cache of
// compiled grammars.
//
// The constraint of a chat reply, the first that applies:
//   tool_choice required      a call to one of `tools`, its arguments valid for its parameters
//                             (more calls may follow unless parallel_tool_calls is false);
//   tool_choice {function}    one call to that function;
//   response_format json_schema / json_object, tool_choice auto with tools given
//                             either tool calls (as required) or the JSON answer: the model
//                             calls tools or gives its final answer in the format;
//   response_format json_schema / json_object
//                             JSON valid for the schema / any JSON object;
//   tool_choice none, tools given
//                             any text in which "<tool_call>" never occurs (the template still
//                             lists the tools, so an unconstrained model may start one);
//   otherwise (auto, text)    none: the model writes what it likes.
// When the prompt opens Qwen's thinking block, the reasoning stays free: the grammar applies
// from the first "</think>" on (grammar::GrammarOptions::thinking).
//
// generate() applies the grammar (generate.h): the sampler's penalties and filters act on the
// tokens the grammar allows only (the others -inf in the row, or left out of the candidates the
// backend selects with the grammar's mask), and the grammar's end ends the reply.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "chat/chat_template.h"  // json
#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace lily {

// tool_choice:
//   auto      tool calls are parsed when tools are given;
//   none      the template still lists the tools; no tool-call markup can be written;
//   required  the reply is a call to one of the tools (above);
//   function  the reply is a call to `function`.
struct ToolChoice {
  enum class Mode { automatic, none, required, function };
  Mode mode = Mode::automatic;
  std::string function;  // Mode::function
};

// The function object of a tools entry: {"type": "function", "function": {...}}, or the entry
// itself when it has no "function".
const json& tool_function(const json& tool);

// response_format: text (no constraint), any JSON object, or JSON valid for `schema`.
struct ResponseFormat {
  enum class Type { text, json_object, json_schema };
  Type type = Type::text;
  json schema = json::object();  // json_schema: the schema ({} allows any JSON value)
};

// One request's constraint, before it is compiled.
struct OutputConstraint {
  enum class Kind { json_object, json_schema, tool_call, tool_call_or_json, no_tool_call };
  Kind kind = Kind::json_object;
  json schema;                    // json_schema, tool_call_or_json: the schema (null: any object)
  json tools;                     // tool_call, tool_call_or_json
  grammar::ToolChoice tool_call;  // tool_call: the named function (if any), parallel calls
  bool thinking = false;          // the reply starts inside <think>: free up to </think>

  // The cache's key: the kind, the options and the compact JSON of the schema and tools
  // (properties keep the request's order, which is the order the grammar writes them in).
  std::string key() const;
  // Throws grammar::SchemaError naming what the grammar compiler refuses.
  grammar::Grammar build() const;
  // The request field a refusal is reported on ("response_format", "tools"); refused_at: the
  // SchemaError's path (the tools' are "#/tools/...").
  const char* param(const std::string& refused_at = "") const;
};

// The constraint of a chat reply (the table above); nullopt: none.
std::optional<OutputConstraint> chat_constraint(const ResponseFormat& format, const json& tools,
                                                const ToolChoice& choice, bool parallel_tool_calls, bool thinking);
// A text completion's: its response_format only.
std::optional<OutputConstraint> text_constraint(const ResponseFormat& format);

// Compiled grammars by OutputConstraint::key(), the least recently used dropped beyond
// `capacity`: a grammar's per-state masks are computed on first use and live as long as it
// does, so a client repeating its schema or tools gets warm masks. The vocabulary is built from
// the tokenizer on first use (every id below vocab_size, the model's padded logits row) and
// shared by every grammar. Thread-safe (ChatService::prepare_* runs on the server's threads).
class GrammarCache {
 public:
  GrammarCache(const Tokenizer& tokenizer, int32_t vocab_size, size_t capacity);

  // From the cache, or compiled now. Throws grammar::SchemaError.
  std::shared_ptr<const grammar::CompiledGrammar> get(const OutputConstraint& constraint);
  std::shared_ptr<const grammar::Vocabulary> vocabulary();

  struct Stats {
    size_t entries = 0, hits = 0, misses = 0;
  };
  Stats stats() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const grammar::CompiledGrammar>>;
  const Tokenizer& tokenizer_;
  int32_t vocab_size_;
  size_t capacity_;
  std::once_flag vocabulary_once_;
  std::shared_ptr<const grammar::Vocabulary> vocabulary_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  Stats stats_;
};

}  // namespace lily
