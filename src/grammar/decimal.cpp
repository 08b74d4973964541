// decimal.cpp: digit-string integers and the exact decimals of bounds (see the header).
#include "grammar/decimal.h"

#include <charconv>
#include <cmath>

#include "base/error.h"

namespace lily::grammar {

namespace {

std::string strip_leading_zeros(std::string s) {
  const size_t first = s.find_first_not_of('0');
  return first == std::string::npos ? "0" : s.substr(first);
}

BigInt make(bool negative, std::string magnitude) {
  BigInt v{negative, strip_leading_zeros(std::move(magnitude))};
  if (v.is_zero()) v.negative = false;
  return v;
}

std::string increment(std::string s) {
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '9') {
      ++s[i];
      return s;
    }
    s[i] = '0';
  }
  return "1" + s;
}

std::string decrement(std::string s) {  // s > 0
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '0') {
      --s[i];
      return strip_leading_zeros(s);
    }
    s[i] = '9';
  }
  lily::fail("grammar: decrement of zero");
}

// s x factor (factor < 2^32).
std::string times(const std::string& s, uint64_t factor) {
  std::string out(s.size(), '0');
  uint64_t carry = 0;
  for (size_t i = s.size(); i-- > 0;) {
    const uint64_t v = uint64_t(s[i] - '0') * factor + carry;
    out[i] = char('0' + v % 10);
    carry = v / 10;
  }
  while (carry > 0) {
    out.insert(out.begin(), char('0' + carry % 10));
    carry /= 10;
  }
  return strip_leading_zeros(out);
}

// s x base^n, in steps of base^chunk (base^chunk < 2^32).
std::string times_power(std::string s, uint64_t base, int chunk, int n) {
  uint64_t step = 1;
  for (int i = 0; i < chunk; ++i) step *= base;
  for (; n >= chunk; n -= chunk) s = times(s, step);
  for (; n > 0; --n) s = times(s, base);
  return s;
}

}  // namespace

BigInt BigInt::of(int64_t v) {
  const uint64_t m = v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v);
  return make(v < 0, std::to_string(m));
}

BigInt BigInt::operator-() const { return make(!negative, magnitude); }

BigInt BigInt::plus_one() const {
  if (negative) return make(true, decrement(magnitude));
  return make(false, increment(magnitude));
}

BigInt BigInt::minus_one() const {
  if (negative || is_zero()) return make(true, increment(magnitude));
  return make(false, decrement(magnitude));
}

int compare_magnitudes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  const int c = a.compare(b);
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

int compare(const BigInt& a, const BigInt& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int c = compare_magnitudes(a.magnitude, b.magnitude);
  return a.negative ? -c : c;
}

int64_t magnitude_mod(const std::string& a, int64_t m) {
  int64_t r = 0;
  for (char c : a) r = (r * 10 + (c - '0')) % m;
  return r;
}

std::string nines(int n) { return std::string(size_t(n), '9'); }

Decimal Decimal::shortest(double d) {
  LILY_CHECK(std::isfinite(d), "grammar: a bound that is not finite");
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string text(buf, r.ptr);  // [-]d[.ddd]e[+-]xx
  const size_t e = text.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (text[i] >= '0' && text[i] <= '9') digits += text[i];
  const int power = std::stoi(text.substr(e + 1)) - int(digits.size() - 1);
  if (power >= 0) return {make(d < 0, digits + std::string(size_t(power), '0')), 0};
  return {make(d < 0, digits), -power};
}

Decimal Decimal::exact(long double v) {
  LILY_CHECK(std::isfinite(v), "grammar: a bound that is not finite");
  if (v == 0) return {};
  int e = 0;
  const long double fraction = std::frexp(std::fabs(v), &e);  // |v| = fraction x 2^e, [0.5, 1)
  uint64_t m = uint64_t(std::ldexp(fraction, 64));            // exact: 64 mantissa bits
  int power = e - 64;
  while (m % 2 == 0) m /= 2, ++power;
  if (power >= 0) return {make(v < 0, times_power(std::to_string(m), 2, 31, power)), 0};
  return {make(v < 0, times_power(std::to_string(m), 5, 13, -power)), -power};
}

BigInt floor_on_grid(const Decimal& v, int f) {
  const std::string& m = v.digits.magnitude;
  const int shift = f - v.scale;
  if (shift >= 0) return make(v.digits.negative, v.digits.is_zero() ? m : m + std::string(size_t(shift), '0'));
  const size_t drop = size_t(-shift);
  const std::string kept = drop >= m.size() ? "0" : m.substr(0, m.size() - drop);
  const std::string dropped = drop >= m.size() ? m : m.substr(m.size() - drop);
  const BigInt truncated = make(v.digits.negative, kept);
  const bool inexact = dropped.find_first_not_of('0') != std::string::npos;
  return v.digits.negative && inexact ? truncated.minus_one() : truncated;
}

BigInt ceil_on_grid(const Decimal& v, int f) { return -floor_on_grid({-v.digits, v.scale}, f); }

BigInt least_above_double(double d, int f) {
  const double up = std::nextafter(d, INFINITY);
  if (!std::isfinite(up)) return floor_on_grid(Decimal::exact(d), f).plus_one();
  // The doubles' midpoint, exact in a long double (64 mantissa bits); a reader rounds it to
  // the neighbour with the even mantissa.
  const long double mid = (static_cast<long double>(d) + static_cast<long double>(up)) / 2;
  const bool tie_goes_up = static_cast<double>(mid) == up;
  return tie_goes_up ? ceil_on_grid(Decimal::exact(mid), f) : floor_on_grid(Decimal::exact(mid), f).plus_one();
}

BigInt greatest_below_double(double d, int f) { return -least_above_double(-d, f); }

}  // namespace lily::grammar
