// number_oracle.h: the range tests' oracle, written apart from src/grammar: whether a text is a
// number that grammar/number_range.h's language takes, by the rules stated there, checked on the
// text itself (decimal strings compared digit by digit, and strtod for the double reader).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace lily::test {

struct RefBound {
  std::string text;  // a plain decimal, no exponent: "-2.75", "100"
  bool exclusive = false;
};

struct RefRange {
  bool integer = true;
  std::optional<RefBound> lo, hi;
  int integer_digits = 16;
  long modulus = 1;
};

// -1, 0, 1: a against b, both plain decimals (-?digits(.digits)?), by value.
inline int compare_decimals(const std::string& a, const std::string& b) {
  struct Parts {
    bool negative;
    std::string integer, fraction;
  };
  auto parts = [](std::string s) {
    Parts p{false, "", ""};
    if (!s.empty() && s[0] == '-') p.negative = true, s = s.substr(1);
    const size_t dot = s.find('.');
    p.integer = s.substr(0, dot);
    p.fraction = dot == std::string::npos ? "" : s.substr(dot + 1);
    p.integer.erase(
        0, p.integer.find_first_not_of('0') == std::string::npos ? p.integer.size() : p.integer.find_first_not_of('0'));
    while (!p.fraction.empty() && p.fraction.back() == '0') p.fraction.pop_back();
    if (p.integer.empty() && p.fraction.empty()) p.negative = false;
    return p;
  };
  const Parts x = parts(a), y = parts(b);
  if (x.negative != y.negative) return x.negative ? -1 : 1;
  int c = 0;
  if (x.integer.size() != y.integer.size()) {
    c = x.integer.size() < y.integer.size() ? -1 : 1;
  } else if (x.integer != y.integer) {
    c = x.integer < y.integer ? -1 : 1;
  } else {
    std::string f = x.fraction, g = y.fraction;
    f.resize(std::max(f.size(), g.size()), '0');
    g.resize(f.size(), '0');
    c = f == g ? 0 : f < g ? -1 : 1;
  }
  return x.negative ? -c : c;
}

// The text is -?(0|[1-9][0-9]*) with at most `digits` digits, then (numbers) .[0-9]{1,16};
// not a negative zero.
inline bool ref_number_form(const std::string& s, bool integer, int digits) {
  size_t i = s.size() > 0 && s[0] == '-' ? 1 : 0;
  const size_t start = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  const size_t n = i - start;
  if (n == 0 || int(n) > digits || (n > 1 && s[start] == '0')) return false;
  if (i < s.size()) {
    if (integer || s[i] != '.') return false;
    const size_t f = ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i != s.size() || i == f || i - f > 16) return false;
  }
  return !(start == 1 && s.find_first_not_of("-0.") == std::string::npos);
}

// Whether `text` is in the language of the range.
inline bool ref_in_range(const RefRange& r, const std::string& text) {
  if (!ref_number_form(text, r.integer || r.modulus > 1, r.integer_digits)) return false;
  const double x = std::strtod(text.c_str(), nullptr);
  if (r.lo) {
    const int c = compare_decimals(text, r.lo->text);
    if (c < 0 || (r.lo->exclusive && (c == 0 || !(x > std::strtod(r.lo->text.c_str(), nullptr))))) return false;
  }
  if (r.hi) {
    const int c = compare_decimals(text, r.hi->text);
    if (c > 0 || (r.hi->exclusive && (c == 0 || !(x < std::strtod(r.hi->text.c_str(), nullptr))))) return false;
  }
  if (r.modulus > 1) {
    long rest = 0;
    for (char c : text)
      if (c >= '0' && c <= '9') rest = (rest * 10 + (c - '0')) % r.modulus;
    if (rest != 0) return false;
  }
  return true;
}

}  // namespace lily::test
