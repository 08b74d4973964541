// json_schema.h: JSON schemas compiled into grammar fragments.
//
// The language of a schema is the JSON texts valid under it, written in a canonical subset:
//   * whitespace between tokens: nothing, one space, or one or two newlines then up to
//     max_indent (default 20) spaces or tabs (fragments.h json_whitespace);
//   * numbers of bounded length: up to 16 digits before the point (more only where a minimum or
//     maximum needs them, at most 40), 16 after it, 3 in the exponent; a string without maxLength has at most minLength
//     + 1024 characters (JSON objects' keys and strings too), an additional property's key at most 256: every text can
//     end (fragments.h; only the counts of items and members are unbounded, and each can stop);
//   * an object's declared properties in the order of `properties`; additional properties (when
//     allowed) after them, with keys that are none of the declared names and have no escapes;
//     `additionalProperties` absent means false (OpenAI's strict mode requires it false anyway);
//   * `enum` and `const` values as JSON::dump writes them (compact: {"a":1}, [1,2]);
//   * an integer without fraction or exponent; under minimum / maximum / exclusive* / multipleOf
//     a number without exponent and zero as 0, never -0 (number_range.h has those rules);
//   * strings in valid UTF-8, \u escapes of surrogates only as pairs; minLength / maxLength
//     count code points (an escape is one);
//   * `oneOf` is matched as `anyOf` (a grammar cannot check that only one alternative matches);
//   * `required` names must be declared in `properties`.
// Supported keywords: type (a name or a list), properties, required, additionalProperties, enum,
// const, items, minItems, maxItems, anyOf, oneOf, $ref (within the schema: #, #/$defs/..., any
// #/JSON-pointer; recursion becomes a rule of the grammar), $defs, definitions, minLength,
// maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum (2020-12's numbers, draft 4's
// booleans), multipleOf (a positive integer up to 1000). Annotations are ignored: title,
// description, default, examples, $schema, $id, $comment, format, deprecated, readOnly, writeOnly. Any other keyword is
// refused with a SchemaError naming it and where it is (the server answers 400 with that message). Without "type", the
// type is inferred: properties/required/additionalProperties -> object, items/minItems/maxItems -> array,
// minLength/maxLength -> string, a numeric keyword -> number, none of these -> any value. The numeric keywords are
// checked whatever the type (a malformed one is refused) and apply to integers and numbers only, as in JSON Schema.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "grammar/grammar.h"

namespace lily::grammar {

using json = nlohmann::ordered_json;

class SchemaError : public Error {
 public:
  // keyword: the keyword refused or wrong ("" when the schema itself is wrong); path: a JSON
  // pointer into the schema, "#/properties/a".
  SchemaError(std::string keyword, std::string path, const std::string& message);
  const std::string& keyword() const { return keyword_; }
  const std::string& path() const { return path_; }

 private:
  std::string keyword_, path_;
};

struct JsonOptions {
  int max_indent = 20;  // the whitespace of a gap: json_whitespace (fragments.h)
  bool raw_lt = true;   // false: '<' in strings only as \u003c (JSON inside tool-call markup)
};

class JsonSchemaCompiler {
 public:
  // `document`: the whole schema, which $ref pointers resolve in.
  JsonSchemaCompiler(GrammarBuilder& builder, const json& document, JsonOptions options);

  // The fragment of `schema` (a part of the document at `path`).
  Fragment value(const json& schema, const std::string& path);
  // Any JSON value (a call of the recursive rule), and any object (one level inline).
  Fragment any_value();
  Fragment any_object();
  Fragment ws();

 private:
  Fragment typed(const json& schema, const std::string& type, const std::string& path);
  Fragment object(const json& schema, const std::string& path);
  Fragment array(const json& schema, const std::string& path);
  Fragment reference(const json& schema, const std::string& path);
  Fragment any_array();
  // A string of min.. characters without a maxLength: the first min inline, then a call of the
  // grammar's shared rule for the rest (up to kMaxFreeStringChars more and the closing quote).
  Fragment free_string(int min);

  GrammarBuilder& b_;
  const json& document_;
  JsonOptions options_;
  std::vector<std::string> inlining_;         // $ref targets being inlined (a repeat is recursion)
  std::map<std::string, int32_t> ref_rules_;  // $ref target -> its rule
  int32_t any_rule_ = -1;
  int depth_ = 0;
};

}  // namespace lily::grammar
