// python_format.h: Python's text forms of JSON values, as the chat template's Jinja environment
// produces them (transformers: `tojson` = json.dumps(x, ensure_ascii=False); `{{ x }}` = str(x);
// `|trim` = str.strip()).
//
// Byte-exact rendering of the chat template depends on these: a tool schema or a tool-call
// argument dumped with another float format or separator is a different prompt.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace lily::python {

// repr(float): shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16 with a
// trailing ".0" when integral, otherwise "1e-05" / "1.5e+16". nan, inf, -inf as Python prints them.
std::string float_repr(double value);

// json.dumps(value, ensure_ascii=False): insertion key order, ", " and ": " separators,
// non-ASCII left raw, floats as repr (NaN / Infinity / -Infinity for the non-finite ones).
std::string json_dumps(const nlohmann::ordered_json& value);

// str(value) of a JSON scalar: strings raw, True / False / None, ints, float repr.
// Throws lily::Error for objects and arrays (Python would print a dict/list repr).
std::string str(const nlohmann::ordered_json& value);

// str.strip() with no argument: removes leading and trailing Unicode whitespace
// (the characters for which Python's str.isspace() is true). `text` must be UTF-8.
std::string_view strip(std::string_view text);

// str.lstrip(chars) / str.rstrip(chars) for a set of ASCII characters.
std::string_view lstrip(std::string_view text, std::string_view chars);
std::string_view rstrip(std::string_view text, std::string_view chars);

}  // namespace lily::python
