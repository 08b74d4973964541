// json_schema.cpp: a JSON schema as grammar fragments (the language is in the header).
#include "grammar/json_schema.h"

#include <algorithm>
#include <set>

#include "grammar/fragments.h"
#include "grammar/number_range.h"

namespace lily::grammar {

namespace {

// Past this many NFA states for the copies of one array's items, the items become a rule.
constexpr size_t kInlineItemsBudget = 60'000;
constexpr int kMaxDepth = 96;

const std::set<std::string> kSupported = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "enum",
                                          "const",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "anyOf",
                                          "oneOf",
                                          "$ref",
                                          "$defs",
                                          "definitions",
                                          "minLength",
                                          "maxLength",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "multipleOf"};
const std::set<std::string> kAnnotations = {"title",    "description", "default",    "examples", "$schema",  "$id",
                                            "$comment", "format",      "deprecated", "readOnly", "writeOnly"};
const std::set<std::string> kTypes = {"string", "number", "integer", "boolean", "null", "object", "array"};

std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string dump(const json& value, const std::string& path) {
  try {
    return value.dump();
  } catch (const json::exception& e) {
    throw SchemaError("", path, std::string("a value that is not valid UTF-8: ") + e.what());
  }
}

int count_keyword(const json& schema, const char* key, const std::string& path, int fallback) {
  auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1'000'000)
    throw SchemaError(key, path, std::string("'") + key + "' must be an integer in [0, 1000000]");
  return int(it->get<int64_t>());
}

// Keywords other than annotations and definitions.
std::vector<std::string> constraints(const json& schema) {
  std::vector<std::string> out;
  for (const auto& [key, value] : schema.items())
    if (!kAnnotations.count(key) && key != "$defs" && key != "definitions") out.push_back(key);
  return out;
}

bool value_has_type(const json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

}  // namespace

SchemaError::SchemaError(std::string keyword, std::string path, const std::string& message)
    : Error("json_schema: " + message + " at " + path), keyword_(std::move(keyword)), path_(std::move(path)) {}

JsonSchemaCompiler::JsonSchemaCompiler(GrammarBuilder& builder, const json& document, JsonOptions options)
    : b_(builder), document_(document), options_(options) {}

Fragment JsonSchemaCompiler::ws() { return json_whitespace(b_, options_.max_indent); }

Fragment JsonSchemaCompiler::free_string(int min) {
  const bool raw_lt = options_.raw_lt;
  const int32_t rest = b_.shared_rule(raw_lt ? "string rest" : "string rest (no raw <)",
                                      [&] { return json_string_rest(b_, kMaxFreeStringChars, raw_lt); });
  Fragment f = b_.literal("\"");
  for (int i = 0; i < min; ++i) f = b_.sequence({f, json_string_char(b_, raw_lt)});
  return b_.sequence({f, b_.call_rule(rest)});
}

Fragment JsonSchemaCompiler::value(const json& schema, const std::string& path) {
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return any_value();
    throw SchemaError("", path, "the schema false matches nothing");
  }
  if (!schema.is_object()) throw SchemaError("", path, "a schema must be an object or a boolean");
  if (depth_ >= kMaxDepth) throw SchemaError("", path, "schema nested deeper than " + std::to_string(kMaxDepth));
  ++depth_;
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{depth_};

  for (const auto& [key, v] : schema.items())
    if (!kSupported.count(key) && !kAnnotations.count(key))
      throw SchemaError(key, path, "unsupported keyword '" + key + "'");
  const std::vector<std::string> keys = constraints(schema);
  auto only = [&](const std::string& main, std::initializer_list<const char*> allowed) {
    for (const std::string& k : keys) {
      if (k == main) continue;
      if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) == allowed.end())
        throw SchemaError(k, path, "'" + k + "' next to '" + main + "' is not supported");
    }
  };

  if (schema.contains("$ref")) {
    only("$ref", {});
    return reference(schema, path);
  }
  for (const char* combinator : {"anyOf", "oneOf"}) {
    if (!schema.contains(combinator)) continue;
    only(combinator, {});
    const json& options = schema[combinator];
    if (!options.is_array() || options.empty())
      throw SchemaError(combinator, path, std::string("'") + combinator + "' must be a non-empty array");
    std::vector<Fragment> alts;
    for (size_t i = 0; i < options.size(); ++i)
      alts.push_back(value(options[i], path + "/" + combinator + "/" + std::to_string(i)));
    return b_.alternatives(alts);
  }

  std::vector<std::string> types;
  if (auto it = schema.find("type"); it != schema.end()) {
    std::vector<json> names = it->is_array() ? it->get<std::vector<json>>() : std::vector<json>{*it};
    for (const json& n : names) {
      if (!n.is_string() || !kTypes.count(n.get<std::string>()))
        throw SchemaError("type", path,
                          "'type' must be one of string, number, integer, boolean, null, object, "
                          "array (or a list of them)");
      types.push_back(n.get<std::string>());
    }
    if (types.empty()) throw SchemaError("type", path, "'type' is an empty list");
  }
  check_numeric_keywords(schema, path);  // read whenever present, whatever the type

  if (schema.contains("const") || schema.contains("enum")) {
    const bool is_const = schema.contains("const");
    only(is_const ? "const" : "enum", {"type"});
    std::vector<json> values;
    if (is_const) {
      values.push_back(schema["const"]);
    } else {
      if (!schema["enum"].is_array() || schema["enum"].empty())
        throw SchemaError("enum", path, "'enum' must be a non-empty array");
      values = schema["enum"].get<std::vector<json>>();
    }
    std::vector<Fragment> alts;
    for (const json& v : values) {
      bool typed_ok = types.empty() || std::any_of(types.begin(), types.end(),
                                                   [&](const std::string& t) { return value_has_type(v, t); });
      if (typed_ok) alts.push_back(b_.literal(dump(v, path)));
    }
    if (alts.empty()) throw SchemaError(is_const ? "const" : "enum", path, "no value of the enum has the type");
    return b_.alternatives(alts);
  }

  if (types.empty()) {
    auto has = [&](std::initializer_list<const char*> ks) {
      return std::any_of(ks.begin(), ks.end(), [&](const char* k) { return schema.contains(k); });
    };
    if (has({"properties", "required", "additionalProperties"})) {
      types = {"object"};
    } else if (has({"items", "minItems", "maxItems"})) {
      types = {"array"};
    } else if (has({"minLength", "maxLength"})) {
      types = {"string"};
    } else if (has_numeric_keywords(schema)) {
      types = {"number"};
    } else {
      return any_value();
    }
  }
  std::vector<Fragment> alts;
  for (const std::string& t : types) alts.push_back(typed(schema, t, path));
  return b_.alternatives(alts);
}

Fragment JsonSchemaCompiler::typed(const json& schema, const std::string& type, const std::string& path) {
  if (type == "object") return object(schema, path);
  if (type == "array") return array(schema, path);
  if (type == "string") {
    const int min = count_keyword(schema, "minLength", path, 0);
    const int max = count_keyword(schema, "maxLength", path, -1);
    if (max >= 0 && min > max) throw SchemaError("minLength", path, "minLength above maxLength");
    return max < 0 ? free_string(min) : json_string(b_, min, max, options_.raw_lt);
  }
  if (type == "integer" || type == "number") {
    if (!has_numeric_keywords(schema)) return json_number(b_, type == "integer");
    return json_number_in_range(b_, number_range(schema, type == "integer", path));
  }
  if (type == "boolean") return b_.alternatives({b_.literal("true"), b_.literal("false")});
  return b_.literal("null");
}

Fragment JsonSchemaCompiler::object(const json& schema, const std::string& path) {
  static const json kEmpty = json::object();
  const json& props = schema.contains("properties") ? schema["properties"] : kEmpty;
  if (!props.is_object()) throw SchemaError("properties", path, "'properties' must be an object");
  std::set<std::string> required;
  if (auto it = schema.find("required"); it != schema.end()) {
    if (!it->is_array()) throw SchemaError("required", path, "'required' must be an array of names");
    for (const json& n : *it) {
      if (!n.is_string()) throw SchemaError("required", path, "'required' must be an array of names");
      if (!props.contains(n.get<std::string>()))
        throw SchemaError("required", path, "required property '" + n.get<std::string>() + "' is not in 'properties'");
      required.insert(n.get<std::string>());
    }
  }
  const json* additional = nullptr;  // nullptr: none allowed
  if (auto it = schema.find("additionalProperties"); it != schema.end()) {
    if (it->is_boolean()) {
      if (it->get<bool>()) additional = &*it;
    } else if (it->is_object()) {
      additional = &*it;
    } else {
      throw SchemaError("additionalProperties", path, "'additionalProperties' must be a boolean or a schema");
    }
  }

  // Two lanes between members: lane0 before the first member, lane1 after one (a comma next).
  Fragment open = b_.sequence({b_.literal("{"), ws()});
  int32_t lane0 = open.end;
  int32_t lane1 = b_.new_state();
  auto separator = [&](int32_t to) {
    Fragment comma = b_.sequence({ws(), b_.literal(","), ws()});
    b_.epsilon(lane1, comma.start);
    b_.epsilon(comma.end, to);
  };
  std::vector<std::string> declared;
  for (const auto& [name, sub] : props.items()) {
    const std::string key = dump(json(name), path);
    declared.push_back(key);
    const int32_t member_start = b_.new_state();
    b_.epsilon(lane0, member_start);
    separator(member_start);
    Fragment member = b_.sequence(
        {b_.literal(key), ws(), b_.literal(":"), ws(), value(sub, path + "/properties/" + pointer_token(name))});
    b_.epsilon(member_start, member.start);
    const int32_t next0 = b_.new_state(), next1 = b_.new_state();
    b_.epsilon(member.end, next1);
    if (!required.count(name)) {
      b_.epsilon(lane0, next0);
      b_.epsilon(lane1, next1);
    }
    lane0 = next0;
    lane1 = next1;
  }
  if (additional != nullptr) {
    const int32_t member_start = b_.new_state();
    b_.epsilon(lane0, member_start);
    separator(member_start);
    Fragment item = additional->is_boolean() ? any_value() : value(*additional, path + "/additionalProperties");
    Fragment member = b_.sequence({json_key_except(b_, declared, options_.raw_lt), ws(), b_.literal(":"), ws(), item});
    b_.epsilon(member_start, member.start);
    b_.epsilon(member.end, lane1);
  }
  Fragment close = b_.literal("}");
  Fragment tail = ws();
  b_.epsilon(lane0, close.start);
  b_.epsilon(lane1, tail.start);
  b_.epsilon(tail.end, close.start);
  return {open.start, close.end};
}

Fragment JsonSchemaCompiler::array(const json& schema, const std::string& path) {
  static const json kAny = true;
  const json& items = schema.contains("items") ? schema["items"] : kAny;
  if (!items.is_object() && !items.is_boolean())
    throw SchemaError("items", path, "'items' must be a schema (a list of schemas is prefixItems, not supported)");
  const int min = count_keyword(schema, "minItems", path, 0);
  const int max = count_keyword(schema, "maxItems", path, -1);
  if (max >= 0 && min > max) throw SchemaError("minItems", path, "minItems above maxItems");

  Fragment open = b_.sequence({b_.literal("["), ws()});
  Fragment close = b_.literal("]");
  if (max == 0) {
    b_.epsilon(open.end, close.start);
    return {open.start, close.end};
  }
  const std::string item_path = path + "/items";
  int32_t item_rule = -1;
  auto item = [&]() { return item_rule >= 0 ? b_.call_rule(item_rule) : value(items, item_path); };
  const size_t before = b_.size();
  Fragment first = item();
  const size_t copies = size_t(max < 0 ? std::max(min, 1) : max);
  if (copies > 1 && (b_.size() - before) * copies > kInlineItemsBudget) {
    item_rule = b_.add_rule(item_path);
    b_.set_body(item_rule, value(items, item_path));
    first = b_.call_rule(item_rule);
  }
  auto next_item = [&]() { return b_.sequence({ws(), b_.literal(","), ws(), item()}); };
  if (min == 0) b_.epsilon(open.end, close.start);
  b_.epsilon(open.end, first.start);
  int32_t cur = first.end;
  for (int i = 1; i < min; ++i) {
    Fragment f = next_item();
    b_.epsilon(cur, f.start);
    cur = f.end;
  }
  Fragment tail = ws();
  if (max < 0) {
    Fragment f = next_item();
    b_.epsilon(cur, f.start);
    b_.epsilon(f.end, cur);
  } else {
    for (int i = std::max(min, 1); i < max; ++i) {
      b_.epsilon(cur, tail.start);
      Fragment f = next_item();
      b_.epsilon(cur, f.start);
      cur = f.end;
    }
  }
  b_.epsilon(cur, tail.start);
  b_.epsilon(tail.end, close.start);
  return {open.start, close.end};
}

Fragment JsonSchemaCompiler::reference(const json& schema, const std::string& path) {
  const json& ref = schema["$ref"];
  if (!ref.is_string() || !ref.get<std::string>().starts_with("#"))
    throw SchemaError("$ref", path, "only references within the schema (#/...) are supported");
  const std::string target = ref.get<std::string>();
  const json* resolved = nullptr;
  try {
    const json::json_pointer pointer(target.substr(1));
    if (document_.contains(pointer)) resolved = &document_.at(pointer);
  } catch (const json::exception& e) {
    throw SchemaError("$ref", path, "'" + target + "' is not a JSON pointer: " + e.what());
  }
  if (resolved == nullptr) throw SchemaError("$ref", path, "'" + target + "' points at nothing in the schema");

  if (std::find(inlining_.begin(), inlining_.end(), target) != inlining_.end()) {
    auto [it, fresh] = ref_rules_.try_emplace(target, -1);
    if (fresh) {
      const int32_t rule = b_.add_rule(target);
      it->second = rule;
      b_.set_body(rule, value(*resolved, target));
      return b_.call_rule(rule);
    }
    return b_.call_rule(it->second);
  }
  inlining_.push_back(target);
  Fragment f = value(*resolved, target);
  inlining_.pop_back();
  return f;
}

Fragment JsonSchemaCompiler::any_value() {
  if (any_rule_ < 0) {
    any_rule_ = b_.add_rule("any JSON value");
    b_.set_body(any_rule_, b_.alternatives({free_string(0), json_number(b_, false), b_.literal("true"),
                                            b_.literal("false"), b_.literal("null"), any_object(), any_array()}));
  }
  return b_.call_rule(any_rule_);
}

Fragment JsonSchemaCompiler::any_object() {
  Fragment open = b_.sequence({b_.literal("{"), ws()});
  Fragment close = b_.literal("}");
  b_.epsilon(open.end, close.start);
  auto member = [&]() { return b_.sequence({free_string(0), ws(), b_.literal(":"), ws(), any_value()}); };
  Fragment first = member();
  b_.epsilon(open.end, first.start);
  Fragment more = b_.sequence({ws(), b_.literal(","), ws(), member()});
  b_.epsilon(first.end, more.start);
  b_.epsilon(more.end, first.end);
  Fragment tail = ws();
  b_.epsilon(first.end, tail.start);
  b_.epsilon(tail.end, close.start);
  return {open.start, close.end};
}

Fragment JsonSchemaCompiler::any_array() {
  Fragment open = b_.sequence({b_.literal("["), ws()});
  Fragment close = b_.literal("]");
  b_.epsilon(open.end, close.start);
  Fragment first = any_value();
  b_.epsilon(open.end, first.start);
  Fragment more = b_.sequence({ws(), b_.literal(","), ws(), any_value()});
  b_.epsilon(first.end, more.start);
  b_.epsilon(more.end, first.end);
  Fragment tail = ws();
  b_.epsilon(first.end, tail.start);
  b_.epsilon(tail.end, close.start);
  return {open.start, close.end};
}

}  // namespace lily::grammar
