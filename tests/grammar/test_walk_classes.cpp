// walk_classes against a brute-force reference: two states share a class exactly when every byte
// string of at most `depth` bytes leads both to states present together with the same accepting
// flag (calls: only the state itself); and through the matcher, every position of a long string
// fills the mask that accept_token agrees with, though most positions share one cache entry.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <tuple>

#include "grammar/fragments.h"
#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "grammar/walk_classes.h"
#include "json_reference.h"

namespace lily::grammar {
namespace {

// Depth-d equivalence by its definition, memoized.
class Reference {
 public:
  Reference(const Grammar& g, const Rule& r) : g_(g), r_(r) {}
  bool equal(int32_t a, int32_t b, int d) {
    if (a == b) return true;
    if ((r_.flags[size_t(a)] & Rule::kAccept) != (r_.flags[size_t(b)] & Rule::kAccept)) return false;
    if (calls(a) || calls(b)) return false;
    if (d == 0) return true;
    const auto key = std::make_tuple(std::min(a, b), std::max(a, b), d);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    bool same = true;
    const size_t nc = size_t(g_.num_classes);
    for (size_t c = 0; same && c < nc; ++c) {
      const int32_t ta = r_.next[size_t(a) * nc + c], tb = r_.next[size_t(b) * nc + c];
      same = (ta < 0) == (tb < 0) && (ta < 0 || equal(ta, tb, d - 1));
    }
    memo_[key] = same;
    return same;
  }

 private:
  bool calls(int32_t s) const { return r_.call_begin[size_t(s) + 1] > r_.call_begin[size_t(s)]; }
  const Grammar& g_;
  const Rule& r_;
  std::map<std::tuple<int32_t, int32_t, int>, bool> memo_;
};

void check_classes(const Grammar& g, int depth, const std::string& what) {
  for (const Rule& r : g.rules) {
    if (r.num_states > 700) continue;  // the reference is quadratic
    const std::vector<int32_t> rep = walk_classes(g, r, depth);
    ASSERT_EQ(rep.size(), size_t(r.num_states));
    Reference ref(g, r);
    std::vector<int32_t> reps;
    for (int32_t s = 0; s < r.num_states; ++s) {
      ASSERT_LE(rep[size_t(s)], s);
      ASSERT_EQ(rep[size_t(rep[size_t(s)])], rep[size_t(s)]);
      if (rep[size_t(s)] == s) reps.push_back(s);
      ASSERT_TRUE(ref.equal(s, rep[size_t(s)], depth))
          << what << " rule " << r.name << ": " << s << " shares " << rep[size_t(s)] << " at depth " << depth;
    }
    for (size_t i = 0; i < reps.size(); ++i)
      for (size_t j = i + 1; j < reps.size(); ++j)
        ASSERT_FALSE(ref.equal(reps[i], reps[j], depth))
            << what << " rule " << r.name << ": " << reps[i] << " and " << reps[j] << " could share at depth " << depth;
  }
}

TEST(WalkClasses, AgreeWithTheDefinition) {
  const std::pair<const char*, json> schemas[] = {
      {"maxLength 12", json::parse(R"({"type":"string","maxLength":12})")},
      {"number", json::parse(R"({"type":"number"})")},
      {"array", json::parse(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":5})")},
      {"object", json::parse(R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"enum":["x","yy"]}},
          "additionalProperties":{"type":"null"}})")},
  };
  for (int depth : {1, 2, 3, 7, 40}) {
    for (const auto& [what, schema] : schemas) check_classes(json_schema_grammar(schema), depth, what);
    check_classes(json_object_grammar(), depth, "json_object");
  }
  test::RefGenerator gen(40);
  for (int i = 0; i < 20; ++i) {
    const json schema = gen.schema(2);
    check_classes(json_schema_grammar(schema), 4, schema.dump());
  }
}

TEST(WalkClasses, AChainSharesAllButItsLastDepthPositions) {
  const Grammar g = json_schema_grammar(json::parse(R"({"type":"string","maxLength":300})"));
  const std::vector<int32_t> rep = walk_classes(g, g.rules[0], 8);
  std::vector<int32_t> classes(rep);
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  // ~27 states a character: far fewer classes than states, more than one character's worth.
  EXPECT_LT(classes.size(), size_t(g.rules[0].num_states) / 10) << g.rules[0].num_states << " states";
  EXPECT_GT(classes.size(), 27u);
}

// A vocabulary of every byte, runs of letters up to 9 bytes, and a stop token (the last id).
std::shared_ptr<const Vocabulary> runs_vocabulary() {
  static auto v = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, char(b));
    for (int n = 2; n <= 9; ++n)
      tokens.push_back(std::string(size_t(n), 'a')), tokens.push_back(std::string(size_t(n), 'b') + "\"");
    tokens.emplace_back("<|im_end|>");
    const int32_t stop = int32_t(tokens.size()) - 1;
    return std::make_shared<const Vocabulary>(std::move(tokens), std::span<const int32_t>{},
                                              std::span<const int32_t>(&stop, 1));
  }();
  return v;
}

// At every position of a string of maxLength 40 (and of a free one near its bound), the mask is
// what accept_token takes, token by token, though the positions share entries.
TEST(WalkClasses, SharedEntriesGiveEveryPositionItsOwnMask) {
  auto vocab = runs_vocabulary();
  for (const char* text :
       {R"({"type":"string","maxLength":40})", R"({"type":"object","properties":{"s":{"type":"string"}}})"}) {
    const json schema = json::parse(text);
    auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(schema), vocab);
    GrammarMatcher m(g);
    const bool object = schema["type"] == "object";
    ASSERT_TRUE(m.accept_bytes(object ? "{\"s\":\"" : "\""));
    const int length = object ? kMaxFreeStringChars : 40;
    std::vector<uint64_t> mask(vocab->mask_words());
    for (int i = 0; i <= length; ++i) {
      if (object && i > 12 && i < length - 12 && i % 50 != 0) {  // the middle, where positions are alike
        ASSERT_TRUE(m.accept_bytes("a"));
        continue;
      }
      m.fill_next_token_bitmask(mask);
      for (int32_t id = 0; id < vocab->size(); ++id) {
        GrammarMatcher copy = m;
        ASSERT_EQ(bool((mask[size_t(id) >> 6] >> (id & 63)) & 1), copy.accept_token(id))
            << text << ": token '" << vocab->bytes(id) << "' at position " << i;
      }
      if (i < length) {
        ASSERT_TRUE(m.accept_bytes("a"));
      }
    }
    EXPECT_FALSE(m.accept_bytes("a")) << "the string's bound";
  }
}

}  // namespace
}  // namespace lily::grammar
