// minimum / maximum / exclusive* / multipleOf (grammar/number_range.h), byte by byte against the
// oracle of number_oracle.h: random ranges (negative, zero-crossing, one value, single digits,
// 16-digit edges, exclusive and draft-4 forms, fractional bounds), every integer around and in
// them, decimal texts around the bounds and the doubles' rounding boundaries; refusals naming
// the keyword; the size of the automata.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "byte_vocabulary.h"
#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "grammar/number_range.h"
#include "number_oracle.h"

namespace lily::grammar {
namespace {

using test::byte_vocabulary;
using test::RefBound;
using test::RefRange;
using i128 = __int128;

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.is_accepting();
}

std::shared_ptr<const CompiledGrammar> compile(const json& schema) {
  return std::make_shared<const CompiledGrammar>(json_schema_grammar(schema), byte_vocabulary());
}

std::string text_of(i128 v) {
  if (v == 0) return "0";
  std::string s;
  for (i128 m = v < 0 ? -v : v; m > 0; m /= 10) s.insert(s.begin(), char('0' + int(m % 10)));
  return v < 0 ? "-" + s : s;
}

constexpr i128 kScale = i128(10'000'000'000'000'000);  // 10^16: the numbers' grid

// v / 10^16 as a decimal text: the fraction trimmed, then `zeros` more zeros (or ".0").
std::string decimal_text(i128 v, int zeros) {
  const bool negative = v < 0;
  const i128 m = negative ? -v : v;
  std::string frac = text_of(m % kScale);
  frac = std::string(16 - frac.size(), '0') + frac;
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  if (!frac.empty() || zeros > 0) frac += std::string(size_t(std::min<int>(zeros, 16 - int(frac.size()))), '0');
  if (frac.empty() && zeros > 0) frac = "0";
  return (negative ? "-" : "") + text_of(m / kScale) + (frac.empty() ? "" : "." + frac);
}

// A plain decimal text (at most 16 fraction digits) x 10^16.
i128 scaled(const std::string& text) {
  const bool negative = text[0] == '-';
  const std::string s = negative ? text.substr(1) : text;
  const size_t dot = s.find('.');
  i128 v = 0;
  for (char c : s.substr(0, dot)) v = v * 10 + (c - '0');
  std::string frac = dot == std::string::npos ? "" : s.substr(dot + 1);
  frac.resize(16, '0');
  for (char c : frac) v = v * 10 + (c - '0');
  return negative ? -v : v;
}

json schema_of(const RefRange& r, bool draft4) {
  std::string s = std::string(R"({"type":")") + (r.integer ? "integer" : "number") + "\"";
  auto add = [&](const std::optional<RefBound>& b, const char* inclusive, const char* exclusive) {
    if (!b) return;
    if (b->exclusive && draft4) {
      s += std::string(",\"") + inclusive + "\":" + b->text + ",\"" + exclusive + "\":true";
    } else {
      s += std::string(",\"") + (b->exclusive ? exclusive : inclusive) + "\":" + b->text;
    }
  };
  add(r.lo, "minimum", "exclusiveMinimum");
  add(r.hi, "maximum", "exclusiveMaximum");
  if (r.modulus > 1) s += ",\"multipleOf\":" + std::to_string(r.modulus);
  return json::parse(s + "}");
}

// Compiles the range's schema and checks the grammar against the oracle on every candidate;
// a refused range must have no valid candidate. Returns the number of valid candidates.
int check_range(const RefRange& r, bool draft4, const std::vector<std::string>& candidates) {
  const json schema = schema_of(r, draft4);
  std::shared_ptr<const CompiledGrammar> g;
  try {
    g = compile(schema);
  } catch (const SchemaError& e) {
    for (const std::string& t : candidates)
      EXPECT_FALSE(test::ref_in_range(r, t)) << schema.dump() << ": " << e.what() << ", yet " << t << " is in it";
    return 0;
  }
  int valid = 0;
  for (const std::string& t : candidates) {
    const bool ref = test::ref_in_range(r, t);
    EXPECT_EQ(accepts(g, t), ref) << schema.dump() << " on " << t;
    valid += ref;
  }
  return valid;
}

const char* const kNotNumbers[] = {"-0", "00", "01", "-01", "+1", "", "-", "1e2", "1E+2", ".5", "1.", "0x10", "--1"};

// A random integer bound: small, one digit, near 10^15, 2^53 or the 16-digit edge, or anywhere.
i128 random_integer(std::mt19937_64& rng) {
  const i128 edges[] = {i128(9'999'999'999'999'999), i128(1'000'000'000'000'000), i128(9'007'199'254'740'992)};
  const int sign = rng() % 2 ? 1 : -1;
  switch (rng() % 5) {
    case 0: return i128(int(rng() % 241) - 120);
    case 1: return i128(int(rng() % 19) - 9);
    case 2: return sign * (edges[rng() % 3] - i128(rng() % 40));
    case 3: return sign * i128(rng() % 10'000'000);
    default: return sign * i128(rng() % 9'999'999'999'999'999ull);
  }
}

TEST(NumberRange, RandomIntegerRangesAcceptExactlyTheirIntegers) {
  std::mt19937_64 rng(2026);
  int cases = 0, refused = 0, valid = 0;
  const i128 cap = i128(9'999'999'999'999'999);
  for (int c = 0; c < 260; ++c) {
    i128 a = random_integer(rng), b = rng() % 4 == 0 ? a + i128(rng() % 3) : random_integer(rng);
    if (rng() % 8 != 0 && b < a) std::swap(a, b);  // mostly lo <= hi; some empty ranges
    RefRange r;
    i128 lo = -cap - 1, hi = cap + 1;                        // the integers around the range (beyond: 17 digits)
    int lo_kind = int(rng() % 5), hi_kind = int(rng() % 5);  // 0 none, 1 incl, 2 excl, 3 x.5, 4 draft 4
    // x.5 only where a double holds it (a bound reaches lily as the double nlohmann reads).
    const i128 exact = i128(1) << 50;
    if (lo_kind == 3 && (a >= exact || a <= -exact)) lo_kind = 1;
    if (hi_kind == 3 && (b >= exact || b <= -exact)) hi_kind = 1;
    if (lo_kind > 0) {
      r.lo = RefBound{text_of(a) + (lo_kind == 3 ? ".5" : ""), lo_kind == 2 || lo_kind == 4};
      lo = a;
    }
    if (hi_kind > 0) {
      r.hi = RefBound{text_of(b) + (hi_kind == 3 ? ".5" : ""), hi_kind == 2 || hi_kind == 4};
      hi = b;
    }
    if (rng() % 6 == 0) r.modulus = 1 + long(rng() % 12);
    if (!r.lo && !r.hi && r.modulus == 1) continue;  // json_number's language (NumbersAreBounded)
    std::vector<std::string> candidates(std::begin(kNotNumbers), std::end(kNotNumbers));
    auto add_window = [&](i128 from, i128 to) {
      for (i128 v = from; v <= to; ++v) candidates.push_back(text_of(v));
    };
    if (hi - lo <= 400) {
      add_window(lo - 50, hi + 50);
    } else {
      add_window(lo - 50, lo + 50), add_window(hi - 50, hi + 50), add_window(-20, 20);
      for (int i = 0; i < 60; ++i)
        candidates.push_back(text_of(lo + i128(rng() % uint64_t(std::min<i128>(hi - lo, i128(1) << 62)))));
      for (i128 v : {cap, -cap, cap + 1, -cap - 1, i128(100'000'000'000'000'000)}) candidates.push_back(text_of(v));
      candidates.push_back("1.0");
    }
    const int n = check_range(r, lo_kind == 4 || hi_kind == 4, candidates);
    ++cases;
    refused += n == 0;
    valid += n;
  }
  EXPECT_GT(valid, 10'000);
  EXPECT_GT(refused, 2);  // the empty ranges were refused (and had no integer)
  EXPECT_LT(refused, 60);
  std::printf("%d integer ranges, %d refused as empty, %d valid texts\n", cases, refused, valid);
}

// A random decimal bound of at most 15 significant digits (so the double reads back as it).
std::string random_decimal(std::mt19937_64& rng) {
  const char* fixed[] = {"0",
                         "1",
                         "-1",
                         "0.5",
                         "0.1",
                         "-0.1",
                         "100",
                         "0.0001",
                         "-2.75",
                         "123456789012345",
                         "-99999.5",
                         "0.000000000000001",
                         "9999999999999.99"};
  const int sign = rng() % 2;
  switch (rng() % 4) {
    case 0: return fixed[rng() % std::size(fixed)];
    case 1: return (sign ? "-" : "") + std::to_string(rng() % 200) + "." + std::to_string(rng() % 100);
    case 2: {
      std::string s = std::to_string(rng() % 1'000'000'000'000'000ull);  // up to 15 digits
      const size_t point = size_t(rng() % (s.size() + 1));
      s = point == 0 ? "0." + s : s.substr(0, point) + (point < s.size() ? "." + s.substr(point) : "");
      return (sign ? "-" : "") + s;
    }
    default: return (sign ? "-" : "") + std::to_string(rng() % 10);
  }
}

// Decimal texts around a bound: steps of every power of ten, and around the rounding boundaries
// of the double next to it (a sixteenth of its spacing).
void add_near(std::vector<std::string>& out, const std::string& bound, std::mt19937_64& rng) {
  const i128 b = scaled(bound);
  for (int k = 0; k <= 17; ++k) {
    i128 step = 1;
    for (int i = 0; i < k; ++i) step *= 10;
    for (i128 d : {i128(0), step, -step, 2 * step, -2 * step}) out.push_back(decimal_text(b + d, int(rng() % 3)));
  }
  const double v = std::strtod(bound.c_str(), nullptr);
  const long double ulp = (long double)std::nextafter(v, INFINITY) - v;
  const i128 s = std::max<i128>(1, i128(ulp * (long double)kScale / 16));
  for (int j = -40; j <= 40; ++j)
    for (i128 d : {i128(-1), i128(0), i128(1)}) out.push_back(decimal_text(b + j * s + d, 0));
}

TEST(NumberRange, RandomNumberRangesAcceptExactlyTheirDecimals) {
  std::mt19937_64 rng(40);
  int cases = 0, valid = 0, refused = 0;
  for (int c = 0; c < 160; ++c) {
    std::string a = random_decimal(rng), b = random_decimal(rng);
    if (rng() % 6 != 0 && test::compare_decimals(b, a) < 0) std::swap(a, b);
    if (rng() % 8 == 0) b = a;  // one value (or nothing, exclusive)
    RefRange r;
    r.integer = false;
    const int lo_kind = int(rng() % 4), hi_kind = int(rng() % 4);  // 0 none, 1 incl, 2 excl, 3 draft 4
    if (lo_kind > 0) r.lo = RefBound{a, lo_kind >= 2};
    if (hi_kind > 0) r.hi = RefBound{b, hi_kind >= 2};
    if (!r.lo && !r.hi) continue;
    std::vector<std::string> candidates(std::begin(kNotNumbers), std::end(kNotNumbers));
    for (const char* t :
         {"0", "0.0", "-0.0", "0.000", "-0.0001", "0.0001", "1", "-1", "1.5e1", "9999999999999999.9999999999999999",
          "-9999999999999999.9999999999999999", "10000000000000000", "0.00000000000000001"})
      candidates.push_back(t);
    if (r.lo) add_near(candidates, a, rng);
    if (r.hi) add_near(candidates, b, rng);
    const i128 lo = r.lo ? scaled(a) : -kScale * 1000, hi = r.hi ? scaled(b) : kScale * 1000;
    for (int i = 0; i < 80 && lo < hi; ++i) {
      const i128 x = lo + i128(rng() % uint64_t(std::min<i128>(hi - lo, i128(1) << 62)));
      candidates.push_back(decimal_text(x, int(rng() % 2)));
      candidates.push_back(decimal_text(x - x % (kScale / 100), 0));  // two fraction digits
    }
    const int n = check_range(r, lo_kind == 3 || hi_kind == 3, candidates);
    ++cases;
    refused += n == 0;
    valid += n;
  }
  EXPECT_GT(valid, 8'000);
  EXPECT_LT(refused, 40);
  std::printf("%d number ranges, %d with no valid candidate, %d valid texts\n", cases, refused, valid);
}

struct Case {
  const char* schema;
  const char* text;
  bool valid;
};

TEST(NumberRange, EdgeCases) {
  const Case cases[] = {
      {R"({"type":"number","minimum":0})", "0", true},
      {R"({"type":"number","minimum":0})", "-0", false},  // zero is written 0
      {R"({"type":"number","minimum":0})", "-0.0", false},
      {R"({"type":"number","minimum":0})", "-0.5", false},
      {R"({"type":"number","minimum":0})", "0.000", true},
      {R"({"type":"number","minimum":0})", "1e2", false},  // no exponent under a bound
      {R"({"type":"number","minimum":0})", "9999999999999999.9999999999999999", true},
      {R"({"type":"number","exclusiveMinimum":0})", "0", false},
      {R"({"type":"number","exclusiveMinimum":0})", "0.000", false},
      {R"({"type":"number","exclusiveMinimum":0})", "0.0001", true},
      {R"({"type":"number","exclusiveMinimum":0})", "0.0000000000000001", true},
      {R"({"type":"number","exclusiveMaximum":1})", "0.9999999999999999", true},
      {R"({"type":"number","exclusiveMinimum":1})", "1.0000000000000001", false},  // 1.0 as a double
      {R"({"type":"number","exclusiveMinimum":1})", "1.0000000000000002", true},
      {R"({"type":"number","minimum":0.5,"maximum":1})", "0.5", true},
      {R"({"type":"number","minimum":0.5,"maximum":1})", "0.4999999999999999", false},
      {R"({"type":"number","minimum":0.5,"maximum":1})", "1.0000000000000000", true},
      {R"({"type":"number","minimum":0.5,"maximum":1})", "1.0000000000000001", false},
      {R"({"type":"number","minimum":0.1})", "0.1", true},  // the bound as written, not 0.1000000000000000055
      {R"({"type":"number","minimum":0.1})", "0.0999999999999999", false},
      {R"({"type":"integer","minimum":1.5})", "1", false},
      {R"({"type":"integer","minimum":1.5})", "2", true},
      {R"({"type":"integer","maximum":-1.5})", "-1", false},
      {R"({"type":"integer","maximum":-1.5})", "-2", true},
      {R"({"type":"integer","minimum":5,"exclusiveMinimum":true})", "5", false},  // draft 4
      {R"({"type":"integer","minimum":5,"exclusiveMinimum":true})", "6", true},
      {R"({"type":"integer","minimum":5,"exclusiveMinimum":false})", "5", true},
      {R"({"type":"integer","minimum":3,"exclusiveMinimum":4})", "4", false},  // the tighter one
      {R"({"type":"integer","minimum":3,"exclusiveMinimum":4})", "5", true},
      {R"({"type":"integer","minimum":1e20})", "100000000000000000000", true},  // 21 digits, as needed
      {R"({"type":"integer","minimum":1e20})", "99999999999999999999", false},
      {R"({"type":"integer","minimum":1e20})", "999999999999999999999", true},
      {R"({"type":"integer","minimum":1e20})", "1000000000000000000000", false},
      {R"({"type":"integer","maximum":-1e20})", "-100000000000000000000", true},
      {R"({"type":"integer","maximum":-1e20})", "-99999999999999999999", false},
      {R"({"type":"integer","maximum":1e300})", "9999999999999999", true},  // clamped to 16 digits
      {R"({"type":"integer","maximum":1e300})", "10000000000000000", false},
      {R"({"type":"integer","minimum":-1e300})", "-9999999999999999", true},
      {R"({"type":"number","exclusiveMaximum":1.7976931348623157e308})", "9999999999999999.5", true},
      {R"({"type":"number","exclusiveMinimum":5e-324})", "0.0000000000000001", true},  // the least double
      {R"({"type":"number","exclusiveMinimum":5e-324})", "0", false},
      {R"({"type":"integer","minimum":-0.0})", "0", true},
      {R"({"type":"integer","minimum":-0.0})", "-1", false},
      {R"({"type":"integer","minimum":0,"maximum":0})", "0", true},
      {R"({"type":"integer","minimum":0,"maximum":0})", "-0", false},
      {R"({"type":["integer","null"],"minimum":1})", "null", true},
      {R"({"type":["integer","null"],"minimum":1})", "0", false},
      {R"({"type":["integer","string"],"minimum":1,"maxLength":1})", R"("a")", true},
      {R"({"minimum":1})", "1.5", true},  // a number, inferred
      {R"({"minimum":1})", R"("a")", false},
      {R"({"type":"string","minimum":1})", R"("a")", true},  // minimum applies to numbers only
      {R"({"type":"integer","multipleOf":5})", "15", true},
      {R"({"type":"integer","multipleOf":5})", "16", false},
      {R"({"type":"integer","multipleOf":5})", "-10", true},
      {R"({"type":"integer","multipleOf":5})", "0", true},
      {R"({"type":"integer","multipleOf":5,"minimum":1})", "0", false},
      {R"({"type":"integer","multipleOf":5,"minimum":1})", "5", true},
      {R"({"type":"integer","multipleOf":5.0})", "25", true},
      {R"({"type":"integer","multipleOf":1})", "7", true},
      {R"({"type":"number","multipleOf":3})", "9", true},
      {R"({"type":"number","multipleOf":3})", "9.0", false},  // an integer multipleOf: written as an integer
      {R"({"type":"integer","maximum":18446744073709551615})", "9999999999999999", true},        // a uint64 bound
      {R"({"type":"integer","exclusiveMaximum":9007199254740993})", "9007199254740992", false},  // as doubles, equal
      {R"({"type":"integer","exclusiveMaximum":9007199254740993})", "9007199254740991", true},
  };
  for (const Case& c : cases) {
    const json schema = json::parse(c.schema);
    EXPECT_EQ(accepts(compile(schema), c.text), c.valid) << c.schema << "  on  " << c.text;
  }
}

TEST(NumberRange, MalformedAndEmptyRangesAreRefusedNamingTheKeyword) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type":"integer","minimum":"1"})", "minimum"},
      {R"({"type":"integer","maximum":null})", "maximum"},
      {R"({"type":"integer","minimum":true})", "minimum"},
      {R"({"type":"number","exclusiveMinimum":"0"})", "exclusiveMinimum"},
      {R"({"type":"number","exclusiveMaximum":true})", "exclusiveMaximum"},  // draft 4 without maximum
      {R"({"type":"string","maximum":[1]})", "maximum"},                     // read whatever the type
      {R"({"type":"integer","multipleOf":0})", "multipleOf"},
      {R"({"type":"integer","multipleOf":-2})", "multipleOf"},
      {R"({"type":"integer","multipleOf":0.5})", "multipleOf"},
      {R"({"type":"number","multipleOf":0.01})", "multipleOf"},
      {R"({"type":"integer","multipleOf":1001})", "multipleOf"},
      {R"({"type":"integer","multipleOf":"2"})", "multipleOf"},
      {R"({"type":"integer","minimum":5,"maximum":3})", "minimum"},
      {R"({"type":"number","minimum":0.5,"exclusiveMaximum":0.5})", "minimum"},
      {R"({"type":"integer","exclusiveMinimum":1,"exclusiveMaximum":2})", "exclusiveMinimum"},
      {R"({"type":"integer","minimum":1.2,"maximum":1.8})", "minimum"},
      {R"({"type":"integer","minimum":1e300})", "minimum"},
      {R"({"type":"number","maximum":-1e41})", "maximum"},
      {R"({"type":"number","exclusiveMinimum":1.7976931348623157e308})", "exclusiveMinimum"},
      {R"({"type":"number","exclusiveMaximum":-1.7976931348623157e308})", "exclusiveMaximum"},
      {R"({"type":"integer","minimum":1,"maximum":6,"multipleOf":7})", "multipleOf"},
      {R"({"type":"integer","minimum":-6,"maximum":-1,"multipleOf":7})", "multipleOf"},
      {R"({"type":"integer","enum":[1],"minimum":0})", "minimum"},
  };
  for (const auto& [schema, keyword] : cases) {
    try {
      json_schema_grammar(json::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword(), keyword) << schema << ": " << e.what();
    }
  }
  // Values no JSON text holds, built in code: NaN and infinity.
  for (double bad : {std::nan(""), double(INFINITY), -double(INFINITY)}) {
    for (const char* keyword : {"minimum", "exclusiveMaximum", "multipleOf"}) {
      json schema = {{"type", "integer"}};
      schema[keyword] = bad;
      try {
        json_schema_grammar(schema);
        ADD_FAILURE() << "accepted " << keyword << " " << bad;
      } catch (const SchemaError& e) {
        EXPECT_EQ(e.keyword(), keyword) << e.what();
      }
    }
  }
}

// The automaton is linear in the digits (times the modulus): 40-digit bounds and multipleOf 1000
// stay small.
TEST(NumberRange, AutomataAreSmall) {
  const std::pair<const char*, size_t> cases[] = {
      {R"({"type":"integer","minimum":1})", 200},
      {R"({"type":"integer","minimum":-1234567890123456,"maximum":987654321098765})", 200},
      {R"({"type":"number","minimum":-12.345,"maximum":6789.5})", 300},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", 300},
      {R"({"type":"integer","minimum":1e39,"maximum":3e39})", 400},
      {R"({"type":"integer","multipleOf":1000})", 40'000},
      {R"({"type":"integer","multipleOf":997,"minimum":-5000000,"maximum":99999999})", 60'000},
  };
  for (const auto& [schema, limit] : cases) {
    const Grammar g = json_schema_grammar(json::parse(schema));
    EXPECT_LE(g.total_states(), limit) << schema;
    std::printf("%-80s %zu DFA states\n", schema, g.total_states());
  }
}

}  // namespace
}  // namespace lily::grammar
