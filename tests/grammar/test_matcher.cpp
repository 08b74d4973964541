// The matcher over tokens: at every step of random walks the mask equals what accept_token takes
// (each token tried on a copy), and every finished walk's text parses and validates (JSON against
// json_reference.h; tool calls through lily's own tool-call parser, then their arguments).
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "chat/tool_call_xml.h"
#include "grammar/fragments.h"
#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "json_reference.h"
#include "tokenizer/tokenizer.h"

namespace lily::grammar {
namespace {

using test::RefGenerator;
using test::RefParser;
using test::RefValidator;

constexpr int32_t kImEnd = 0, kEndOfText = 1, kControl = 2;

// A byte-level vocabulary like real ones: every byte, JSON punctuation runs, words with a leading
// space, digits, indentation, and the Qwen markup as single tokens; 0 and 1 stop, 2 a control token.
std::shared_ptr<const Vocabulary> synthetic_vocabulary() {
  static auto v = [] {
    std::vector<std::string> t = {"<|im_end|>", "<|endoftext|>", "<|im_start|>"};
    for (int b = 0; b < 256; ++b) t.emplace_back(1, char(b));
    for (const char* s :
         {"{\"",         "\"}",          "\",",         "\":",      "\": \"",      "\"]",          "[\"",
          "},",          "}}",           "]}",          "], \"",    "{\n",         "\n}",          "  ",
          "    ",        "\n  ",         ",\n",         "true",     "false",       "null",         "12",
          "3.5",         "e-",           " the",        "name",     "id",          "tags",         " a",
          "é",           "世界",         "\xe4\xb8",    "\\u",      "\\n",         "\\\"",         "ab\"",
          "x\",\"",      "\"}}",         "1,",          "0]",       "<tool_call>", "</tool_call>", "<function=",
          "<parameter=", "</parameter>", "</function>", "</think>", "\n\n",        ">\n",          "\n</",
          "get_weather", "city",         "days",        "Oslo",     "search",      "query",        "<",
          "</",          "think",        ">",           "<tool",    "_call>"})
      t.emplace_back(s);
    const int32_t special[] = {kControl};
    const int32_t stop[] = {kImEnd, kEndOfText};
    return std::make_shared<const Vocabulary>(std::move(t), special, stop);
  }();
  return v;
}

std::shared_ptr<const Vocabulary> fixture_vocabulary() {
  static auto v = [] {
    const Tokenizer tok = Tokenizer::load(std::string(LILY_FIXTURES_DIR) + "/tokenizer/tokenizer.json");
    return std::make_shared<const Vocabulary>(Vocabulary::from_tokenizer(tok, tok.vocab_size() + 37));
  }();
  return v;
}

bool bit(const std::vector<uint64_t>& mask, int32_t id) { return (mask[size_t(id) >> 6] >> (id & 63)) & 1; }

// A random walk; checks the mask against accept_token at every step. Returns the text, and
// whether a stop token ended it.
std::pair<std::string, bool> walk(const std::shared_ptr<const CompiledGrammar>& g, RefGenerator& gen, int max_steps) {
  const Vocabulary& vocab = g->vocabulary();
  GrammarMatcher m(g);
  std::vector<uint64_t> mask(vocab.mask_words());
  std::string text;
  for (int step = 0; step < max_steps; ++step) {
    m.fill_next_token_bitmask(mask);
    std::vector<int32_t> allowed, closing;
    for (int32_t id = 0; id < vocab.size(); ++id) {
      GrammarMatcher copy = m;
      const bool takes = copy.accept_token(id);
      EXPECT_EQ(bit(mask, id), takes) << "token " << id << " '" << vocab.bytes(id) << "' after '" << text << "'";
      if (bit(mask, id) != takes) return {text, false};
      if (!takes) continue;
      allowed.push_back(id);
      if (vocab.is_stop(id) || vocab.bytes(id).find_first_of("\"}]>") != std::string_view::npos) closing.push_back(id);
    }
    EXPECT_EQ(m.is_accepting(), bit(mask, vocab.stop_ids()[0]));
    if (allowed.empty()) {
      ADD_FAILURE() << "no token allowed after '" << text << "'";
      return {text, false};
    }
    const auto& pool = step > 30 && !closing.empty() && gen.chance(0.8) ? closing : allowed;
    int32_t id = pool[size_t(gen.uniform(0, int(pool.size()) - 1))];
    if (m.is_accepting() && step > 10 && gen.chance(0.5)) id = vocab.stop_ids()[0];
    EXPECT_TRUE(m.accept_token(id));
    if (m.is_finished()) {
      m.fill_next_token_bitmask(mask);
      for (uint64_t w : mask) EXPECT_EQ(w, 0u) << "tokens allowed after the stop";
      return {text, true};
    }
    text += vocab.bytes(id);
  }
  return {text, false};
}

void check_json_walks(const std::shared_ptr<const Vocabulary>& vocab, uint64_t seed, int schemas, int walks) {
  RefGenerator gen(seed);
  int finished = 0;
  for (int s = 0; s < schemas; ++s) {
    const json schema = gen.schema(3);
    auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(schema), vocab);
    for (int w = 0; w < walks; ++w) {
      auto [text, done] = walk(g, gen, 120);
      if (::testing::Test::HasFailure()) return;
      if (!done) continue;
      ++finished;
      auto v = RefParser(text).document();
      ASSERT_TRUE(v && RefValidator(schema).valid(schema, *v)) << schema.dump() << "\n" << text;
    }
  }
  EXPECT_GT(finished, schemas * walks / 2);
}

TEST(GrammarMatcher, RandomSchemaWalksOverASyntheticVocabulary) { check_json_walks(synthetic_vocabulary(), 1, 30, 3); }

TEST(GrammarMatcher, RandomSchemaWalksOverTheTestTokenizer) { check_json_walks(fixture_vocabulary(), 2, 12, 2); }

TEST(GrammarMatcher, RecursiveGrammarsUseTheCallersState) {
  // json_object and a recursive $ref: tokens such as "}}" and "]}" end a nested value inside
  // the token, so the cache's suffix tries (the caller's part) decide them.
  RefGenerator gen(3);
  const json tree = json::parse(R"({"$defs":{"n":{"type":"object","properties":{"id":{"type":"integer"},
      "tags":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["id"]}},"$ref":"#/$defs/n"})");
  for (const json* schema : {static_cast<const json*>(nullptr), &tree}) {
    auto g = std::make_shared<const CompiledGrammar>(schema ? json_schema_grammar(*schema) : json_object_grammar(),
                                                     synthetic_vocabulary());
    EXPECT_GT(g->grammar().rules.size(), 1u);
    int finished = 0;
    for (int w = 0; w < 12; ++w) {
      auto [text, done] = walk(g, gen, 150);
      if (HasFailure()) return;
      if (!done) continue;
      ++finished;
      auto v = RefParser(text).document();
      ASSERT_TRUE(v) << text;
      if (schema) {
        EXPECT_TRUE(RefValidator(*schema).valid(*schema, *v)) << text;
      } else {
        EXPECT_EQ(v->kind, test::JValue::kObject) << text;
      }
    }
    EXPECT_GT(finished, 4);
  }
}

TEST(GrammarMatcher, ThinkingIsFreeUntilItsEnd) {
  GrammarOptions options;
  options.thinking = true;
  const json schema = json::parse(R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]})");
  auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(schema, options), synthetic_vocabulary());
  GrammarMatcher m(g);
  std::vector<uint64_t> mask(g->vocabulary().mask_words());
  m.fill_next_token_bitmask(mask);
  int allowed = 0;
  for (int32_t id = 0; id < g->vocabulary().size(); ++id) allowed += bit(mask, id);
  EXPECT_EQ(allowed, g->vocabulary().size() - 3);  // every text token; no stop, no control token
  EXPECT_TRUE(m.accept_bytes("Let me think: {not json} <tool_call> </thin"));
  EXPECT_FALSE(m.is_accepting());
  EXPECT_TRUE(m.accept_bytes("k>\n\n{\"id\":"));
  EXPECT_FALSE(m.accept_bytes("\"x\""));  // the schema applies now
  EXPECT_TRUE(m.accept_bytes("42}"));
  EXPECT_TRUE(m.is_accepting());
  RefGenerator gen(4);
  int finished = 0;
  for (int w = 0; w < 6; ++w) {
    auto [text, done] = walk(g, gen, 200);
    if (HasFailure()) return;
    if (!done) continue;
    ++finished;
    const size_t end = text.find("</think>");
    ASSERT_NE(end, std::string::npos) << text;
    auto v = RefParser(text.substr(end + 8)).document();
    ASSERT_TRUE(v && RefValidator(schema).valid(schema, *v)) << text;
  }
  EXPECT_GT(finished, 0);
}

const json kTools = json::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "city":{"type":"string"},"days":{"type":"integer"},"unit":{"enum":["c","f"]}},"required":["city"]}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
     "query":{"type":"string","maxLength":6},"filters":{"type":"object","properties":{"lang":{"type":"string"}}},
     "exact":{"type":"boolean"},"score":{"type":["number","null"]}},"required":["query","exact"]}}},
  {"type":"function","function":{"name":"ping"}}])");

// Every call in the text goes through lily's parser; its arguments validate against the tool.
int check_tool_calls(const std::string& text, const std::optional<std::string>& only) {
  const ToolSchemas schemas(kTools);
  int calls = 0;
  size_t pos = 0;
  while ((pos = text.find("<tool_call>", pos)) != std::string::npos) {
    const size_t end = text.find("</tool_call>", pos);
    EXPECT_NE(end, std::string::npos) << text;
    if (end == std::string::npos) return calls;
    auto call = parse_tool_call_xml(text.substr(pos + 11, end - pos - 11), schemas, true);
    EXPECT_TRUE(call.has_value()) << text;
    if (!call) return calls;
    if (only) {
      EXPECT_EQ(call->name, *only);
    }
    const json* params = nullptr;
    for (const json& t : kTools)
      if (t["function"]["name"] == call->name)
        params = t["function"].contains("parameters") ? &t["function"]["parameters"] : nullptr;
    const json schema = params ? *params : json::parse(R"({"type":"object"})");
    auto args = RefParser(call->arguments_json, 1000).document();
    EXPECT_TRUE(args && RefValidator(schema).valid(schema, *args)) << call->name << " " << call->arguments_json;
    ++calls;
    pos = end;
  }
  return calls;
}

TEST(GrammarMatcher, ToolCallsNameAGivenToolWithValidArguments) {
  RefGenerator gen(5);
  for (const std::optional<std::string>& only : {std::optional<std::string>(), std::optional<std::string>("search")}) {
    ToolChoice choice;
    choice.function = only;
    choice.parallel = !only;
    auto g = std::make_shared<const CompiledGrammar>(tool_call_grammar(kTools, choice), synthetic_vocabulary());
    int finished = 0;
    for (int w = 0; w < 10; ++w) {
      auto [text, done] = walk(g, gen, 160);
      if (HasFailure()) return;
      if (!done) continue;
      ++finished;
      const int calls = check_tool_calls(text, only);
      EXPECT_GE(calls, 1) << text;
      if (only) {
        EXPECT_EQ(calls, 1) << text;
      }
    }
    EXPECT_GT(finished, 3);
  }
  // By bytes: a call written the way the model writes it, and what the grammar refuses.
  auto g = std::make_shared<const CompiledGrammar>(tool_call_grammar(kTools, {}), synthetic_vocabulary());
  auto accepts = [&](std::string_view text) {
    GrammarMatcher m(g);
    return m.accept_bytes(text) && m.is_accepting();
  };
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(accepts(call));
  EXPECT_TRUE(accepts("\n\n" + call + "\n" + call));
  EXPECT_FALSE(accepts("<tool_call>\n<function=_currency>\n</function>\n</tool_call>"));    // not a tool
  EXPECT_FALSE(accepts("<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"));  // city is required
  EXPECT_FALSE(accepts("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n"
                       "three\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts("Sure! " + call));  // the call comes first
  EXPECT_TRUE(accepts("<tool_call>\n<function=ping>\n</function>\n</tool_call>"));
  EXPECT_THROW(tool_call_grammar(kTools, {std::string("_currency"), true}), SchemaError);
}

// A tool-call value is raw text the parser reads back by the schema's types: a range holds on an
// integer or number value; where the text may also be a string (["string", "integer"], or no
// type) "0" would be read as the integer 0 under minimum 1, so such a range is refused.
TEST(GrammarMatcher, ToolCallValuesKeepTheirRangesOrAreRefused) {
  auto tools = [](const char* parameter) {
    return json::parse(std::string(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
        "properties":{"n":)") +
                       parameter + R"(},"required":["n"]}}}])");
  };
  auto g = std::make_shared<const CompiledGrammar>(tool_call_grammar(tools(R"({"type":"integer","minimum":1})"), {}),
                                                   synthetic_vocabulary());
  auto accepts = [&](const std::string& value) {
    GrammarMatcher m(g);
    const std::string call = "<tool_call>\n<function=f>\n<parameter=n>\n" + value +
                             "\n</parameter>\n</function>\n</tool_call>";
    return m.accept_bytes(call) && m.is_accepting();
  };
  EXPECT_TRUE(accepts("1"));
  EXPECT_TRUE(accepts("250"));
  EXPECT_FALSE(accepts("0"));
  EXPECT_FALSE(accepts("-3"));
  EXPECT_NO_THROW(tool_call_grammar(tools(R"({"type":["string","null"],"minimum":1})"), {}));  // no number read
  for (const char* parameter :
       {R"({"type":["string","integer"],"minimum":1})", R"({"type":["number","string"],"exclusiveMaximum":1})",
        R"({"minLength":1,"maximum":3})"}) {
    try {
      tool_call_grammar(tools(parameter), {});
      ADD_FAILURE() << "accepted " << parameter;
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find("may also be a string"), std::string::npos) << e.what();
    }
  }
}

// tool_choice auto with a response_format: either calls or the JSON answer, never both, never text.
TEST(GrammarMatcher, ToolCallsOrTheJsonAnswer) {
  const json schema = json::parse(R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]})");
  const std::string call = "<tool_call>\n<function=ping>\n</function>\n</tool_call>";
  for (const json* s : {&schema, static_cast<const json*>(nullptr)}) {
    auto g = std::make_shared<const CompiledGrammar>(tool_calls_or_json_grammar(kTools, true, s),
                                                     synthetic_vocabulary());
    auto accepts = [&](std::string_view text) {
      GrammarMatcher m(g);
      return m.accept_bytes(text) && m.is_accepting();
    };
    EXPECT_TRUE(accepts(call));
    EXPECT_TRUE(accepts("\n" + call + "\n" + call));
    EXPECT_TRUE(accepts("\n\n{\"id\": 3}"));
    EXPECT_EQ(accepts("{\"x\": true}"), s == nullptr);  // any object without a schema
    EXPECT_FALSE(accepts("{\"id\": 3}" + call));
    EXPECT_FALSE(accepts(call + "{\"id\": 3}"));
    EXPECT_FALSE(accepts("Sure: {\"id\": 3}"));
    RefGenerator gen(9);
    int calls = 0, answers = 0;
    for (int w = 0; w < 16; ++w) {
      auto [text, done] = walk(g, gen, 120);
      if (HasFailure()) return;
      if (!done) continue;
      if (text[text.find_first_not_of(" \t\r\n")] == '<') {  // a JSON answer may hold "<tool_call>" in a string
        ++calls;
        check_tool_calls(text, std::nullopt);
        continue;
      }
      ++answers;
      auto v = RefParser(text).document();
      ASSERT_TRUE(v) << text;
      if (s) {
        EXPECT_TRUE(RefValidator(*s).valid(*s, *v)) << text;
      } else {
        EXPECT_EQ(v->kind, test::JValue::kObject) << text;
      }
    }
    EXPECT_GT(calls + answers, 4);
  }
  GrammarMatcher single(std::make_shared<const CompiledGrammar>(tool_calls_or_json_grammar(kTools, false, &schema),
                                                                synthetic_vocabulary()));
  EXPECT_TRUE(single.accept_bytes(call + "\n"));
  EXPECT_FALSE(single.accept_bytes("<"));  // one call only
}

TEST(GrammarMatcher, ToolChoiceNoneNeverStartsToolMarkup) {
  auto g = std::make_shared<const CompiledGrammar>(no_tool_call_grammar(), synthetic_vocabulary());
  RefGenerator gen(6);
  for (int w = 0; w < 12; ++w) {
    auto [text, done] = walk(g, gen, 80);
    if (HasFailure()) return;
    EXPECT_EQ(text.find("<tool_call>"), std::string::npos) << text;
  }
  GrammarMatcher m(g);
  EXPECT_TRUE(m.is_accepting());
  EXPECT_TRUE(m.accept_bytes("a <tool_cal"));
  EXPECT_FALSE(m.accept_bytes("l>"));
  EXPECT_TRUE(m.accept_bytes("l"));
}

// The pattern automaton held a reference into its rows while adding one (a use after free that
// ASan showed on the first pattern long enough to move them).
TEST(GrammarMatcher, regression_pattern_automaton_growth_18) {
  std::vector<std::string> patterns;
  for (int i = 0; i < 40; ++i) patterns.push_back("<pattern number " + std::to_string(i) + ">");
  GrammarBuilder b;
  b.set_body(0, text_avoiding(b, patterns));
  auto g = std::make_shared<const CompiledGrammar>(b.build(), synthetic_vocabulary());
  for (int i = 0; i < 40; i += 7) {
    GrammarMatcher m(g);
    EXPECT_TRUE(m.accept_bytes("text <pattern number " + std::to_string(i)));
    EXPECT_FALSE(m.accept_bytes(">"));
    EXPECT_TRUE(m.accept_bytes(" >"));
    EXPECT_TRUE(m.is_accepting());
  }
}

TEST(GrammarMatcher, ApplyBitmaskLeavesOnlyTheAllowedLogits) {
  std::vector<float> logits(130, 1.0f);
  std::vector<uint64_t> mask(2, 0);
  mask[0] = 1 | (uint64_t(1) << 63);
  mask[1] = 2;
  apply_token_bitmask(logits, mask);  // ids 128, 129: past the mask
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_EQ(logits[i] == 1.0f, i == 0 || i == 63 || i == 65) << i;
}

// Issue 18: each state of a maxLength chain kept its own dense mask (31 KB at 248K ids), so
// writing out a long bounded string cost memory per character, kept with the grammar in the
// server's cache. Equal masks are shared now: 300 characters visit ~300 states but store only
// the few distinct masks of the chain (the full one, and the ones near its end).
TEST(GrammarMatcher, regression_bounded_string_states_share_their_mask_18) {
  auto vocab = fixture_vocabulary();
  auto g = std::make_shared<const CompiledGrammar>(
      json_schema_grammar(json::parse(R"({"type":"string","maxLength":400})")), vocab);
  GrammarMatcher m(g);
  std::vector<uint64_t> mask(vocab->mask_words());
  m.fill_next_token_bitmask(mask);
  ASSERT_TRUE(m.accept_bytes("\""));
  for (int i = 0; i < 300; ++i) {
    m.fill_next_token_bitmask(mask);
    ASSERT_TRUE(m.accept_bytes("x"));
  }
  m.fill_next_token_bitmask(mask);
  ASSERT_TRUE(m.accept_bytes("\""));
  EXPECT_TRUE(m.is_accepting());
  // 300 positions of the chain, but most share one entry (walk_classes.h, issue 40): the
  // fixture's longest token is shorter than the 100 characters left.
  EXPECT_LT(g->cached_states(), 60u);
  const size_t one_mask = vocab->mask_words() * 8;
  EXPECT_LT(g->cache_bytes(), 10 * one_mask) << g->cached_states() << " states";
}

// Against a bit-by-bit reference: words all set, all clear and mixed, rows that end inside a word,
// masks shorter than the row.
TEST(GrammarMatcher, ApplyBitmaskAgreesWithABitByBitReference) {
  std::mt19937_64 rng(18);
  for (size_t n : {1, 63, 64, 65, 200, 1000}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint64_t> mask((n + 63) / 64 - (trial % 5 == 4 && n > 64 ? 1 : 0));
      for (uint64_t& w : mask) {
        const uint64_t kind = rng() % 3;
        w = kind == 0 ? 0 : kind == 1 ? ~uint64_t(0) : rng();
      }
      std::vector<float> logits(n);
      for (size_t i = 0; i < n; ++i) logits[i] = float(i);
      apply_token_bitmask(logits, mask);
      for (size_t i = 0; i < n; ++i) {
        const bool allowed = i / 64 < mask.size() && ((mask[i / 64] >> (i % 64)) & 1);
        ASSERT_EQ(logits[i], allowed ? float(i) : -INFINITY) << "n " << n << " id " << i;
      }
    }
  }
}

TEST(GrammarMatcher, RejectedTokensLeaveTheStateAlone) {
  auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(json::parse(R"({"type":"array"})")),
                                                   synthetic_vocabulary());
  GrammarMatcher m(g);
  EXPECT_FALSE(m.accept_token(kImEnd));  // not accepting yet
  EXPECT_FALSE(m.accept_token(kControl));
  EXPECT_FALSE(m.accept_token(-1));
  EXPECT_FALSE(m.accept_bytes("[1,,"));
  EXPECT_TRUE(m.accept_bytes("[1,2]"));
  EXPECT_TRUE(m.accept_token(kEndOfText));
  EXPECT_TRUE(m.is_finished());
  EXPECT_FALSE(m.accept_bytes(" "));
}

}  // namespace
}  // namespace lily::grammar
