// grammars.h: the grammars the server asks for, one per kind of constraint.
//
//   response_format json_schema  -> json_schema_grammar(schema)
//   response_format json_object  -> json_object_grammar()
//   tool_choice required / named -> tool_call_grammar(tools, choice)
//   tool_choice auto, tools given, and a response_format
//                                -> tool_calls_or_json_grammar(tools, schema or none)
//   tool_choice none             -> no_tool_call_grammar()
//
// GrammarOptions::thinking: the model's output starts inside Qwen's thinking block (the prompt
// ends with "<think>\n"): any text is allowed up to and including the first "</think>", and the
// grammar applies from there on. Without it the grammar applies from the first byte.
// JSON answers may start and end with a gap of whitespace as between tokens (json_schema.h: the
// model writes "\n\n" after </think>).
//
// The tool-call grammar writes the Qwen3 XML markup (spec tokenizer-chat-api.md §3.4) that
// src/chat/tool_call_xml.h parses:
//   <tool_call>\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function>\n</tool_call>
// NAME is one of the tools (the named one for a named choice); the parameters follow the order of
// the function's `parameters.properties`, the required ones present, no others. VALUE by the
// parameter's schema, so that the parser types it back into a value valid for the schema:
//   * a schema that allows strings: the raw text (no quotes), any bytes in which none of
//     "</parameter>", "<parameter=", "</function>", "</tool_call>" occurs; with minLength /
//     maxLength, that many UTF-8 characters none of which is '<'; an enum / const of strings:
//     one of its values as raw text;
//   * anything else: JSON text valid for the schema (json_schema.h), e.g. 3, true, {"a": 1},
//     with '<' in its strings only as \u003c (so no "</tool_call>" can end the block early).
//   * An anyOf / oneOf / type list: any of its options' forms.
// Calls may be followed by more calls (parallel, unless ToolChoice::parallel is false), each
// after a gap of whitespace; the output ends after the last </tool_call>. Raw string values
// (no maxLength) are free text, unbounded, as the reasoning of the thinking option is.
//
// The no-tool-call grammar: any text in which "<tool_call>" never occurs.
//
// Every function throws SchemaError (json_schema.h) for a schema it refuses, naming the keyword.
#pragma once

#include <optional>
#include <string>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace lily::grammar {

struct GrammarOptions {
  bool thinking = false;
  int max_indent = 20;  // JSON whitespace: nothing, " ", or 1-2 newlines and this many spaces or tabs; -1: none
};

Grammar json_schema_grammar(const json& schema, const GrammarOptions& options = {});
Grammar json_object_grammar(const GrammarOptions& options = {});

struct ToolChoice {
  std::optional<std::string> function;  // a named choice; none: "required", any of the tools
  bool parallel = true;                 // more than one call allowed
};
// tools: the request's `tools` array ({"type": "function", "function": {name, parameters}}).
Grammar tool_call_grammar(const json& tools, const ToolChoice& choice, const GrammarOptions& options = {});

// Either tool calls (as tool_call_grammar with any of the tools; more than one when parallel)
// or the JSON answer (as json_schema_grammar(*schema), or json_object_grammar without a schema):
// tool_choice "auto" with a response_format, where the model calls tools or gives its answer.
Grammar tool_calls_or_json_grammar(const json& tools, bool parallel, const json* schema,
                                   const GrammarOptions& options = {});

Grammar no_tool_call_grammar(const GrammarOptions& options = {});

}  // namespace lily::grammar
