// number_range.h: the numeric keywords of a JSON schema (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum, multipleOf) as a grammar of exactly the numbers they allow.
//
// The language, for "type": "integer" or "number" with any of the keywords:
//   * integers as JSON writes them: -?(0|[1-9][0-9]*), at most 16 digits, or as many as a
//     bound needs (minimum 1e20: 21 digits), at most kMaxRangeDigits; zero is written 0, never
//     -0; numbers the same with an optional fraction of 1..16 digits (trailing zeros allowed:
//     0.50) and no exponent;
//   * exactly the values in the range: every text the grammar takes satisfies every bound, and
//     every value in the range that the form above can write is taken. The bounds are read
//     exactly (decimal.h): minimum 0.1 takes 0.1; a fractional bound on an integer rounds
//     inward (minimum 1.5 -> 2); draft 4's boolean exclusiveMinimum / exclusiveMaximum next to
//     minimum / maximum too; two lower (upper) bounds: the tighter one;
//   * an exclusive bound also leaves out the numbers that a reader of doubles would round onto
//     it (1.0000000000000001 is above 1, but not as a double): for a JavaScript or Python
//     validator as for the mathematical value, every number written is strictly inside. That
//     costs at most the last of 16-17 significant digits;
//   * multipleOf: a positive integer up to kMaxModulus (a number is then written as an integer);
//     a fraction is refused (a validator's double division says 0.3 is no multiple of 0.1).
// Refused, naming the keyword: a value that is not a finite number (draft 4's booleans aside), a
// range with no number the form can write (minimum above maximum, no integer in
// (1, 2), no multiple of 7 in [1, 6]), a bound needing more than kMaxRangeDigits digits.
// The automaton is the classic range-to-digit-classes construction, built digit by digit: its
// states are (position against the point, tight on the lower bound's digits, tight on the
// upper's, residue), so a range costs O(digits x modulus) states.
#pragma once

#include <string>

#include "grammar/decimal.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace lily::grammar {

inline constexpr int kMaxRangeDigits = 40;    // digits before the point a bound may need
inline constexpr int64_t kMaxModulus = 1000;  // multipleOf up to this

struct NumberRange {
  int fraction_digits = 0;  // 0: integers; else up to this many digits after the point
  int integer_digits = 16;  // at most this many before it
  BigInt lo, hi;            // in units of 10^-fraction_digits: lo <= hi, both written in the digits above
  int64_t modulus = 1;      // fraction_digits 0 only: multiples of it
};

// The first of the numeric keywords `schema` has (nullptr: none), and whether it has one.
const char* first_numeric_keyword(const json& schema);
inline bool has_numeric_keywords(const json& schema) { return first_numeric_keyword(schema) != nullptr; }

// Throws SchemaError naming the keyword when a numeric keyword's value is malformed (any type:
// the keywords are read whenever they are present).
void check_numeric_keywords(const json& schema, const std::string& path);

// The range of a value of `schema` as an integer (`integer`) or a number; throws SchemaError
// naming the keyword (see the header comment).
NumberRange number_range(const json& schema, bool integer, const std::string& path);

// The texts of the numbers in r (the language above).
Fragment json_number_in_range(GrammarBuilder& b, const NumberRange& r);

}  // namespace lily::grammar
