// grammars.cpp: response formats and tool choices as grammars (see the header).
#include "grammar/grammars.h"

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "grammar/fragments.h"
#include "grammar/number_range.h"

namespace lily::grammar {

namespace {

Grammar finish(GrammarBuilder& b, Fragment answer, const GrammarOptions& options) {
  if (options.thinking) answer = b.sequence({text_until(b, "</think>"), answer});
  b.set_body(0, answer);
  return b.build();
}

// The characters the tool-call parser treats as markup cannot be in a name (tag_name there).
void check_tag_name(const std::string& name, const std::string& what, const std::string& path) {
  const bool bad = name.empty() || name.find_first_of("<>\n\r") != std::string::npos || name.front() == ' ' ||
                   name.back() == ' ' || name.front() == '\t' || name.back() == '\t';
  if (bad) throw SchemaError(what, path, what + " '" + name + "' cannot be written in the tool-call markup");
}

const json& resolve(const json& document, const json& schema, const std::string& path) {
  const json* s = &schema;
  for (int hops = 0; s->is_object() && s->contains("$ref"); ++hops) {
    const json& ref = (*s)["$ref"];
    if (hops > 32 || !ref.is_string() || !ref.get<std::string>().starts_with("#"))
      throw SchemaError("$ref", path, "only references within the schema (#/...) are supported");
    try {
      s = &document.at(json::json_pointer(ref.get<std::string>().substr(1)));
    } catch (const json::exception& e) {
      throw SchemaError("$ref", path, "'" + ref.get<std::string>() + "' does not resolve: " + e.what());
    }
  }
  return *s;
}

class ToolCallCompiler {
 public:
  ToolCallCompiler(GrammarBuilder& b, const json& parameters, const GrammarOptions& options)
      : b_(b), document_(parameters), json_(b, parameters, {options.max_indent, false}) {}

  // A value taken as raw text that the parser may read back as a number (a type list with
  // "string" and "integer" / "number", or no type) cannot keep a numeric range: "0" would be the
  // integer 0 under minimum 1. Refused rather than not enforced.
  static void refuse_raw_ranged_numbers(const json& schema, const std::vector<std::string>& types,
                                        const std::string& path) {
    const char* keyword = first_numeric_keyword(schema);
    const bool numbers = types.empty() || std::find(types.begin(), types.end(), "integer") != types.end() ||
                         std::find(types.begin(), types.end(), "number") != types.end();
    if (keyword != nullptr && numbers)
      throw SchemaError(keyword, path,
                        "'" + std::string(keyword) +
                            "' on a tool-call value that may also be a string is not supported (the raw text "
                            "would be read back as any number)");
  }

  // One parameter's VALUE as the parser reads it back (the header's rules).
  Fragment value(const json& raw_schema, const std::string& path) {
    const json& schema = resolve(document_, raw_schema, path);
    if (!schema.is_object()) return json_.value(schema, path);
    for (const char* combinator : {"anyOf", "oneOf"}) {
      if (!schema.contains(combinator) || !schema[combinator].is_array()) continue;
      std::vector<Fragment> alts;
      for (size_t i = 0; i < schema[combinator].size(); ++i)
        alts.push_back(value(schema[combinator][i], path + "/" + combinator + "/" + std::to_string(i)));
      if (!alts.empty()) return b_.alternatives(alts);
    }
    std::vector<std::string> types;
    if (auto it = schema.find("type"); it != schema.end()) {
      if (it->is_string()) types.push_back(it->get<std::string>());
      if (it->is_array())
        for (const json& t : *it)
          if (t.is_string()) types.push_back(t.get<std::string>());
    }
    if (schema.contains("enum") || schema.contains("const")) {
      json values = schema.contains("const") ? json::array({schema["const"]}) : schema["enum"];
      if (!values.is_array() || values.empty()) return json_.value(schema, path);  // the JSON compiler says why
      json_.value(schema, path);  // refuses what JSON refuses (keywords, types)
      std::vector<Fragment> alts;
      for (const json& v : values) alts.push_back(b_.literal(v.is_string() ? v.get<std::string>() : v.dump()));
      return b_.alternatives(alts);
    }
    const bool allows_string = std::find(types.begin(), types.end(), "string") != types.end() ||
                               (types.empty() && (schema.contains("minLength") || schema.contains("maxLength")));
    if (!allows_string) return json_.value(schema, path);
    json_.value(schema, path);  // the same keyword checks as JSON
    refuse_raw_ranged_numbers(schema, types, path);
    if (schema.contains("minLength") || schema.contains("maxLength")) {
      const int min = schema.value("minLength", 0);
      const int max = schema.contains("maxLength") ? schema["maxLength"].get<int>() : -1;
      Fragment f = b_.empty();
      for (int i = 0; i < min; ++i) f = b_.sequence({f, utf8_char(b_, ByteSet::of("<"))});
      if (max < 0) return b_.sequence({f, b_.star(utf8_char(b_, ByteSet::of("<")))});
      const int32_t end = b_.new_state();
      for (int i = min; i < max; ++i) {
        b_.epsilon(f.end, end);
        f = b_.sequence({f, utf8_char(b_, ByteSet::of("<"))});
      }
      b_.epsilon(f.end, end);
      return {f.start, end};
    }
    return text_avoiding(b_, {"</parameter>", "<parameter=", "</function>", "</tool_call>"});
  }

  Fragment call(const std::string& name, const std::string& path) {
    const json& params = resolve(document_, document_, path);
    if (!params.is_null() && !params.is_object())
      throw SchemaError("parameters", path, "'parameters' must be a schema object");
    static const json kEmpty = json::object();
    const json& props = params.is_object() && params.contains("properties") ? params["properties"] : kEmpty;
    if (!props.is_object()) throw SchemaError("properties", path, "'properties' must be an object");
    std::set<std::string> required;
    if (params.is_object() && params.contains("required")) {
      for (const json& n : params["required"]) {
        if (!n.is_string() || !props.contains(n.get<std::string>()))
          throw SchemaError("required", path, "'required' must name properties of 'properties'");
        required.insert(n.get<std::string>());
      }
    }
    std::vector<Fragment> parts{b_.literal("<tool_call>\n<function=" + name + ">\n")};
    for (const auto& [key, sub] : props.items()) {
      check_tag_name(key, "parameter", path);
      Fragment p = b_.sequence({b_.literal("<parameter=" + key + ">\n"), value(sub, path + "/properties/" + key),
                                b_.literal("\n</parameter>\n")});
      parts.push_back(required.count(key) ? p : b_.optional(p));
    }
    parts.push_back(b_.literal("</function>\n</tool_call>"));
    return b_.sequence(parts);
  }

 private:
  GrammarBuilder& b_;
  const json& document_;
  JsonSchemaCompiler json_;
};

}  // namespace

Grammar json_schema_grammar(const json& schema, const GrammarOptions& options) {
  GrammarBuilder b;
  JsonSchemaCompiler c(b, schema, {options.max_indent});
  Fragment v = c.value(schema, "#");
  return finish(b, b.sequence({c.ws(), v, c.ws()}), options);
}

Grammar json_object_grammar(const GrammarOptions& options) {
  GrammarBuilder b;
  static const json kNone = json::object();
  JsonSchemaCompiler c(b, kNone, {options.max_indent});
  Fragment v = c.any_object();
  return finish(b, b.sequence({c.ws(), v, c.ws()}), options);
}

namespace {

// The calls a tool choice allows: ws call (ws call)* ws (one call unless parallel). The compilers
// of the tools' parameters are kept in `compilers` until the grammar is built.
Fragment tool_calls(GrammarBuilder& b, const json& tools, const ToolChoice& choice, const GrammarOptions& options,
                    std::vector<std::unique_ptr<ToolCallCompiler>>& compilers) {
  if (!tools.is_array() || tools.empty()) throw SchemaError("tools", "#", "tool_choice needs a non-empty 'tools'");
  struct Tool {
    std::string name;
    const json* parameters;
    std::string path;
  };
  static const json kNoParameters = json::object();
  std::vector<Tool> selected;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string path = "#/tools/" + std::to_string(i);
    const json& tool = tools[i];
    const json& fn = tool.is_object() && tool.contains("function") ? tool["function"] : tool;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
      throw SchemaError("name", path, "a tool needs a function name");
    const std::string name = fn["name"].get<std::string>();
    check_tag_name(name, "function name", path);
    if (choice.function && *choice.function != name) continue;
    selected.push_back({name, fn.contains("parameters") ? &fn["parameters"] : &kNoParameters, path + "/parameters"});
  }
  if (selected.empty())
    throw SchemaError("tool_choice", "#", "tool_choice names '" + choice.function.value_or("") + "', not in 'tools'");

  const size_t first = compilers.size();
  for (const Tool& t : selected) compilers.push_back(std::make_unique<ToolCallCompiler>(b, *t.parameters, options));
  auto any_call = [&]() {
    std::vector<Fragment> calls;
    for (size_t i = 0; i < selected.size(); ++i)
      calls.push_back(compilers[first + i]->call(selected[i].name, selected[i].path));
    return b.alternatives(calls);
  };
  auto ws = [&]() { return json_whitespace(b, options.max_indent); };
  std::vector<Fragment> parts{ws(), any_call()};
  if (choice.parallel) parts.push_back(b.star(b.sequence({ws(), any_call()})));
  parts.push_back(ws());
  return b.sequence(parts);
}

}  // namespace

Grammar tool_call_grammar(const json& tools, const ToolChoice& choice, const GrammarOptions& options) {
  GrammarBuilder b;
  std::vector<std::unique_ptr<ToolCallCompiler>> compilers;
  Fragment calls = tool_calls(b, tools, choice, options, compilers);
  return finish(b, calls, options);
}

Grammar tool_calls_or_json_grammar(const json& tools, bool parallel, const json* schema,
                                   const GrammarOptions& options) {
  GrammarBuilder b;
  std::vector<std::unique_ptr<ToolCallCompiler>> compilers;
  Fragment calls = tool_calls(b, tools, {std::nullopt, parallel}, options, compilers);
  static const json kNone = json::object();
  JsonSchemaCompiler c(b, schema ? *schema : kNone, {options.max_indent});
  Fragment value = schema ? c.value(*schema, "#") : c.any_object();
  Fragment answer = b.sequence({c.ws(), value, c.ws()});
  return finish(b, b.alternatives({calls, answer}), options);
}

Grammar no_tool_call_grammar(const GrammarOptions& options) {
  GrammarBuilder b;
  return finish(b, text_avoiding(b, {"<tool_call>"}), options);
}

}  // namespace lily::grammar
