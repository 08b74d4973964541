// python_format.cpp: Python's repr/str/json.dumps/strip, byte for byte (see python_format.h).
#include "chat/python_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "base/error.h"

namespace lily::python {
namespace {

using json = nlohmann::ordered_json;

// CPython's json encoder with ensure_ascii=False (py_encode_basestring): escapes only the quote,
// the backslash and the C0 controls; \b \f \n \r \t by name, the others as \u00xx.
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// json.dumps's float: float.__repr__, with Python's own spellings of the non-finite values.
std::string json_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return float_repr(value);
}

void append_dumps(std::string& out, const json& value) {
  switch (value.type()) {
    case json::value_t::null: out += "null"; break;
    case json::value_t::boolean: out += value.get<bool>() ? "true" : "false"; break;
    case json::value_t::number_integer: out += std::to_string(value.get<std::int64_t>()); break;
    case json::value_t::number_unsigned: out += std::to_string(value.get<std::uint64_t>()); break;
    case json::value_t::number_float: out += json_float(value.get<double>()); break;
    case json::value_t::string: append_json_string(out, value.get_ref<const std::string&>()); break;
    case json::value_t::array: {
      out += '[';
      bool first = true;
      for (const json& item : value) {
        if (!first) out += ", ";
        first = false;
        append_dumps(out, item);
      }
      out += ']';
      break;
    }
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, key);
        out += ": ";
        append_dumps(out, item);
      }
      out += '}';
      break;
    }
    default: fail("json.dumps: cannot encode a JSON value of type {}", value.type_name());
  }
}

// Python's str.isspace() code points.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Decodes the UTF-8 sequence of `len` bytes at `p` (the caller checked the length).
char32_t decode(const unsigned char* p, size_t len) {
  if (len == 1) return p[0];
  char32_t c = p[0] & (0xFF >> (len + 1));
  for (size_t i = 1; i < len; ++i) c = (c << 6) | (p[i] & 0x3F);
  return c;
}

size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;  // a stray continuation byte: never whitespace
}

}  // namespace

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, as "d[.ddd]e±XX" (what CPython's dtoa mode 0 yields).
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  LILY_CHECK(ec == std::errc(), "float_repr: to_chars failed");
  std::string_view sci(buf, end - buf);
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = std::atoi(std::string(sci.substr(e + 1)).c_str());
  // CPython float_repr_style 'short': the decimal point sits after `decpt` digits; exponent
  // notation when decpt <= -4 or decpt > 16 (pystrtod.c format_float_short, mode 'r').
  int decpt = exponent + 1;
  int ndigits = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (ndigits > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (decpt <= 0) {
    out += "0.";
    out.append(-decpt, '0');
    out += digits;
  } else if (decpt >= ndigits) {
    out += digits;
    out.append(decpt - ndigits, '0');
    out += ".0";
  } else {
    out += digits.substr(0, decpt);
    out += '.';
    out += digits.substr(decpt);
  }
  return out;
}

std::string json_dumps(const json& value) {
  std::string out;
  append_dumps(out, value);
  return out;
}

std::string str(const json& value) {
  switch (value.type()) {
    case json::value_t::string: return value.get<std::string>();
    case json::value_t::null: return "None";
    case json::value_t::boolean: return value.get<bool>() ? "True" : "False";
    case json::value_t::number_integer: return std::to_string(value.get<std::int64_t>());
    case json::value_t::number_unsigned: return std::to_string(value.get<std::uint64_t>());
    case json::value_t::number_float: return float_repr(value.get<double>());
    default: fail("str() of a JSON {} is not supported", value.type_name());
  }
}

std::string_view strip(std::string_view text) {
  auto bytes = [&](size_t i) { return reinterpret_cast<const unsigned char*>(text.data()) + i; };
  size_t begin = 0;
  while (begin < text.size()) {
    size_t len = sequence_length(*bytes(begin));
    if (begin + len > text.size() || !is_python_space(decode(bytes(begin), len))) break;
    begin += len;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && end - start < 4 && (*bytes(start) & 0xC0) == 0x80) --start;
    size_t len = sequence_length(*bytes(start));
    if (start + len != end || !is_python_space(decode(bytes(start), len))) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

std::string_view lstrip(std::string_view text, std::string_view chars) {
  size_t begin = text.find_first_not_of(chars);
  return begin == std::string_view::npos ? std::string_view() : text.substr(begin);
}

std::string_view rstrip(std::string_view text, std::string_view chars) {
  size_t last = text.find_last_not_of(chars);
  return last == std::string_view::npos ? std::string_view() : text.substr(0, last + 1);
}

}  // namespace lily::python
