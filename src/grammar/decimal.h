// decimal.h: exact decimal values for the numeric bounds of a JSON schema (number_range.h).
//
// A bound is read exactly, never through a rounding double: a JSON integer (what nlohmann holds
// as int64 / uint64) as its digits; a JSON float as the shortest decimal that reads back as the
// same double (what the client wrote: 0.1 is 0.1, not 0.1000000000000000055...). Numbers past
// 64 bits reach lily as doubles (nlohmann), so 100000000000000000001 is 1e20.
// Values on a grid (units of 10^-f) are signed integers of any length, as digit strings.
#pragma once

#include <cstdint>
#include <string>

namespace lily::grammar {

// A signed integer of any size: its magnitude's decimal digits, no leading zero ("0" for zero,
// which is never negative).
struct BigInt {
  bool negative = false;
  std::string magnitude = "0";

  static BigInt of(int64_t v);
  BigInt operator-() const;
  BigInt plus_one() const;
  BigInt minus_one() const;
  bool is_zero() const { return magnitude == "0"; }
};
int compare(const BigInt& a, const BigInt& b);  // -1, 0, 1
inline bool operator<(const BigInt& a, const BigInt& b) { return compare(a, b) < 0; }
inline bool operator==(const BigInt& a, const BigInt& b) { return compare(a, b) == 0; }

// Nonnegative digit strings without leading zeros.
int compare_magnitudes(const std::string& a, const std::string& b);
// The magnitude modulo m (1 <= m <= 1'000'000).
int64_t magnitude_mod(const std::string& a, int64_t m);
// "9" x n: the largest magnitude of n digits.
std::string nines(int n);

// digits x 10^-scale, signed: the exact value of a bound.
struct Decimal {
  BigInt digits;
  int scale = 0;  // >= 0: fraction digits in `digits`

  static Decimal of_integer(BigInt v) { return {std::move(v), 0}; }
  // The shortest decimal that reads back as d (d finite).
  static Decimal shortest(double d);
  // The exact value of a finite long double (every double, and the midpoint of two neighbours).
  static Decimal exact(long double v);
};

// The value in units of 10^-f, rounded down / up to an integer.
BigInt floor_on_grid(const Decimal& v, int f);
BigInt ceil_on_grid(const Decimal& v, int f);

// The grid points whose value a double reader puts strictly above / below the double d (a
// correctly rounding parser, ties to even): the least point x with double(x) > d, the greatest
// with double(x) < d. Each is also strictly above / below every decimal that reads as d.
BigInt least_above_double(double d, int f);
BigInt greatest_below_double(double d, int f);

}  // namespace lily::grammar
