// Constrained outputs end (issue 40): a "model" that always takes the grammar's loops where they
// are allowed (a digit, a string character, whitespace, in a preferred order, before anything
// else) still closes the JSON, valid for its schema and within a bounded length. Over single
// bytes and over the test tokenizer's vocabulary (the longest preferred token first), for
// json_schema (integers, numbers, strings with and without maxLength) and json_object. Before
// the bounds such a model wrote `{"n":1111111111...` until max_tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "byte_vocabulary.h"
#include "grammar/fragments.h"
#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "json_reference.h"
#include "number_oracle.h"
#include "tokenizer/tokenizer.h"

namespace lily::grammar {
namespace {

using test::RefParser;
using test::RefValidator;

using test::byte_vocabulary;

std::shared_ptr<const Vocabulary> fixture_vocabulary() {
  static auto v = [] {
    const Tokenizer tok = Tokenizer::load(std::string(LILY_FIXTURES_DIR) + "/tokenizer/tokenizer.json");
    return std::make_shared<const Vocabulary>(Vocabulary::from_tokenizer(tok, tok.vocab_size()));
  }();
  return v;
}

// The loops a model can take, as the bytes a token is made of.
enum class Loop { kDigit, kLetter, kSpace, kNonAscii, kEscape };

bool all_in(std::string_view bytes, Loop loop) {
  auto in = [loop](unsigned char c) {
    switch (loop) {
      case Loop::kDigit: return c >= '0' && c <= '9';
      case Loop::kLetter: return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      case Loop::kSpace: return c == ' ' || c == '\n' || c == '\t';
      case Loop::kNonAscii: return c >= 0x80;
      case Loop::kEscape: return c == '\\' || c == 'u' || c == 'n';
    }
    return false;
  };
  return !bytes.empty() && std::all_of(bytes.begin(), bytes.end(), in);
}

// The model: among the allowed tokens, one made only of the first loop's bytes (the longest,
// the last id of those: "9" rather than "0", which would end an integer),
// else of the next loop's, ...; else a closing token ('}', ']', '"' first), else the stop token,
// else any token but ',' (a comma would be one more member: the count of members and items is
// the one loop the grammar leaves open, and it can always stop); a comma last.
int32_t looping_choice(const Vocabulary& vocab, const std::vector<uint64_t>& mask, const std::vector<Loop>& order) {
  int32_t best = -1;
  size_t best_rank = SIZE_MAX, best_len = 0;
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (!((mask[size_t(id) >> 6] >> (id & 63)) & 1)) continue;
    const std::string_view bytes = vocab.is_text(id) ? vocab.bytes(id) : std::string_view();
    size_t rank = order.size() + 3;
    for (size_t i = 0; i < order.size(); ++i)
      if (all_in(bytes, order[i])) {
        rank = i;
        break;
      }
    if (rank > order.size()) {
      if (!bytes.empty() && std::string_view("}]\"").find(bytes[0]) != std::string_view::npos) {
        rank = order.size();
      } else if (vocab.is_stop(id)) {
        rank = order.size() + 1;
      } else if (bytes.find(',') == std::string_view::npos) {
        rank = order.size() + 2;
      }
    }
    if (rank < best_rank || (rank == best_rank && bytes.size() >= best_len))
      best = id, best_rank = rank, best_len = bytes.size();
  }
  return best;
}

// The text the model writes after `prefix` until the grammar ends (a stop token or must_stop),
// prefix included, or nullopt when it is still going after max_bytes.
std::optional<std::string> run_model(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<Loop>& order,
                                     size_t max_bytes, std::string_view prefix = "") {
  const Vocabulary& vocab = g->vocabulary();
  GrammarMatcher m(g);
  std::vector<uint64_t> mask(vocab.mask_words());
  std::string text(prefix);
  if (!m.accept_bytes(prefix)) {
    ADD_FAILURE() << "the grammar refuses the prefix " << prefix;
    return std::nullopt;
  }
  while (text.size() <= max_bytes) {
    if (m.must_stop()) return text;
    m.fill_next_token_bitmask(mask);
    const int32_t id = looping_choice(vocab, mask, order);
    if (id < 0) {
      ADD_FAILURE() << "no token allowed after " << text.size() << " bytes";
      return std::nullopt;
    }
    if (!m.accept_token(id)) {
      ADD_FAILURE() << "the mask allowed a token the matcher refuses";
      return std::nullopt;
    }
    if (m.is_finished()) return text;
    text += vocab.bytes(id);
  }
  return std::nullopt;
}

// Every order of the three loops the issue names, and two with escapes and non-ASCII bytes.
std::vector<std::vector<Loop>> loop_orders() {
  std::vector<Loop> loops = {Loop::kDigit, Loop::kLetter, Loop::kSpace};
  std::vector<std::vector<Loop>> orders;
  do orders.push_back(loops);
  while (std::next_permutation(loops.begin(), loops.end()));
  orders.push_back({Loop::kEscape, Loop::kDigit, Loop::kSpace});
  orders.push_back({Loop::kNonAscii, Loop::kSpace, Loop::kDigit});
  return orders;
}

// The most bytes a text of the schemas below can have: a string character is at most 12 bytes
// (a surrogate pair's escapes), a gap of whitespace 2 + 20, a number 1 + 16 + 1 + 16 + 2 + 3.
constexpr size_t kMaxCharBytes = 12, kMaxGap = 22, kMaxNumber = 39;
constexpr size_t kMaxFreeString = 2 + size_t(kMaxFreeStringChars) * kMaxCharBytes;

const char* const kSchema = R"({"type": "object", "properties": {
    "n": {"type": "integer"}, "x": {"type": "number"}, "s": {"type": "string"},
    "t": {"type": "string", "maxLength": 8}, "m": {"type": "string", "minLength": 2},
    "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    "u": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, "required": ["n", "x", "s", "t", "m", "a", "u"]})";
// {} n x s t m a[3] u: 7 keys, 30 gaps around them, 3 numbers and 2 in u, 3 integers in a.
constexpr size_t kSchemaBound = 7 * 3 + 36 * kMaxGap + 6 * kMaxNumber + 3 * kMaxFreeString + 2 + 8 * kMaxCharBytes + 8;

void check_schema_replies(const std::shared_ptr<const Vocabulary>& vocab) {
  const json schema = json::parse(kSchema);
  auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(schema), vocab);
  for (const auto& order : loop_orders()) {
    SCOPED_TRACE(testing::Message() << "loop order starting " << int(order[0]));
    const auto text = run_model(g, order, 4 * kSchemaBound);
    ASSERT_TRUE(text) << "the reply did not end";
    EXPECT_LE(text->size(), kSchemaBound);
    const auto doc = RefParser(*text).document();
    ASSERT_TRUE(doc) << *text;
    EXPECT_TRUE(RefValidator(schema).valid(schema, *doc)) << *text;
    // The raw texts of the members (a number such as 9999999999999999e999 is valid JSON that
    // no double holds: not parsed here).
    auto raw = [&](const char* key) {
      for (const auto& [k, v] : doc->members)
        if (k == json(key).dump()) return v.raw;
      ADD_FAILURE() << "no member " << key << " in " << *text;
      return std::string();
    };
    if (order[0] == Loop::kDigit) {
      EXPECT_EQ(raw("n").size(), size_t(kMaxIntegerDigits));  // the loop ran to its bound
    }
    if (order[0] == Loop::kLetter) {
      EXPECT_EQ(raw("s").size(), size_t(kMaxFreeStringChars) + 2);
      EXPECT_EQ(raw("t").size(), 8u + 2);
      EXPECT_EQ(raw("m").size(), size_t(kMaxFreeStringChars) + 4);
    }
  }
}

TEST(Termination, regression_a_looping_model_closes_the_schema_over_bytes_40) {
  check_schema_replies(byte_vocabulary());
}

TEST(Termination, regression_a_looping_model_closes_the_schema_over_a_tokenizer_40) {
  check_schema_replies(fixture_vocabulary());
}

// Ranges (number_range.h): a model that loops on digits stops where the bound does, and every
// value lies in its range.
TEST(Termination, a_looping_model_closes_bounded_numbers) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "n": {"type": "integer", "minimum": 1, "maximum": 100}, "x": {"type": "number", "minimum": 0, "maximum": 1},
      "p": {"type": "number", "exclusiveMinimum": 0}, "big": {"type": "integer", "minimum": 1e20},
      "neg": {"type": "integer", "minimum": -50, "exclusiveMaximum": -3}, "m": {"type": "integer", "multipleOf": 7}},
      "required": ["n", "x", "p", "big", "neg", "m"]})");
  using test::RefBound;
  using test::RefRange;
  const std::pair<const char*, RefRange> ranges[] = {
      {"n", {true, RefBound{"1"}, RefBound{"100"}}},
      {"x", {false, RefBound{"0"}, RefBound{"1"}}},
      {"p", {false, RefBound{"0", true}, std::nullopt}},
      {"big", {true, RefBound{"100000000000000000000"}, std::nullopt, 21}},
      {"neg", {true, RefBound{"-50"}, RefBound{"-3", true}}},
      {"m", {true, std::nullopt, std::nullopt, 16, 7}},
  };
  for (const auto& vocab : {byte_vocabulary(), fixture_vocabulary()}) {
    auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(schema), vocab);
    for (const auto& order : loop_orders()) {
      SCOPED_TRACE(testing::Message() << "loop order starting " << int(order[0]));
      const auto text = run_model(g, order, 4 * kSchemaBound);
      ASSERT_TRUE(text) << "the reply did not end";
      EXPECT_LE(text->size(), kSchemaBound);
      const auto doc = RefParser(*text, 20, 21).document();  // "big" has 21 digits
      ASSERT_TRUE(doc && doc->members.size() == 6) << *text;
      for (size_t i = 0; i < 6; ++i) {
        EXPECT_EQ(doc->members[i].first, json(ranges[i].first).dump());
        EXPECT_TRUE(test::ref_in_range(ranges[i].second, doc->members[i].second.raw))
            << ranges[i].first << " in " << *text;
      }
      if (order[0] == Loop::kDigit) {
        EXPECT_EQ(doc->members[0].second.raw, "99") << *text;  // 999 is above 100
        EXPECT_EQ(doc->members[3].second.raw.size(), 21u) << *text;
      }
    }
  }
}

TEST(Termination, regression_a_looping_model_closes_a_json_object_40) {
  // {"key": value}: the model closes after one member (it prefers '}' to ','); the value is a
  // number or a string (one whose loops ran out), each bounded.
  constexpr size_t kBound = 2 + 4 * kMaxGap + kMaxFreeString + 1 + kMaxFreeString;
  for (const auto& vocab : {byte_vocabulary(), fixture_vocabulary()}) {
    auto g = std::make_shared<const CompiledGrammar>(json_object_grammar(), vocab);
    for (const auto& order : loop_orders()) {
      SCOPED_TRACE(testing::Message() << "loop order starting " << int(order[0]));
      const auto text = run_model(g, order, 4 * kBound);
      ASSERT_TRUE(text) << "the reply did not end";
      EXPECT_LE(text->size(), kBound);
      const auto doc = RefParser(*text).document();
      ASSERT_TRUE(doc) << *text;
      EXPECT_EQ(doc->kind, test::JValue::kObject) << *text;
    }
  }
}

TEST(Termination, regression_a_looping_model_closes_additional_properties_40) {
  // Keys of additional properties are free too (kMaxFreeKeyChars): the model starts one.
  const json schema = json::parse(R"({"type": "object", "properties": {"id": {"type": "integer"}},
      "required": ["id"], "additionalProperties": {"type": "number"}})");
  for (const auto& vocab : {byte_vocabulary(), fixture_vocabulary()}) {
    auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(schema), vocab);
    const auto text = run_model(g, {Loop::kLetter, Loop::kDigit, Loop::kSpace}, 100'000, R"({"id":1,")");
    ASSERT_TRUE(text) << "the reply did not end";
    const auto doc = RefParser(*text).document();
    ASSERT_TRUE(doc && RefValidator(schema).valid(schema, *doc)) << *text;
    ASSERT_EQ(doc->members.size(), 2u) << *text;
    EXPECT_EQ(doc->members[1].first.size(), size_t(kMaxFreeKeyChars) + 2) << *text;
  }
}

}  // namespace
}  // namespace lily::grammar
