// json_reference.h: the grammar tests' oracle, written apart from src/grammar: a strict JSON
// parser that keeps every value's text, a validator of the schema subset and canonical form that
// grammar/json_schema.h documents, and random schemas and documents.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "number_oracle.h"

namespace lily::test {

using json = nlohmann::ordered_json;

struct JValue {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  std::string raw;     // the exact text
  size_t code_points;  // strings: decoded length
  std::vector<JValue> items;
  std::vector<std::pair<std::string, JValue>> members;  // raw key text (quotes included), value
};

// Bounds of grammar/json_schema.h's canonical form, restated here (not included from there).
inline constexpr size_t kRefMaxIntegerDigits = 16, kRefMaxFractionDigits = 16, kRefMaxExponentDigits = 3;
inline constexpr size_t kRefMaxFreeStringChars = 1024;

// RFC 8259 JSON text (ws value ws), every whitespace run nothing, one space, or one or two
// newlines then up to max_indent spaces or tabs (max_indent < 0: no whitespace); numbers with at
// most 16 digits before the point, 16 after it and 3 in the exponent; strings valid UTF-8 with
// surrogate escapes only in pairs. nullopt: not such a text.
class RefParser {
 public:
  // max_integer_digits: more where a schema's bound needs them (number_range.h).
  explicit RefParser(std::string_view text, int max_indent = 20, size_t max_integer_digits = kRefMaxIntegerDigits)
      : s_(text), max_indent_(max_indent), max_integer_digits_(max_integer_digits) {}
  std::optional<JValue> document() {
    if (!ws()) return std::nullopt;
    auto v = value(0);
    if (!v || !ws() || i_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  bool ws() {
    const size_t begin = i_;
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
    const std::string_view run = s_.substr(begin, i_ - begin);
    if (run.empty()) return true;
    if (max_indent_ < 0) return false;
    if (run == " ") return true;
    const size_t newlines = run.find_first_not_of('\n') == std::string_view::npos ? run.size()
                                                                                  : run.find_first_not_of('\n');
    const std::string_view indent = run.substr(newlines);
    return newlines >= 1 && newlines <= 2 && int(indent.size()) <= max_indent_ &&
           indent.find_first_not_of(" \t") == std::string_view::npos;
  }
  bool lit(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool hex4(unsigned& out) {
    if (i_ + 4 > s_.size()) return false;
    out = 0;
    for (int k = 0; k < 4; ++k) {
      int h = hex(s_[i_ + size_t(k)]);
      if (h < 0) return false;
      out = out * 16 + unsigned(h);
    }
    i_ += 4;
    return true;
  }
  // One UTF-8 code point starting at i_ (non-ASCII); false if malformed.
  bool utf8() {
    const auto b0 = uint8_t(s_[i_]);
    int len;
    uint32_t cp;
    if (b0 >= 0xC2 && b0 <= 0xDF) len = 2, cp = b0 & 0x1F;
    else if (b0 >= 0xE0 && b0 <= 0xEF) len = 3, cp = b0 & 0x0F;
    else if (b0 >= 0xF0 && b0 <= 0xF4) len = 4, cp = b0 & 0x07;
    else return false;
    if (i_ + size_t(len) > s_.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto b = uint8_t(s_[i_ + size_t(k)]);
      if ((b & 0xC0) != 0x80) return false;
      cp = cp << 6 | (b & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i_ += size_t(len);
    return true;
  }
  std::optional<JValue> string() {
    JValue v;
    v.kind = JValue::kString;
    const size_t begin = i_;
    if (!lit("\"")) return std::nullopt;
    size_t n = 0;
    while (true) {
      if (i_ >= s_.size()) return std::nullopt;
      const char c = s_[i_];
      if (c == '"') {
        ++i_;
        break;
      }
      if (uint8_t(c) < 0x20) return std::nullopt;
      if (c == '\\') {
        ++i_;
        if (i_ >= s_.size()) return std::nullopt;
        const char e = s_[i_++];
        if (e == 'u') {
          unsigned u;
          if (!hex4(u)) return std::nullopt;
          if (u >= 0xDC00 && u <= 0xDFFF) return std::nullopt;
          if (u >= 0xD800 && u <= 0xDBFF) {
            unsigned lo;
            if (!lit("\\u") || !hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) return std::nullopt;
          }
        } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
          return std::nullopt;
        }
      } else if (uint8_t(c) >= 0x80) {
        if (!utf8()) return std::nullopt;
      } else {
        ++i_;
      }
      ++n;
    }
    v.code_points = n;
    v.raw = std::string(s_.substr(begin, i_ - begin));
    return v;
  }
  std::optional<JValue> number() {
    const size_t begin = i_;
    auto digits = [&] {
      size_t n = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_, ++n;
      return n;
    };
    lit("-");
    if (lit("0")) {
    } else if (i_ < s_.size() && s_[i_] >= '1' && s_[i_] <= '9') {
      if (digits() > max_integer_digits_) return std::nullopt;
    } else {
      return std::nullopt;
    }
    if (lit(".")) {
      const size_t n = digits();
      if (n == 0 || n > kRefMaxFractionDigits) return std::nullopt;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (!lit("+")) lit("-");
      const size_t n = digits();
      if (n == 0 || n > kRefMaxExponentDigits) return std::nullopt;
    }
    JValue v;
    v.kind = JValue::kNumber;
    v.raw = std::string(s_.substr(begin, i_ - begin));
    return v;
  }
  std::optional<JValue> value(int depth) {
    if (depth > 200 || i_ >= s_.size()) return std::nullopt;
    const size_t begin = i_;
    JValue v;
    const char c = s_[i_];
    if (c == '"') return string();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (lit("true") || lit("false")) {
      v.kind = JValue::kBool;
    } else if (lit("null")) {
      v.kind = JValue::kNull;
    } else if (c == '[' || c == '{') {
      const bool obj = c == '{';
      v.kind = obj ? JValue::kObject : JValue::kArray;
      ++i_;
      if (!ws()) return std::nullopt;
      if (!lit(obj ? "}" : "]")) {
        while (true) {
          if (obj) {
            auto key = string();
            if (!key || !ws() || !lit(":") || !ws()) return std::nullopt;
            auto item = value(depth + 1);
            if (!item) return std::nullopt;
            v.members.emplace_back(key->raw, std::move(*item));
          } else {
            auto item = value(depth + 1);
            if (!item) return std::nullopt;
            v.items.push_back(std::move(*item));
          }
          if (!ws()) return std::nullopt;
          if (lit(obj ? "}" : "]")) break;
          if (!lit(",") || !ws()) return std::nullopt;
        }
      }
    } else {
      return std::nullopt;
    }
    v.raw = std::string(s_.substr(begin, i_ - begin));
    return v;
  }

  std::string_view s_;
  size_t i_ = 0;
  int max_indent_;
  size_t max_integer_digits_;
};

// The numeric keywords as a RefRange (bounds that JSON::dump writes as plain decimals, one per
// side; draft 4's booleans), nullopt without any.
inline std::optional<RefRange> ref_numeric_range(const json& schema, bool integer) {
  RefRange r;
  r.integer = integer;
  bool any = false;
  auto side = [&](const char* inclusive, const char* exclusive) -> std::optional<RefBound> {
    const bool flag = schema.contains(exclusive) && schema[exclusive].is_boolean() && schema[exclusive].get<bool>();
    if (schema.contains(inclusive)) return RefBound{schema[inclusive].dump(), flag};
    if (schema.contains(exclusive) && schema[exclusive].is_number()) return RefBound{schema[exclusive].dump(), true};
    return std::nullopt;
  };
  r.lo = side("minimum", "exclusiveMinimum");
  r.hi = side("maximum", "exclusiveMaximum");
  any = r.lo || r.hi;
  if (schema.contains("multipleOf")) r.modulus = long(schema["multipleOf"].get<double>()), any = true;
  if (!any) return std::nullopt;
  return r;
}

// Validity under the schema subset, in the canonical form of grammar/json_schema.h.
class RefValidator {
 public:
  explicit RefValidator(const json& document) : doc_(document) {}

  bool valid(const json& schema, const JValue& v) const {
    if (schema.is_boolean()) return schema.get<bool>();
    if (schema.contains("$ref"))
      return valid(doc_.at(json::json_pointer(schema["$ref"].get<std::string>().substr(1))), v);
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!schema.contains(k)) continue;
      for (const json& option : schema[k])
        if (valid(option, v)) return true;
      return false;
    }
    std::vector<std::string> types;
    if (schema.contains("type")) {
      if (schema["type"].is_string()) types.push_back(schema["type"]);
      else
        for (const json& t : schema["type"]) types.push_back(t);
    }
    if (schema.contains("enum") || schema.contains("const")) {
      json values = schema.contains("const") ? json::array({schema["const"]}) : schema["enum"];
      for (const json& value : values)
        if (v.raw == value.dump() && (types.empty() || any_type(types, value))) return true;
      return false;
    }
    if (types.empty()) {
      if (schema.contains("properties") || schema.contains("required") || schema.contains("additionalProperties"))
        types = {"object"};
      else if (schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems"))
        types = {"array"};
      else if (schema.contains("minLength") || schema.contains("maxLength")) types = {"string"};
      else if (ref_numeric_range(schema, false)) types = {"number"};
      else return true;
    }
    for (const std::string& t : types)
      if (valid_as(schema, t, v)) return true;
    return false;
  }

 private:
  static bool any_type(const std::vector<std::string>& types, const json& value) {
    for (const std::string& t : types) {
      if ((t == "string" && value.is_string()) || (t == "integer" && value.is_number_integer()) ||
          (t == "number" && value.is_number()) || (t == "boolean" && value.is_boolean()) ||
          (t == "null" && value.is_null()) || (t == "object" && value.is_object()) ||
          (t == "array" && value.is_array()))
        return true;
    }
    return false;
  }

  bool valid_as(const json& schema, const std::string& t, const JValue& v) const {
    if (t == "string") {
      const size_t min = schema.value("minLength", size_t(0));
      const size_t max = schema.contains("maxLength") ? schema["maxLength"].get<size_t>()
                                                      : min + kRefMaxFreeStringChars;
      return v.kind == JValue::kString && v.code_points >= min && v.code_points <= max;
    }
    if (t == "integer" || t == "number") {
      if (v.kind != JValue::kNumber) return false;
      if (t == "integer" && v.raw.find_first_of(".eE") != std::string::npos) return false;
      const auto range = ref_numeric_range(schema, t == "integer");
      return !range || ref_in_range(*range, v.raw);
    }
    if (t == "boolean") return v.kind == JValue::kBool;
    if (t == "null") return v.kind == JValue::kNull;
    if (t == "array") {
      if (v.kind != JValue::kArray) return false;
      if (v.items.size() < schema.value("minItems", size_t(0))) return false;
      if (schema.contains("maxItems") && v.items.size() > schema["maxItems"].get<size_t>()) return false;
      const json items = schema.contains("items") ? schema["items"] : json(true);
      for (const JValue& item : v.items)
        if (!valid(items, item)) return false;
      return true;
    }
    if (v.kind != JValue::kObject) return false;
    const json props = schema.value("properties", json::object());
    std::vector<std::string> names, texts;
    for (const auto& [name, sub] : props.items()) names.push_back(name), texts.push_back(json(name).dump());
    std::set<std::string> seen;
    size_t next = 0;
    bool additional_phase = false;
    for (const auto& [key, value] : v.members) {
      size_t j = 0;
      while (j < texts.size() && texts[j] != key) ++j;
      if (j < texts.size() && !additional_phase) {
        if (j < next) return false;  // out of order or repeated
        if (!valid(props[names[j]], value)) return false;
        seen.insert(names[j]);
        next = j + 1;
        continue;
      }
      // An additional property: allowed, escape-free, none of the declared names.
      const json additional = schema.value("additionalProperties", json(false));
      if (additional.is_boolean() && !additional.get<bool>()) return false;
      if (key.find('\\') != std::string::npos || j < texts.size()) return false;
      additional_phase = true;
      if (!valid(additional, value)) return false;
    }
    for (const json& r : schema.value("required", json::array()))
      if (!seen.count(r.get<std::string>())) return false;
    return true;
  }

  const json& doc_;
};

// Random strings, schemas and documents.
class RefGenerator {
 public:
  explicit RefGenerator(uint64_t seed) : rng_(seed) {}
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  std::mt19937_64& rng() { return rng_; }

  // A gap of whitespace of the canonical form (max_indent as RefParser's).
  std::string ws(int max_indent) {
    if (max_indent < 0 || chance(0.6)) return "";
    if (chance(0.5)) return " ";
    std::string s(size_t(uniform(1, 2)), '\n');
    for (int i = 0, n = uniform(0, chance(0.9) ? 4 : max_indent); i < n; ++i) s += " \t"[uniform(0, 1)];
    return s;
  }

  // One string character as JSON writes it (1 code point).
  std::string string_char() {
    switch (uniform(0, 9)) {
      case 0: return "\\n";
      case 1: return "\\\"";
      case 2: return "\\u00e9";
      case 3: return "\\uD83D\\uDE00";
      case 4: return "é";
      case 5: return "世";
      case 6: return "🎉";
      case 7: return " ";
      default: return std::string(1, char('a' + uniform(0, 25)));
    }
  }
  std::string string_text(int min, int max) {
    const int n = uniform(min, max < 0 ? min + 6 : max);
    std::string s = "\"";
    for (int i = 0; i < n; ++i) s += string_char();
    return s + "\"";
  }
  std::string number(bool integer) {
    std::string s = chance(0.3) ? "-" : "";
    s += chance(0.2) ? "0" : std::to_string(uniform(1, 99999));
    if (!integer && chance(0.5)) s += "." + std::to_string(uniform(0, 999));
    if (!integer && chance(0.3)) s += std::string(chance(0.5) ? "e" : "E") + (chance(0.5) ? "-" : "") + "12";
    return s;
  }

  json leaf_schema() {
    if (chance(0.15)) return ranged_schema();
    switch (uniform(0, 9)) {
      case 0: return {{"type", "string"}};
      case 1: {
        json s = {{"type", "string"}, {"minLength", uniform(0, 2)}};
        if (chance(0.7)) s["maxLength"] = uniform(2, 5);
        return s;
      }
      case 2: return {{"type", "integer"}};
      case 3: return {{"type", "number"}};
      case 4: return {{"type", "boolean"}};
      case 5: return {{"type", json::array({"string", "null"})}};
      case 6: return {{"enum", json::array({"red", "green", 3, nullptr, "é\"q"})}};
      case 7: return {{"const", json::object({{"k", json::array({1, 2})}})}};
      case 8: return json::object();
      default: return {{"type", "null"}};
    }
  }
  // An integer or number with a range (number_range.h), bounds JSON::dump writes plainly.
  json ranged_schema() {
    const bool integer = chance(0.5);
    json s = {{"type", integer ? "integer" : "number"}};
    const int lo = uniform(-40, 60), hi = lo + uniform(0, 120);
    const char* lower = chance(0.5) ? "minimum" : "exclusiveMinimum";
    const char* upper = chance(0.5) ? "maximum" : "exclusiveMaximum";
    if (chance(0.8)) s[lower] = integer || chance(0.5) ? json(lo) : json(lo + 0.25);
    if (chance(0.8)) s[upper] = integer || chance(0.5) ? json(hi) : json(hi + 0.5);
    if (integer && chance(0.3)) s["multipleOf"] = uniform(2, 7);
    if (!s.contains(lower) && !s.contains(upper) && !s.contains("multipleOf")) s["minimum"] = lo;
    return s;
  }
  // A number valid under a ranged schema, by trying (nullopt: none found).
  std::optional<std::string> ranged_number(const json& schema, bool integer) {
    const auto range = ref_numeric_range(schema, integer);
    for (int i = 0; i < 200; ++i) {
      std::string s = std::to_string(uniform(-60, 220));
      if (!integer && chance(0.6)) s += "." + std::to_string(uniform(0, 9999));
      if (ref_in_range(*range, s)) return s;
    }
    return std::nullopt;
  }

  json schema(int depth) {
    const int pick = depth <= 0 ? 0 : uniform(0, 5);
    if (pick <= 1) return leaf_schema();
    if (pick == 2 || pick == 3) {
      json props = json::object();
      json required = json::array();
      static const char* const names[] = {"id", "name", "tags", "a\"b", "ünï", "x"};
      for (int i = 0, n = uniform(0, 4); i < n; ++i) {
        std::string name = names[uniform(0, 5)];
        if (props.contains(name)) continue;
        props[name] = schema(depth - 1);
        if (chance(0.5)) required.push_back(name);
      }
      json s = {{"type", "object"}, {"properties", props}};
      if (!required.empty()) s["required"] = required;
      const int add = uniform(0, 3);
      if (add == 1) s["additionalProperties"] = false;
      if (add == 2) s["additionalProperties"] = true;
      if (add == 3) s["additionalProperties"] = leaf_schema();
      return s;
    }
    if (pick == 4) {
      json s = {{"type", "array"}, {"items", schema(depth - 1)}};
      if (chance(0.5)) s["minItems"] = uniform(0, 2);
      if (chance(0.5)) s["maxItems"] = uniform(2, 4);
      return s;
    }
    return {{chance(0.5) ? "anyOf" : "oneOf", json::array({schema(depth - 1), schema(depth - 1)})}};
  }

  // A document valid under the schema (canonical form), or nullopt where the generator gives up.
  std::optional<std::string> valid(const json& doc, const json& schema, int depth, int max_ws) {
    if (depth > 6) return std::nullopt;
    if (schema.is_boolean()) return any(depth, max_ws);
    if (schema.contains("$ref"))
      return valid(doc, doc.at(json::json_pointer(schema["$ref"].get<std::string>().substr(1))), depth, max_ws);
    for (const char* k : {"anyOf", "oneOf"})
      if (schema.contains(k))
        return valid(doc, schema[k][size_t(uniform(0, int(schema[k].size()) - 1))], depth, max_ws);
    if (schema.contains("const")) return schema["const"].dump();
    if (schema.contains("enum")) return schema["enum"][size_t(uniform(0, int(schema["enum"].size()) - 1))].dump();
    std::string type;
    if (schema.contains("type")) {
      const json& t = schema["type"];
      type = t.is_string() ? t.get<std::string>() : t[size_t(uniform(0, int(t.size()) - 1))].get<std::string>();
    } else if (schema.contains("properties")) {
      type = "object";
    } else {
      return any(depth, max_ws);
    }
    if (type == "string")
      return string_text(schema.value("minLength", 0),
                         schema.contains("maxLength") ? schema["maxLength"].get<int>() : -1);
    if ((type == "integer" || type == "number") && ref_numeric_range(schema, type == "integer"))
      return ranged_number(schema, type == "integer");
    if (type == "integer" || type == "number") return number(type == "integer");
    if (type == "boolean") return chance(0.5) ? "true" : "false";
    if (type == "null") return "null";
    if (type == "array") {
      const int min = schema.value("minItems", 0), max = schema.value("maxItems", min + 3);
      const json items = schema.contains("items") ? schema["items"] : json(true);
      std::string s = "[" + ws(max_ws);
      for (int i = 0, n = uniform(min, max); i < n; ++i) {
        auto item = valid(doc, items, depth + 1, max_ws);
        if (!item) return std::nullopt;
        s += (i ? ws(max_ws) + "," + ws(max_ws) : "") + *item;
      }
      return s + ws(max_ws) + "]";
    }
    std::string s = "{" + ws(max_ws);
    bool first = true;
    std::set<std::string> required;
    for (const json& r : schema.value("required", json::array())) required.insert(r.get<std::string>());
    const json props = schema.value("properties", json::object());
    for (const auto& [name, sub] : props.items()) {
      if (!required.count(name) && chance(0.4)) continue;
      auto item = valid(doc, sub, depth + 1, max_ws);
      if (!item) return std::nullopt;
      s += (first ? "" : ws(max_ws) + "," + ws(max_ws)) + json(name).dump() + ws(max_ws) + ":" + ws(max_ws) + *item;
      first = false;
    }
    const json additional = schema.value("additionalProperties", json(false));
    if (!(additional.is_boolean() && !additional.get<bool>()) && chance(0.5)) {
      auto item = valid(doc, additional, depth + 1, max_ws);
      if (!item) return std::nullopt;
      s += (first ? "" : ",") + std::string("\"extra_") + std::to_string(uniform(0, 9)) + "\":" + *item;
    }
    return s + ws(max_ws) + "}";
  }

  std::string any(int depth, int max_ws) {
    switch (depth > 4 ? uniform(0, 3) : uniform(0, 5)) {
      case 0: return string_text(0, 4);
      case 1: return number(false);
      case 2: return chance(0.5) ? "true" : "null";
      case 3: return "false";
      case 4: {
        std::string s = "[";
        for (int i = 0, n = uniform(0, 3); i < n; ++i) s += (i ? "," : "") + any(depth + 1, max_ws);
        return s + "]";
      }
      default: {
        std::string s = "{" + ws(max_ws);
        for (int i = 0, n = uniform(0, 3); i < n; ++i)
          s += (i ? "," : "") + string_text(0, 3) + ":" + ws(max_ws) + any(depth + 1, max_ws);
        return s + "}";
      }
    }
  }

  // A random edit of a text: most are invalid, some stay valid; both are useful.
  std::string mutate(std::string s) {
    static const char kPieces[] = "{}[],:\" \\0123456789.eE-+tfnul\xc3\xa9\xff";
    const int kind = uniform(0, 3);
    if (s.empty() || kind == 0) {
      s.insert(size_t(uniform(0, int(s.size()))), 1, kPieces[uniform(0, int(sizeof(kPieces)) - 2)]);
    } else if (kind == 1) {
      s.erase(size_t(uniform(0, int(s.size()) - 1)), 1);
    } else if (kind == 2) {
      s[size_t(uniform(0, int(s.size()) - 1))] = kPieces[uniform(0, int(sizeof(kPieces)) - 2)];
    } else {
      const size_t a = size_t(uniform(0, int(s.size()) - 1));
      s.insert(a, s.substr(a, size_t(uniform(1, 6))));
    }
    return s;
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace lily::test
