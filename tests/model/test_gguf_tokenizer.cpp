// The tokenizer from a GGUF's own vocabulary (tokenizer.ggml.*: model/gguf_vocabulary,
// tokenizer/tokenizer_ggml.cpp) against the tokenizer.json it was converted from by
// tools/hf_to_gguf.py --vocab-only (llama.cpp's converter's layout):
//   tests/fixtures/tokenizer/tokenizer.gguf        from the HF-trained fixture tokenizer: HF's own
//                                                  ids for every case of cases.json
//   tests/fixtures/tokenizer/lily-tiny-vocab.gguf  from models/lily-tiny (vocab_size 1920: 58 [PAD]
//                                                  ids): the same ids as its tokenizer.json on a
//                                                  varied and a random corpus
// damaged tokenizer metadata (each a clear error), and `lily run` on a GGUF with no
// tokenizer.json beside it.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "gguf_writer.h"
#include "model/gguf_file.h"
#include "model/gguf_vocabulary.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace lily {
namespace {

namespace fs = std::filesystem;
using test::GgufWriter;

const std::string kFixtures = LILY_FIXTURES_DIR;

Tokenizer gguf_tokenizer(const std::string& path) {
  const GgufModel model(path);
  std::optional<GgmlVocabulary> v = gguf_vocabulary(model.metadata());
  if (!v) throw std::runtime_error(path + " has no tokenizer.ggml.model");
  return Tokenizer::from_ggml(*v, path);
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// llama.cpp's converter types a non-special added token CONTROL when it looks special.
bool looks_special(const std::string& s) {
  return s.size() >= 4 && s.compare(0, 2, "<|") == 0 && s.compare(s.size() - 2, 2, "|>") == 0;
}

// Every id decodes to the same bytes, added tokens keep their ids and (up to the converter's
// looks-special rule) their special flag.
void expect_same_tables(const Tokenizer& json, const Tokenizer& gguf) {
  ASSERT_EQ(gguf.vocab_size(), json.vocab_size());
  int special = 0;
  for (int32_t id = 0; id < json.vocab_size(); ++id) {
    ASSERT_EQ(gguf.token_bytes(id), json.token_bytes(id)) << "id " << id;
    const std::string text = json.token_bytes(id);
    if (json.token_id(text) == id) {  // an added token
      EXPECT_EQ(gguf.token_id(text), id) << text;
      EXPECT_EQ(gguf.is_special(id), json.is_special(id) || looks_special(text)) << text;
      special += gguf.is_special(id);
    }
  }
  EXPECT_GE(special, 20);
}

void expect_same_encoding(const Tokenizer& json, const Tokenizer& gguf, const std::string& text) {
  const std::vector<int32_t> want = json.encode(text);
  const std::vector<int32_t> got = gguf.encode(text);
  ASSERT_EQ(got, want) << "text: " << text << "\ngguf: " << ids_string(got) << "\njson: " << ids_string(want);
  ASSERT_EQ(gguf.decode(got), json.decode(want));
}

// The spec's strings (tokenizer-chat-api.md §1.5), scripts the split regex treats differently,
// NFC at work, the chat template's markers, added tokens inside words and cut in half.
const std::vector<std::string>& varied_corpus() {
  static const std::vector<std::string> corpus = {
      "",
      "Compute 12+35",
      "transformers",
      "\xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5\xe0\xb8\x84\xe0\xb8\xa3\xe0\xb8\xb1\xe0"
      "\xb8\x9a \xe0\xb8\x9c\xe0\xb8\xa1",  // Thai, \p{M}
      "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81\xe4\xbb\x8a\xe5\xa4\xa9\xe6\x98\xaf"
      "2026"
      "\xe5\xb9\xb4"
      "8\xe6\x9c\x88"
      "13\xe6\x97\xa5 \xf0\x9f\x8e\x89",  // CJK, digits, emoji
      "\xe4\xba\xba\xe5\xb7\xa5\xe6\x99\xba\xe8\x83\xbd",
      "<|im_start|>",
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
      "<tool_response>\n{\"temp\": -3.5}\n</tool_response>",
      "x<|endoftext|>y<|im_end|><|im_end|>",
      "<|im_",
      "im_end|>",
      "< |im_end| >",
      "<think",
      "</think>></think>",
      "e\xcc\x81 vs \xc3\xa9, A\xcc\x8a vs \xc3\x85",  // decomposed and composed: NFC makes them equal
      "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
      "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
      "3 33 333 3333 33333 3.3 3..3 3...3 ------======= ......!!!!!!??????",
      "\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f (multiple emojis) \xe2\x9c\x85 \xf0\x9f\xa6\x99\xf0\x9f"
      "\xa6\x99",
      "\xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xd0\xbd\xd0\xb0 \xd0\x91\xd1\x8a\xd0\xbb\xd0\xb3\xd0\xb0\xd1\x80\xd1\x81\xd0"
      "\xba\xd0\xb8",
      "bad \xff\xfe bytes \xc3 and \xe2\x82",  // invalid UTF-8: U+FFFD before anything else
      "tab\tand\r\nwindows\rlines  trailing   ",
      "def f(x):\n    return {'a': [1, 2.5e-3, None]}  # comment\n",
  };
  return corpus;
}

// Random strings from pieces the pipeline treats differently, invalid bytes included.
std::vector<std::string> random_corpus(int n, uint32_t seed) {
  static const std::vector<std::string> pieces = {"the",
                                                  " the",
                                                  "The",
                                                  "  ",
                                                  " ",
                                                  "\n",
                                                  "\n\n",
                                                  "\t",
                                                  "\r\n",
                                                  "12",
                                                  "3",
                                                  "+",
                                                  "=",
                                                  "?",
                                                  "'s",
                                                  "'LL",
                                                  "don't",
                                                  "\xc3\xa9",
                                                  "e\xcc\x81",
                                                  "\xe4\xbd\xa0\xe5\xa5\xbd",
                                                  "\xf0\x9f\x8e\x89",
                                                  "\xe0\xb8\xaa\xe0\xb8\xb1",
                                                  "<|im_end|>",
                                                  "<|im_start|>",
                                                  "<think>",
                                                  "</think>",
                                                  "<|im_",
                                                  "|>",
                                                  "<",
                                                  "{\"a\":",
                                                  "\xff",
                                                  "\xc3",
                                                  "..."};
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string s;
    const int len = int(rng() % 12);
    for (int k = 0; k < len; ++k) s += pieces[rng() % pieces.size()];
    out.push_back(s);
  }
  return out;
}

TEST(GgufTokenizer, TheFixtureVocabularyGivesHfIdsForEveryCase) {
  const Tokenizer gguf = gguf_tokenizer(kFixtures + "/tokenizer/tokenizer.gguf");
  const auto cases = nlohmann::json::parse(std::ifstream(kFixtures + "/tokenizer/cases.json"));
  ASSERT_GT(cases.size(), 50u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = gguf.encode(c.at("text").get<std::string>());
    EXPECT_EQ(got, want) << "gguf: " << ids_string(got) << "\nHF:   " << ids_string(want);
    EXPECT_EQ(gguf.decode(want), c.at("decoded").get<std::string>());
  }
  expect_same_tables(Tokenizer::load(kFixtures + "/tokenizer/tokenizer.json"), gguf);
}

TEST(GgufTokenizer, LilyTinyVocabularyEncodesAsItsTokenizerJson) {
  const Tokenizer json = Tokenizer::load(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny/tokenizer.json");
  const Tokenizer gguf = gguf_tokenizer(kFixtures + "/tokenizer/lily-tiny-vocab.gguf");
  expect_same_tables(json, gguf);
  EXPECT_EQ(gguf.vocab_size(), 1862);  // the [PAD1862] .. [PAD1919] ids are not tokens
  EXPECT_THROW(gguf.decode(std::vector<int32_t>{1862}), Error);
  for (const std::string& text : varied_corpus()) expect_same_encoding(json, gguf, text);
  for (const std::string& text : random_corpus(2000, 41)) expect_same_encoding(json, gguf, text);
  std::mt19937 rng(7);
  for (int i = 0; i < 500; ++i) {
    std::vector<int32_t> ids(rng() % 16);
    for (int32_t& id : ids) id = int32_t(rng() % uint32_t(json.vocab_size()));
    ASSERT_EQ(gguf.decode(ids), json.decode(ids)) << ids_string(ids);
  }
}

// --- damaged tokenizer metadata -------------------------------------------------------------

// A valid small byte-level vocabulary: the 256 byte tokens (GPT-2 order is not needed), "he",
// "the", "Ġthe", an added control token, a user-defined one and an unused id.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges = {"h e", "t he", "\xc4\xa0 the"};
  Vocab() {
    for (int b = 0; b < 256; ++b) {
      std::string s;
      unicode::append_utf8(s, unicode::byte_to_codepoint()[b]);
      tokens.push_back(s);
    }
    for (const char* t : {"he", "the", "\xc4\xa0the", "<|im_end|>", "<think>", "[PAD261]"}) tokens.push_back(t);
    types.assign(tokens.size(), 1);
    types[259] = 3;
    types[260] = 4;
    types[261] = 5;
  }
};

// The GGUF of `v`; `edit` then writes the keys named in `replaced` (left out here) or more.
std::vector<std::byte> vocab_file(const Vocab& v, const std::vector<std::string>& replaced = {},
                                  const std::function<void(GgufWriter&)>& edit = {}) {
  GgufWriter w;
  auto keep = [&](const std::string& key) {
    return std::find(replaced.begin(), replaced.end(), key) == replaced.end();
  };
  w.str("general.architecture", "qwen35moe");
  if (keep("tokenizer.ggml.model")) w.str("tokenizer.ggml.model", "gpt2");
  if (keep("tokenizer.ggml.pre")) w.str("tokenizer.ggml.pre", "qwen35");
  if (keep("tokenizer.ggml.tokens")) w.strings("tokenizer.ggml.tokens", v.tokens);
  if (keep("tokenizer.ggml.token_type")) w.array<int32_t>("tokenizer.ggml.token_type", GgufValueType::i32, v.types);
  if (keep("tokenizer.ggml.merges")) w.strings("tokenizer.ggml.merges", v.merges);
  w.u32("tokenizer.ggml.eos_token_id", 259);
  if (edit) edit(w);
  return w.build();
}

// `v` with one key written by `write` instead.
std::vector<std::byte> with_key(const std::string& key, const std::function<void(GgufWriter&)>& write) {
  return vocab_file(Vocab(), {key}, write);
}

Tokenizer tokenizer_of(const std::vector<std::byte>& file) {
  const GgufHeader h = parse_gguf(file, "t.gguf");
  std::optional<GgmlVocabulary> v = gguf_vocabulary(h.metadata);
  if (!v) throw std::runtime_error("no tokenizer");
  return Tokenizer::from_ggml(*v, "t.gguf");
}

std::string tokenizer_error(const std::vector<std::byte>& file) {
  try {
    tokenizer_of(file);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "a damaged vocabulary was accepted";
  return "";
}

#define EXPECT_TOKENIZER_ERROR(file, text) EXPECT_PRED_FORMAT2(::testing::IsSubstring, text, tokenizer_error(file))

TEST(GgufTokenizer, TheHandVocabularyWorks) {
  const Tokenizer t = tokenizer_of(vocab_file(Vocab()));
  EXPECT_EQ(t.encode("the the<|im_end|><think>"), (std::vector<int32_t>{257, 258, 259, 260}));
  EXPECT_TRUE(t.is_special(259));
  EXPECT_FALSE(t.is_special(260));
  EXPECT_EQ(t.vocab_size(), 261);
  EXPECT_EQ(t.decode(std::vector<int32_t>{258, 259}), " the<|im_end|>");
}

TEST(GgufDamagedTokenizer, UnsupportedModelsAndPreTokenizers) {
  EXPECT_TOKENIZER_ERROR(
      with_key("tokenizer.ggml.model", [](GgufWriter& w) { w.str("tokenizer.ggml.model", "llama"); }),
      "tokenizer.ggml.model 'llama' is not supported");
  EXPECT_TOKENIZER_ERROR(with_key("tokenizer.ggml.pre", [](GgufWriter& w) { w.str("tokenizer.ggml.pre", "llama3"); }),
                         "tokenizer.ggml.pre 'llama3' is not supported");
  GgufWriter w;
  w.str("tokenizer.ggml.model", "gpt2");
  w.strings("tokenizer.ggml.tokens", Vocab().tokens);
  w.strings("tokenizer.ggml.merges", Vocab().merges);
  EXPECT_TOKENIZER_ERROR(w.build(), "tokenizer.ggml.pre is missing");
}

TEST(GgufDamagedTokenizer, WrongTypes) {
  EXPECT_TOKENIZER_ERROR(with_key("tokenizer.ggml.model", [](GgufWriter& w) { w.u32("tokenizer.ggml.model", 2); }),
                         "metadata 'tokenizer.ggml.model': expected a string, found u32 2");
  EXPECT_TOKENIZER_ERROR(with_key("tokenizer.ggml.tokens",
                                  [](GgufWriter& w) {
                                    w.array<int32_t>("tokenizer.ggml.tokens", GgufValueType::i32, {1, 2});
                                  }),
                         "metadata 'tokenizer.ggml.tokens': expected an array of strings, found array<i32>[2]");
  EXPECT_TOKENIZER_ERROR(
      with_key("tokenizer.ggml.token_type", [](GgufWriter& w) { w.strings("tokenizer.ggml.token_type", {"x"}); }),
      "metadata 'tokenizer.ggml.token_type': expected an array of integers");
  EXPECT_TOKENIZER_ERROR(
      with_key("tokenizer.ggml.merges", [](GgufWriter& w) { w.str("tokenizer.ggml.merges", "h e"); }),
      "metadata 'tokenizer.ggml.merges': expected an array of strings, found string");
  EXPECT_TOKENIZER_ERROR(vocab_file(Vocab(), {}, [](GgufWriter& w) { w.u32("tokenizer.chat_template", 1); }),
                         "metadata 'tokenizer.chat_template': expected a string");
  EXPECT_TOKENIZER_ERROR(vocab_file(Vocab(), {}, [](GgufWriter& w) { w.u32("tokenizer.ggml.add_bos_token", 1); }),
                         "metadata 'tokenizer.ggml.add_bos_token': expected a bool");
}

TEST(GgufDamagedTokenizer, CountsAndTypes) {
  Vocab short_types;
  short_types.types.pop_back();
  EXPECT_TOKENIZER_ERROR(vocab_file(short_types), "has 261 entries for 262 tokens");
  Vocab bad_type;
  bad_type.types[5] = 9;
  EXPECT_TOKENIZER_ERROR(vocab_file(bad_type), "entry 5 is 9, not a token type (0..6)");
  Vocab byte_type;
  byte_type.types[258] = 6;
  EXPECT_TOKENIZER_ERROR(vocab_file(byte_type), "tokenizer.ggml.tokens[258] '\xc4\xa0the' has token type 6 (BYTE");
  EXPECT_TOKENIZER_ERROR(vocab_file(Vocab(), {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"},
                                    [](GgufWriter& w) { w.strings("tokenizer.ggml.tokens", {}); }),
                         "metadata 'tokenizer.ggml.tokens': holds no tokens");
}

TEST(GgufDamagedTokenizer, TokensThatCannotBe) {
  Vocab empty;
  empty.tokens[257] = "";
  EXPECT_TOKENIZER_ERROR(vocab_file(empty), "tokenizer.ggml.tokens[257] is empty");
  Vocab invalid;
  invalid.tokens[257] = "\xff";
  EXPECT_TOKENIZER_ERROR(vocab_file(invalid), "tokenizer.ggml.tokens[257] is not valid UTF-8");
  Vocab repeated;
  repeated.tokens[258] = "he";
  EXPECT_TOKENIZER_ERROR(vocab_file(repeated), "tokenizer.ggml.tokens[258] 'he' repeats tokens[256]");
  Vocab no_byte;
  no_byte.tokens[65] = "zz";  // byte 0x41 'A' has no token
  EXPECT_TOKENIZER_ERROR(vocab_file(no_byte), "byte 0x41 (token 'A') is missing");
}

TEST(GgufDamagedTokenizer, MergesThatNameUnknownTokens) {
  Vocab unknown;
  unknown.merges.push_back("t hx");
  EXPECT_TOKENIZER_ERROR(vocab_file(unknown), "tokenizer.ggml.merges[3] 't hx': 'hx' is not a token");
  Vocab no_result;
  no_result.merges.push_back("e h");  // "eh" is not a token
  EXPECT_TOKENIZER_ERROR(vocab_file(no_result), "tokenizer.ggml.merges[3] 'e h': 'eh' is not a token");
  Vocab added;
  added.merges.push_back("<|im_end|> <think>");  // added tokens are no BPE symbols
  EXPECT_TOKENIZER_ERROR(vocab_file(added), "'<|im_end|>' is not a token");
  Vocab spaces;
  spaces.merges[1] = "t h e";
  EXPECT_TOKENIZER_ERROR(vocab_file(spaces), "tokenizer.ggml.merges[1] 't h e' is not two tokens separated by one");
  EXPECT_TOKENIZER_ERROR(
      with_key("tokenizer.ggml.merges", [](GgufWriter& w) { w.strings("tokenizer.ggml.merges", {}); }),
      "tokenizer.ggml.merges is missing or empty");
}

TEST(GgufDamagedTokenizer, SpecialIdsOutOfRange) {
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id"}) {
    EXPECT_TOKENIZER_ERROR(vocab_file(Vocab(), {}, [&](GgufWriter& w) { w.u32(key, 262); }),
                           fmt::format("metadata '{}': 262 is not a token id (tokenizer.ggml.tokens holds 262)", key));
    EXPECT_TOKENIZER_ERROR(vocab_file(Vocab(), {}, [&](GgufWriter& w) { w.i32(key, -1); }), "-1 is not a token id");
  }
}

TEST(GgufDamagedTokenizer, ATokenizerModelWithoutTokens) {
  GgufWriter w;
  w.str("tokenizer.ggml.model", "gpt2");
  EXPECT_TOKENIZER_ERROR(w.build(), "metadata 'tokenizer.ggml.tokens' is missing");
}

// --- lily run on a GGUF ---------------------------------------------------------------------

std::pair<int, std::string> run(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// tiny-a-q8_0.gguf has no tokenizer.json beside it: `lily run` tokenizes with the GGUF's own
// vocabulary, and answers as it does with the tokenizer.json that vocabulary came from.
TEST(GgufTokenizer, LilyRunOnAGgufWithoutTokenizerJson) {
  const std::string gguf_dir = kFixtures + "/models/tiny-a/gguf";
  ASSERT_FALSE(fs::exists(gguf_dir + "/tokenizer.json"));
  const std::string args = " -p 'Compute 12+35 <think>' -n 24 --temperature 0 --no-think --backend cpu 2>/dev/null";
  auto [status, out] = run(std::string(LILY_BINARY) + " run -m " + gguf_dir + "/tiny-a-q8_0.gguf" + args);
  ASSERT_EQ(status, 0) << out;
  EXPECT_FALSE(out.empty());

  const fs::path scratch = fs::temp_directory_path() / ("lily-gguf-tok-" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  fs::copy_file(gguf_dir + "/tiny-a-q8_0.gguf", scratch / "tiny-a-q8_0.gguf");
  fs::copy_file(gguf_dir + "/tokenizer/tokenizer.json", scratch / "tokenizer.json");
  auto [json_status,
        json_out] = run(std::string(LILY_BINARY) + " run -m " + (scratch / "tiny-a-q8_0.gguf").string() + args);
  fs::remove_all(scratch);
  EXPECT_EQ(json_status, 0) << json_out;
  EXPECT_EQ(out, json_out);
}

}  // namespace
}  // namespace lily
