// number_keywords.cpp: a schema's minimum / maximum / exclusive* / multipleOf as a NumberRange
// (number_range.h has the rules).
#include <algorithm>
#include <cmath>
#include <optional>

#include "grammar/fragments.h"
#include "grammar/number_range.h"

namespace lily::grammar {

namespace {

const char* const kKeywords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};

std::string quoted(const char* keyword) { return std::string("'") + keyword + "'"; }

// The bound as written: an integer exactly, a float as its shortest decimal.
Decimal exact_value(const json& v) {
  if (v.is_number_unsigned()) return Decimal::of_integer({false, std::to_string(v.get<uint64_t>())});
  if (v.is_number_integer()) return Decimal::of_integer(BigInt::of(v.get<int64_t>()));
  return Decimal::shortest(v.get<double>());
}

// A bound on the grid and the keyword that gave it.
struct Bound {
  BigInt value;
  const char* keyword;
};

// The tighter of two bounds (the greater lower one: `lower`; else the smaller upper one).
std::optional<Bound> tighter(std::optional<Bound> a, std::optional<Bound> b, bool lower) {
  if (!a) return b;
  if (!b) return a;
  const bool b_wins = lower ? a->value < b->value : b->value < a->value;
  return b_wins ? b : a;
}

// One side of the range: `inclusive` (minimum / maximum) with draft 4's boolean exclusive form,
// and `exclusive` in draft 2020-12's numeric form.
std::optional<Bound> side(const json& schema, const char* inclusive, const char* exclusive, bool lower, int grid) {
  std::optional<Bound> out;
  const json* flag = schema.contains(exclusive) && schema[exclusive].is_boolean() ? &schema[exclusive] : nullptr;
  if (auto it = schema.find(inclusive); it != schema.end()) {
    BigInt v;
    if (flag != nullptr && flag->get<bool>()) {
      v = lower ? least_above_double(it->get<double>(), grid) : greatest_below_double(it->get<double>(), grid);
    } else {
      v = lower ? ceil_on_grid(exact_value(*it), grid) : floor_on_grid(exact_value(*it), grid);
    }
    out = Bound{v, inclusive};
  }
  if (auto it = schema.find(exclusive); it != schema.end() && it->is_number()) {
    const double d = it->get<double>();
    out = tighter(out, Bound{lower ? least_above_double(d, grid) : greatest_below_double(d, grid), exclusive}, lower);
  }
  return out;
}

// The digits before the point of a grid value (at least 1).
int integer_digits(const BigInt& v, int grid) { return std::max(1, int(v.magnitude.size()) - grid); }

std::string describe(const Bound& b, const json& schema) { return quoted(b.keyword) + " " + schema[b.keyword].dump(); }

// Whether a multiple of m lies in [lo, hi] (0 <= lo <= hi magnitudes).
bool has_multiple(const std::string& lo, const std::string& hi, int64_t m) {
  BigInt top{false, hi};
  for (int64_t r = magnitude_mod(hi, m); r > 0; --r) top = top.minus_one();
  return compare_magnitudes(top.magnitude, lo) >= 0 && !top.negative;
}

bool range_has_multiple(const BigInt& lo, const BigInt& hi, int64_t m) {
  if (lo.negative != hi.negative || lo.is_zero()) return true;  // 0 is in it
  return lo.negative ? has_multiple(hi.magnitude, lo.magnitude, m) : has_multiple(lo.magnitude, hi.magnitude, m);
}

}  // namespace

const char* first_numeric_keyword(const json& schema) {
  for (const char* k : kKeywords)
    if (schema.contains(k)) return k;
  return nullptr;
}

void check_numeric_keywords(const json& schema, const std::string& path) {
  for (const char* k : kKeywords) {
    auto it = schema.find(k);
    if (it == schema.end()) continue;
    const bool draft4 = it->is_boolean() && std::string(k).starts_with("exclusive");
    if (draft4) {
      const char* inclusive = std::string(k) == "exclusiveMinimum" ? "minimum" : "maximum";
      if (it->get<bool>() && !schema.contains(inclusive))
        throw SchemaError(k, path, quoted(k) + " true (draft 4) needs " + quoted(inclusive) + " next to it");
      continue;
    }
    if (!it->is_number() || !std::isfinite(it->get<double>()))
      throw SchemaError(k, path, quoted(k) + " must be a number");
  }
  if (auto it = schema.find("multipleOf"); it != schema.end()) {
    const double m = it->get<double>();
    if (!(m > 0) || m != std::floor(m) || m > double(kMaxModulus))
      throw SchemaError("multipleOf", path,
                        "'multipleOf' must be a positive integer up to " + std::to_string(kMaxModulus) +
                            " (a fraction is not supported: validators dividing doubles disagree on it)");
  }
}

NumberRange number_range(const json& schema, bool integer, const std::string& path) {
  check_numeric_keywords(schema, path);
  NumberRange r;
  if (auto it = schema.find("multipleOf"); it != schema.end()) r.modulus = int64_t(it->get<double>());
  r.fraction_digits = integer || r.modulus > 1 ? 0 : kMaxFractionDigits;
  const int grid = r.fraction_digits;
  const std::optional<Bound> lo = side(schema, "minimum", "exclusiveMinimum", true, grid);
  const std::optional<Bound> hi = side(schema, "maximum", "exclusiveMaximum", false, grid);
  const char* what = grid == 0 ? "integer" : "number";

  // More digits than the default only where a bound needs them (minimum 1e20): a lower bound
  // above zero, an upper one below.
  r.integer_digits = kMaxIntegerDigits;
  for (const Bound* b : {lo && !lo->value.negative ? &*lo : nullptr, hi && hi->value.negative ? &*hi : nullptr}) {
    if (b == nullptr) continue;
    const int digits = integer_digits(b->value, grid);
    if (digits > kMaxRangeDigits)
      throw SchemaError(b->keyword, path,
                        describe(*b, schema) + " needs " + std::to_string(digits) + " digits; lily writes " +
                            std::string(what) + "s of at most " + std::to_string(kMaxRangeDigits));
    r.integer_digits = std::max(r.integer_digits, digits);
  }
  const BigInt cap{false, nines(r.integer_digits + grid)};
  r.lo = lo && -cap < lo->value ? lo->value : -cap;
  r.hi = hi && hi->value < cap ? hi->value : cap;
  if (r.hi < r.lo) {
    const Bound& blame = lo ? *lo : *hi;
    std::string range = lo ? describe(*lo, schema) : std::string();
    if (hi) range += (lo ? ", " : "") + describe(*hi, schema);
    throw SchemaError(blame.keyword, path, "no " + std::string(what) + " lies in the range: " + range);
  }
  if (r.modulus > 1 && !range_has_multiple(r.lo, r.hi, r.modulus))
    throw SchemaError("multipleOf", path, "no multiple of " + std::to_string(r.modulus) + " lies in the range");
  return r;
}

}  // namespace lily::grammar
