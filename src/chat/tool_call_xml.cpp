// tool_call_xml.cpp: the tool schemas of a request and the typing of tool-call values (see the header).
#include "chat/tool_call_xml.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "chat/json_limits.h"

namespace lily {
namespace {

using tool_call_syntax::is_space;
using tool_call_syntax::skip_space;

std::string_view trim(std::string_view s) {
  size_t begin = skip_space(s, 0);
  size_t end = s.size();
  while (end > begin && is_space(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  }
  return out;
}

// ---- value typing ---------------------------------------------------------------------------

enum class ValueType { kString, kInteger, kNumber, kBoolean, kObject, kArray, kNull, kOther };

// A JSON-schema type name, or one of the aliases models and clients write (as vLLM accepts).
ValueType type_from_name(std::string_view raw) {
  std::string name = to_lower(trim(raw));
  auto starts = [&](std::string_view prefix) { return name.starts_with(prefix); };
  if (name == "string" || name == "str" || name == "text" || name == "varchar" || name == "char" || name == "enum") {
    return ValueType::kString;
  }
  if (starts("int") || starts("uint") || starts("long") || starts("short") || starts("unsigned")) {
    return ValueType::kInteger;
  }
  if (starts("num") || starts("float") || starts("double")) return ValueType::kNumber;
  if (name == "boolean" || name == "bool" || name == "binary") return ValueType::kBoolean;
  if (name == "object" || starts("dict")) return ValueType::kObject;
  if (name == "array" || name == "arr" || starts("list") || name == "tuple") return ValueType::kArray;
  if (name == "null" || name == "none") return ValueType::kNull;
  return ValueType::kOther;
}

void add_types_of(const json& schema, std::vector<ValueType>& types, int depth) {
  if (!schema.is_object() || depth > 4) return;
  if (auto it = schema.find("type"); it != schema.end()) {
    if (it->is_string()) types.push_back(type_from_name(it->get<std::string>()));
    if (it->is_array()) {
      for (const json& name : *it) {
        if (name.is_string()) types.push_back(type_from_name(name.get<std::string>()));
      }
    }
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (auto it = schema.find(key); it != schema.end() && it->is_array()) {
      for (const json& option : *it) add_types_of(option, types, depth + 1);
    }
  }
}

bool has_type(const std::vector<ValueType>& types, ValueType type) {
  for (ValueType t : types) {
    if (t == type) return true;
  }
  return false;
}

bool is_null_literal(std::string_view raw) {
  std::string value = to_lower(trim(raw));
  return value == "null" || value == "none";
}

std::optional<json> parse_json(std::string_view text) {
  // Bounded: the model may write "[[[[..." as deep as its token budget, and dump_to recurses.
  json value = parse_json_bounded(text);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

// A Python literal (what str()/repr() of a dict or list prints) rewritten as JSON and parsed:
// '...' strings, True/False/None, tuples as arrays. Anything else JSON does not accept fails.
std::optional<json> parse_python_literal(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == '\'' || c == '"') {
      out += '"';
      ++i;
      while (i < s.size() && s[i] != c) {
        if (s[i] == '\\' && i + 1 < s.size()) {
          if (s[i + 1] == '\'') {
            out += '\'';
          } else {
            out += s.substr(i, 2);
          }
          i += 2;
          continue;
        }
        if (s[i] == '"') {
          out += "\\\"";
        } else if (s[i] == '\n') {
          out += "\\n";
        } else if (s[i] == '\t') {
          out += "\\t";
        } else {
          out += s[i];
        }
        ++i;
      }
      if (i >= s.size()) return std::nullopt;  // unterminated string
      out += '"';
      ++i;
    } else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_') {
      size_t end = i;
      while (end < s.size() && ((s[end] >= 'A' && s[end] <= 'Z') || (s[end] >= 'a' && s[end] <= 'z') ||
                                (s[end] >= '0' && s[end] <= '9') || s[end] == '_')) {
        ++end;
      }
      std::string_view word = s.substr(i, end - i);
      if (word == "True") {
        out += "true";
      } else if (word == "False") {
        out += "false";
      } else if (word == "None") {
        out += "null";
      } else {
        return std::nullopt;
      }
      i = end;
    } else {
      out += c == '(' ? '[' : c == ')' ? ']' : c;
      ++i;
    }
  }
  return parse_json(out);
}

std::optional<json> as_integer(std::string_view raw) {
  std::string_view text = trim(raw);
  if (text.starts_with('+')) text.remove_prefix(1);
  std::optional<json> value = parse_json(text);
  if (!value) return std::nullopt;
  if (value->is_number_integer()) return value;
  if (value->is_number_float()) {
    double d = value->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return json(int64_t(d));
  }
  return std::nullopt;
}

std::optional<json> as_number(std::string_view raw) {
  std::optional<json> value = parse_json(trim(raw));
  if (value && value->is_number()) return value;
  std::string text(trim(raw));  // Python float() also reads "5.", ".5", "+1"
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(d)) return std::nullopt;
  return json(d);
}

std::optional<json> as_boolean(std::string_view raw) {
  std::string value = to_lower(trim(raw));
  if (value == "true") return json(true);
  if (value == "false") return json(false);
  return std::nullopt;
}

// A JSON (else Python-literal) value of the wanted kind. A JSON string holding a Python
// literal ("{'k': 'v'}" wrapped in quotes) is unwrapped once.
std::optional<json> as_container(std::string_view raw, json::value_t kind) {
  std::optional<json> value = parse_json(raw);
  if (value && value->is_string()) value = parse_python_literal(value->get<std::string>());
  if (!value) value = parse_python_literal(trim(raw));
  if (value && value->type() == kind) return value;
  return std::nullopt;
}

// No schema: JSON if it parses; a Python container or True/False/None; else the raw text.
json untyped_value(const std::string& raw) {
  if (std::optional<json> value = parse_json(raw)) return *value;
  std::string_view text = trim(raw);
  bool python_like = text.starts_with('{') || text.starts_with('[') || text.starts_with('(') || text == "True" ||
                     text == "False" || text == "None";
  if (python_like) {
    if (std::optional<json> value = parse_python_literal(text)) return *value;
  }
  return json(raw);
}

void dump_to(const json& value, std::string& out) {
  auto scalar = [&out](const json& v) { out += v.dump(-1, ' ', false, json::error_handler_t::replace); };
  if (value.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (!first) out += ", ";
      first = false;
      scalar(json(key));
      out += ": ";
      dump_to(item, out);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out += ", ";
      dump_to(value[i], out);
    }
    out += ']';
  } else {
    scalar(value);
  }
}

}  // namespace

ToolSchemas::ToolSchemas(const json& tools) {
  if (!tools.is_array()) return;
  checks_names_ = true;
  for (const json& tool : tools) {
    if (!tool.is_object()) continue;
    auto fn_it = tool.find("function");
    const json& fn = (fn_it != tool.end() && fn_it->is_object()) ? *fn_it : tool;
    auto name = fn.find("name");
    if (name == fn.end() || !name->is_string()) continue;
    json properties = json::object();
    if (auto params = fn.find("parameters"); params != fn.end() && params->is_object()) {
      if (auto props = params->find("properties"); props != params->end() && props->is_object()) {
        properties = *props;
      }
    }
    properties_[name->get<std::string>()] = std::move(properties);
  }
}

bool ToolSchemas::allows(std::string_view function) const {
  return !checks_names_ || properties_.find(function) != properties_.end();
}

const json* ToolSchemas::find_parameter(std::string_view function, const std::string& parameter) const {
  auto fn = properties_.find(function);
  if (fn == properties_.end()) return nullptr;
  auto it = fn->second.find(parameter);
  return it == fn->second.end() ? nullptr : &*it;
}

json convert_parameter_value(const std::string& raw, const json* schema) {
  std::vector<ValueType> types;
  if (schema != nullptr) add_types_of(*schema, types, 0);
  if (types.empty()) return untyped_value(raw);

  bool allows_string = has_type(types, ValueType::kString);
  if ((has_type(types, ValueType::kNull) || !allows_string) && is_null_literal(raw)) return nullptr;
  std::optional<json> value;
  if (!value && has_type(types, ValueType::kInteger)) value = as_integer(raw);
  if (!value && has_type(types, ValueType::kNumber)) value = as_number(raw);
  if (!value && has_type(types, ValueType::kBoolean)) value = as_boolean(raw);
  if (!value && has_type(types, ValueType::kObject)) value = as_container(raw, json::value_t::object);
  if (!value && has_type(types, ValueType::kArray)) value = as_container(raw, json::value_t::array);
  if (value) return *value;
  if (allows_string) return json(raw);
  return untyped_value(raw);
}

bool value_is_plain_string(const json* schema) {
  std::vector<ValueType> types;
  if (schema != nullptr) add_types_of(*schema, types, 0);
  if (!has_type(types, ValueType::kString)) return false;
  for (ValueType t : {ValueType::kNull, ValueType::kInteger, ValueType::kNumber, ValueType::kBoolean,
                      ValueType::kObject, ValueType::kArray}) {
    if (has_type(types, t)) return false;
  }
  return true;
}

std::string dump_json_python_style(const json& value) {
  std::string out;
  dump_to(value, out);
  return out;
}

namespace tool_call_syntax {
std::optional<std::string> tag_name(std::string_view raw) {
  std::string_view name = trim(raw);
  if (name.empty() || name.find_first_of("\n<") != std::string_view::npos) return std::nullopt;
  return std::string(name);
}
}  // namespace tool_call_syntax

}  // namespace lily
