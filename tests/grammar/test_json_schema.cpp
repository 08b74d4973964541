// JSON schemas as grammars, byte by byte: edge cases, refusals, and random schemas x random
// documents against the reference validator of json_reference.h (same verdict on every one).
#include <gtest/gtest.h>

#include <memory>

#include "byte_vocabulary.h"
#include "grammar/fragments.h"
#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "json_reference.h"

namespace lily::grammar {
namespace {

using test::RefGenerator;
using test::RefParser;
using test::RefValidator;

using test::byte_vocabulary;

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.is_accepting();
}

std::shared_ptr<const CompiledGrammar> compile(const json& schema) {
  return std::make_shared<const CompiledGrammar>(json_schema_grammar(schema), byte_vocabulary());
}

bool reference(const json& schema, std::string_view text) {
  auto v = RefParser(text).document();
  return v && RefValidator(schema).valid(schema, *v);
}

struct Case {
  const char* schema;
  const char* text;
  bool valid;
};

TEST(JsonSchemaGrammar, EdgeCases) {
  const Case cases[] = {
      {R"({"type":"object"})", "{}", true},
      {R"({"type":"object"})", " {\n } ", true},
      {R"({"type":"object"})", "{\"a\":1}", false},  // additionalProperties absent: none
      {R"({"type":"object","additionalProperties":true})", R"({"a":{"b":[1,{"c":null}]},"d":"x"})", true},
      {R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})", R"({"a":-0})", true},
      {R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})", R"({})", false},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{}}})", R"({"b":1,"a":2})", false},  // order
      {R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})", R"({"a":1,"a":2})",
       false},  // a declared name again as an additional key
      {R"({"type":"integer"})", "01", false},
      {R"({"type":"integer"})", "1.0", false},
      {R"({"type":"number"})", "-0.5e+10", true},
      {R"({"type":"number"})", "1.", false},
      {R"({"type":"number"})", ".5", false},
      {R"({"type":"number"})", "1e", false},
      {R"({"type":"string"})", R"("\u00e9\uD83D\uDE00\n\/")", true},
      {R"({"type":"string"})", R"("\uD83D")", false},       // a lone high surrogate
      {R"({"type":"string"})", R"("\uDE00")", false},       // a lone low surrogate
      {R"({"type":"string"})", "\"\x01\"", false},          // a raw control character
      {R"({"type":"string"})", "\"\xc3\"", false},          // a cut UTF-8 sequence
      {R"({"type":"string"})", "\"\xed\xa0\x80\"", false},  // an encoded surrogate
      {R"({"type":"string","maxLength":2})", R"("é🎉")", true},
      {R"({"type":"string","maxLength":2})", R"("\uD83D\uDE00x")", true},
      {R"({"type":"string","maxLength":2})", R"("abc")", false},
      {R"({"type":"string","minLength":2})", R"("a")", false},
      {R"({"enum":["a",1,null,{"x":[true]}]})", R"({"x":[true]})", true},
      {R"({"enum":["a",1,null,{"x":[true]}]})", R"({"x": [true]})", false},  // not the canonical text
      {R"({"type":"string","enum":["a",1]})", "1", false},
      {R"({"const":"q"})", R"("q")", true},
      {R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2})", "[]", false},
      {R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2})", "[true ,\nfalse]", true},
      {R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2})", "[true,true,true]", false},
      {R"({"type":"array","items":{"type":"boolean"}})", "[true,]", false},
      {R"({"anyOf":[{"type":"string"},{"type":"array","items":{"type":"null"}}]})", "[null,null]", true},
      {R"({"$defs":{"n":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/n"}}}}},
          "$ref":"#/$defs/n"})",
       R"({"k":[{"k":[{},{"k":[]}]}]})", true},
      {R"({"definitions":{"s":{"type":"string"}},"type":"array","items":{"$ref":"#/definitions/s"}})", R"(["a",1])",
       false},
      {"{}", R"([{"a":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]}])", true},
      {"{}", "", false},
  };
  for (const Case& c : cases) {
    const json schema = json::parse(c.schema);
    EXPECT_EQ(accepts(compile(schema), c.text), c.valid) << c.schema << "  on  " << c.text;
    EXPECT_EQ(reference(schema, c.text), c.valid) << "reference: " << c.schema << "  on  " << c.text;
  }
}

TEST(JsonSchemaGrammar, DeepNestingIsRecursionNotCopies) {
  // json_object: 300 levels of arrays inside an object; the grammar stays small.
  // Besides the one rule of free strings' characters (a chain of kMaxFreeStringChars positions).
  auto g = std::make_shared<const CompiledGrammar>(json_object_grammar(), byte_vocabulary());
  size_t states = 0, string_states = 0;
  for (const Rule& r : g->grammar().rules) (r.name == "string rest" ? string_states : states) += size_t(r.num_states);
  EXPECT_LT(states, 2000u);
  EXPECT_GT(string_states, size_t(kMaxFreeStringChars));
  EXPECT_LT(string_states, size_t(kMaxFreeStringChars) * 40);
  std::string deep = "{\"a\":" + std::string(300, '[') + std::string(300, ']') + "}";
  EXPECT_TRUE(accepts(g, deep));
  EXPECT_FALSE(accepts(g, "{\"a\":" + std::string(300, '[') + std::string(299, ']') + "}"));
  EXPECT_FALSE(accepts(g, "[1]"));  // json_object: an object
}

TEST(JsonSchemaGrammar, RefusesWhatItDoesNotSupportNamingTheKeyword) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type":"string","pattern":"a+"})", "pattern"},
      {R"({"type":"integer","minimum":"0"})", "minimum"},
      {R"({"type":"object","properties":{"a":{"type":"number","multipleOf":0.5}}})", "multipleOf"},
      {R"({"type":"array","prefixItems":[{}]})", "prefixItems"},
      {R"({"allOf":[{}]})", "allOf"},
      {R"({"type":"strng"})", "type"},
      {R"({"type":"string","minLength":3,"maxLength":2})", "minLength"},
      {R"({"type":"object","properties":{},"required":["x"]})", "required"},
      {R"({"$ref":"#/$defs/missing"})", "$ref"},
      {R"({"$ref":"https://example.com/s.json"})", "$ref"},
      {R"({"$ref":"#/$defs/a","type":"object","$defs":{"a":{}}})", "type"},
      {R"({"enum":[]})", "enum"},
      {R"({"type":"integer","enum":["a"]})", "enum"},
  };
  for (const auto& [schema, keyword] : cases) {
    try {
      json_schema_grammar(json::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword(), keyword) << schema << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("json_schema:"), std::string::npos);
    }
  }
  // A schema that reaches itself before reading anything has no grammar.
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},
                                                  "$ref":"#/$defs/a"})")),
               Error);
  EXPECT_THROW(json_schema_grammar(json::parse("false")), SchemaError);
}

// Issue 18: schemas come from HTTP clients. Bounds up to 1,000,000 are accepted keywords, but a
// string of maxLength 1000000 built a 28M-state automaton (6 GB, 160 s) before the DFA limit
// refused it, and maxItems 1000000 took 14 GB and 270 s. Refused now at 500K NFA states, at
// once (this test took minutes before); a large schema that fits still compiles.
TEST(JsonSchemaGrammar, regression_huge_bounds_are_refused_before_they_are_built_18) {
  for (const char* schema :
       {R"({"type":"string","maxLength":1000000})", R"({"type":"array","items":{"type":"integer"},"maxItems":1000000})",
        R"({"type":"array","items":{"type":"string","minLength":999999}})"}) {
    EXPECT_THROW(json_schema_grammar(json::parse(schema)), Error) << schema;
  }
  EXPECT_NO_THROW(json_schema_grammar(json::parse(R"({"type":"string","maxLength":5000})")));
}

TEST(JsonSchemaGrammar, AnnotationsAreIgnored) {
  const json schema = json::parse(R"({"title":"T","description":"d","$schema":"x","type":"object",
      "properties":{"when":{"type":"string","format":"date-time","examples":["2020"]}},"default":{}})");
  EXPECT_TRUE(accepts(compile(schema), R"({"when":"now"})"));
}

TEST(JsonSchemaGrammar, RandomSchemasAgreeWithTheReference) {
  RefGenerator gen(12345);
  int valid = 0, invalid = 0;
  for (int s = 0; s < 120; ++s) {
    const json schema = gen.schema(3);
    std::shared_ptr<const CompiledGrammar> g;
    try {
      g = compile(schema);
    } catch (const Error& e) {
      ADD_FAILURE() << "refused " << schema.dump() << ": " << e.what();
      continue;
    }
    for (int d = 0; d < 24; ++d) {
      auto text = gen.valid(schema, schema, 0, 20);
      if (!text) continue;
      if (d % 3 != 0) text = gen.mutate(*text);
      if (d % 6 == 1) text = gen.mutate(*text);
      const bool ref = reference(schema, *text);
      ASSERT_EQ(accepts(g, *text), ref) << "schema " << schema.dump() << "\ntext " << *text;
      (ref ? valid : invalid)++;
    }
  }
  EXPECT_GT(valid, 800);
  EXPECT_GT(invalid, 800);
}

TEST(JsonSchemaGrammar, RecursiveSchemasAgreeWithTheReference) {
  const json schema = json::parse(R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},
      "required":["v"]}},"$ref":"#/$defs/node"})");
  auto g = compile(schema);
  RefGenerator gen(7);
  int valid = 0;
  for (int d = 0; d < 400; ++d) {
    auto text = gen.valid(schema, schema, 0, 20);
    if (!text) continue;
    if (d % 2) text = gen.mutate(*text);
    const bool ref = reference(schema, *text);
    ASSERT_EQ(accepts(g, *text), ref) << *text;
    valid += ref;
  }
  EXPECT_GT(valid, 150);
}

// Issue 40: up to 32 bytes of whitespace in every gap let a model write hundreds of bytes of it
// before a value; a gap is now as compact as llama.cpp's schema grammars allow.
TEST(JsonSchemaGrammar, WhitespaceIsCompact) {
  auto g = compile(json::parse(R"({"type":"array","items":{"type":"integer"}})"));
  const std::string indent(20, ' '), deeper(21, ' ');
  const std::pair<std::string, bool> gaps[] = {
      {"", true},          {" ", true},   {"\n", true},      {"\n\n", true},           {"\n" + indent, true},
      {"\n\n\t \t", true}, {"  ", false}, {"\n\n\n", false}, {"\n" + deeper, false},   {" \n", false},
      {"\r\n", false},     {"\t", false}, {"\n \n", false},  {"\n\n" + deeper, false},
  };
  for (const auto& [gap, valid] : gaps) {
    for (const std::string& text : {"[" + gap + "1]", "[1" + gap + ",2]", gap + "[]" + gap}) {
      EXPECT_EQ(accepts(g, text), valid) << json(text).dump();
      EXPECT_EQ(reference(json::parse(R"({"type":"array"})"), text), valid) << "reference: " << json(text).dump();
    }
  }
  GrammarOptions none;
  none.max_indent = -1;
  auto tight = std::make_shared<const CompiledGrammar>(json_schema_grammar(json::parse(R"({"type":"array"})"), none),
                                                       byte_vocabulary());
  EXPECT_TRUE(accepts(tight, "[1,[]]"));
  EXPECT_FALSE(accepts(tight, "[1, []]"));
  EXPECT_FALSE(accepts(tight, " []"));
}

std::string digits(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += char('1' + i % 9);
  return s;
}

// Issue 40: an integer could have any number of digits (17171717... until max_tokens).
TEST(JsonSchemaGrammar, NumbersAreBounded) {
  const json integer = json::parse(R"({"type":"integer"})"), number = json::parse(R"({"type":"number"})");
  auto gi = compile(integer), gn = compile(number);
  const std::pair<std::string, bool> integers[] = {
      {digits(16), true}, {digits(17), false}, {"-" + digits(16), true}, {"-" + digits(17), false}, {"0", true},
  };
  for (const auto& [text, valid] : integers) {
    EXPECT_EQ(accepts(gi, text), valid) << text;
    EXPECT_EQ(accepts(gn, text), valid) << text;
    EXPECT_EQ(reference(integer, text), valid) << "reference: " << text;
  }
  const std::pair<std::string, bool> numbers[] = {
      {"0." + digits(16), true},
      {"0." + digits(17), false},
      {digits(16) + "." + digits(16), true},
      {"1e" + digits(3), true},
      {"1e" + digits(4), false},
      {"1.5E-007", true},
      {"1.5E-0007", false},
      {"-0.0e+0", true},
      {digits(16) + "." + digits(16) + "e-999", true},
      {digits(17) + ".0", false},
      {"1." + digits(16) + "0", false},
  };
  for (const auto& [text, valid] : numbers) {
    EXPECT_EQ(accepts(gn, text), valid) << text;
    EXPECT_EQ(reference(number, text), valid) << "reference: " << text;
    EXPECT_FALSE(accepts(gi, text)) << text;
  }
}

std::string chars(size_t n, const std::string& c = "x") {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += c;
  return s;
}

// Issue 40: nothing forced a string without maxLength to end (json_object replies wandered in
// one until max_tokens). Now kMaxFreeStringChars past minLength; maxLength as given.
TEST(JsonSchemaGrammar, StringsAreBounded) {
  const size_t n = size_t(kMaxFreeStringChars);
  const json free = json::parse(R"({"type":"string"})"), min3 = json::parse(R"({"type":"string","minLength":3})"),
             max5000 = json::parse(R"({"type":"string","maxLength":5000})");
  const struct {
    const json& schema;
    std::string text;
    bool valid;
  } cases[] = {
      {free, "\"" + chars(n) + "\"", true},
      {free, "\"" + chars(n + 1) + "\"", false},
      {free, "\"" + chars(n, "\\uD83D\\uDE00") + "\"", true},  // a pair is one character
      {free, "\"" + chars(n - 1) + "é\"", true},
      {free, "\"" + chars(n) + "é\"", false},
      {min3, "\"" + chars(n + 3) + "\"", true},
      {min3, "\"" + chars(n + 4) + "\"", false},
      {min3, "\"xx\"", false},
      {max5000, "\"" + chars(5000) + "\"", true},
      {max5000, "\"" + chars(5001) + "\"", false},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(accepts(compile(c.schema), c.text), c.valid) << c.schema.dump() << " on " << c.text.size() << " bytes";
    EXPECT_EQ(reference(c.schema, c.text), c.valid) << "reference: " << c.schema.dump() << " on " << c.text.size();
  }
  // json_object: keys and string values as free strings, so a wandering key ends too.
  auto object = std::make_shared<const CompiledGrammar>(json_object_grammar(), byte_vocabulary());
  EXPECT_TRUE(accepts(object, "{\"" + chars(n) + "\":\"" + chars(n) + "\"}"));
  EXPECT_FALSE(accepts(object, "{\"" + chars(n + 1) + "\":1}"));
  EXPECT_FALSE(accepts(object, "{\"a\":[\"" + chars(n + 1) + "\"]}"));
  // Additional properties' keys: kMaxFreeKeyChars.
  auto extra = compile(json::parse(R"({"type":"object","properties":{"a":{}},"additionalProperties":true})"));
  const size_t k = size_t(kMaxFreeKeyChars);
  EXPECT_TRUE(accepts(extra, "{\"" + chars(k) + "\":1}"));
  EXPECT_TRUE(accepts(extra, "{\"" + chars(k - 1) + "é\":1}"));
  EXPECT_FALSE(accepts(extra, "{\"" + chars(k + 1) + "\":1}"));
  EXPECT_FALSE(accepts(extra, "{\"" + chars(k) + "é\":1}"));
  EXPECT_FALSE(accepts(extra, "{\"a\":1,\"a\":2}"));
}

}  // namespace
}  // namespace lily::grammar
