// A GGUF's stop tokens (model/gguf_vocabulary.h gguf_stop_token_ids): a GGUF has no
// generation_config.json, so lily takes tokenizer.ggml.eos_token_id plus the vocabulary's
// <|im_end|> and <|endoftext|>, the set the Hugging Face checkpoint lists (Qwen3.6: eos_token_id
// [248046, 248044], spec tokenizer-chat-api.md §1.4). Checked:
//   * on hand-written vocabularies, against the rule ChatService applies through the tokenizer
//     (Tokenizer::token_id of the two texts, plus the eos id): the same set, each id once;
//   * lily-tiny's vocabulary as GGUF (tools/hf_to_gguf.py --vocab-only) against models/lily-tiny's
//     generation_config.json: the same set;
//   * tiny-a-q8_0.gguf (llama.cpp's fixture set) loads with <|im_end|>'s id among its stops;
//   * hostile files: a vocabulary without <|im_end|> (a crafted one, and tiny-a-q8_0.gguf with
//     the token renamed) still loads, its stops then the metadata's eos alone; ids outside the
//     model's vocabulary and mistyped keys are errors naming the key.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>

#include "base/error.h"
#include "fixture.h"
#include "gguf_writer.h"
#include "model/checkpoint/load.h"
#include "model/config.h"
#include "model/gguf_file.h"
#include "model/gguf_vocabulary.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace lily {
namespace {

namespace fs = std::filesystem;
using test::GgufWriter;

const std::string kFixtures = LILY_FIXTURES_DIR;
const std::string kLilyTiny = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4;

// A valid small byte-level vocabulary: the 256 byte tokens, "he" (one merge), then `extra`
// tokens with their types (ids 257, 258, ...).
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  explicit Vocab(const std::vector<std::pair<std::string, int32_t>>& extra = {}) {
    for (int b = 0; b < 256; ++b) {
      std::string s;
      unicode::append_utf8(s, unicode::byte_to_codepoint()[b]);
      tokens.push_back(s);
    }
    tokens.push_back("he");
    types.assign(tokens.size(), kNormal);
    for (const auto& [text, type] : extra) {
      tokens.push_back(text);
      types.push_back(type);
    }
  }
};

// A GGUF in memory and its header (whose numbers point into the bytes, so both live together).
struct ParsedGguf {
  std::vector<std::byte> bytes;
  GgufHeader header;
  explicit ParsedGguf(std::vector<std::byte> file) : bytes(std::move(file)), header(parse_gguf(bytes, "t.gguf")) {}
  const std::map<std::string, GgufValue>& metadata() const { return header.metadata; }
};

// A vocabulary-only GGUF of `v`, eos_token_id `eos` (< 0: none); `edit` writes more keys.
ParsedGguf vocab_gguf(const Vocab& v, int eos, const std::function<void(GgufWriter&)>& edit = {}) {
  GgufWriter w;
  w.str("general.architecture", "qwen35moe");
  w.str("tokenizer.ggml.model", "gpt2");
  w.str("tokenizer.ggml.pre", "qwen35");
  w.strings("tokenizer.ggml.tokens", v.tokens);
  w.array<int32_t>("tokenizer.ggml.token_type", GgufValueType::i32, v.types);
  w.strings("tokenizer.ggml.merges", {"h e"});
  if (eos >= 0) w.u32("tokenizer.ggml.eos_token_id", uint32_t(eos));
  if (edit) edit(w);
  return ParsedGguf(w.build());
}

// The stops ChatService builds from the tokenizer (runtime/chat_service.cpp stop_tokens):
// <|im_end|> and <|endoftext|> by Tokenizer::token_id, then the model's eos ids.
std::set<int> tokenizer_rule(const ParsedGguf& g, const std::vector<int>& eos) {
  const Tokenizer t = Tokenizer::from_ggml(*gguf_vocabulary(g.metadata()), "t.gguf");
  std::set<int> ids(eos.begin(), eos.end());
  for (const char* name : {"<|im_end|>", "<|endoftext|>"})
    if (auto id = t.token_id(name)) ids.insert(*id);
  return ids;
}

std::string stop_error(const ParsedGguf& g, int vocab_size) {
  try {
    gguf_stop_token_ids(g.metadata(), vocab_size);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "a bad stop id was accepted";
  return "";
}

#define EXPECT_STOP_ERROR(header, vocab, text) \
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, text, stop_error(header, vocab))

std::set<int> as_set(const std::vector<int>& v) { return {v.begin(), v.end()}; }

// --- hand-written vocabularies --------------------------------------------------------------

TEST(GgufStopTokens, EosThenImEndThenEndoftextEachOnce) {
  const Vocab v({{"<|endoftext|>", kControl}, {"<|im_start|>", kControl}, {"<|im_end|>", kControl}});
  // "he" is 256: <|endoftext|> 257, <|im_start|> 258, <|im_end|> 259.
  const int vocab = int(v.tokens.size());
  for (int eos : {259, 257, 258, -1}) {
    const ParsedGguf h = vocab_gguf(v, eos);
    const std::vector<int> got = gguf_stop_token_ids(h.metadata(), vocab);
    std::vector<int> want = eos >= 0 ? std::vector<int>{eos} : std::vector<int>{};
    for (int id : {259, 257})
      if (std::find(want.begin(), want.end(), id) == want.end()) want.push_back(id);
    EXPECT_EQ(got, want) << "eos " << eos;
    EXPECT_EQ(as_set(got), tokenizer_rule(h, eos >= 0 ? std::vector<int>{eos} : std::vector<int>{})) << "eos " << eos;
  }
}

TEST(GgufStopTokens, UserDefinedAddedTokensCountAsTheTokenizerSeesThem) {
  const Vocab v({{"<|im_end|>", kUserDefined}});
  const ParsedGguf h = vocab_gguf(v, -1);
  EXPECT_EQ(gguf_stop_token_ids(h.metadata(), 300), std::vector<int>{257});
  EXPECT_EQ(as_set(gguf_stop_token_ids(h.metadata(), 300)), tokenizer_rule(h, {}));
}

// A NORMAL (BPE) token spelled "<|im_end|>" is no added token: Tokenizer::token_id does not find
// it, and it is no stop.
TEST(GgufStopTokens, ANormalTokenWithTheTextIsNoStop) {
  const Vocab v({{"<|im_end|>", kNormal}, {"<|endoftext|>", kControl}});
  const ParsedGguf h = vocab_gguf(v, 258);
  EXPECT_EQ(gguf_stop_token_ids(h.metadata(), 300), std::vector<int>{258});
  EXPECT_EQ(as_set(gguf_stop_token_ids(h.metadata(), 300)), tokenizer_rule(h, {258}));
}

TEST(GgufStopTokens, AVocabularyWithoutImEndGivesTheMetadataEosAlone) {
  const Vocab v({{"<think>", kUserDefined}, {"<|im_start|>", kControl}});
  const ParsedGguf h = vocab_gguf(v, 258);
  EXPECT_EQ(gguf_stop_token_ids(h.metadata(), 300), std::vector<int>{258});
  EXPECT_EQ(as_set(gguf_stop_token_ids(h.metadata(), 300)), tokenizer_rule(h, {258}));
  EXPECT_TRUE(gguf_stop_token_ids(vocab_gguf(v, -1).metadata(), 300).empty());
}

TEST(GgufStopTokens, WeightsWithoutATokenizerGiveTheEosAlone) {
  GgufWriter w;
  w.str("general.architecture", "qwen35moe");
  w.u32("tokenizer.ggml.eos_token_id", 7);
  EXPECT_EQ(gguf_stop_token_ids(ParsedGguf(w.build()).metadata(), 10), std::vector<int>{7});
  GgufWriter none;
  none.str("general.architecture", "qwen35moe");
  EXPECT_TRUE(gguf_stop_token_ids(ParsedGguf(none.build()).metadata(), 10).empty());
}

TEST(GgufStopTokensHostile, IdsOutsideTheModelsVocabulary) {
  const Vocab v({{"<|endoftext|>", kControl}, {"<|im_end|>", kControl}});  // 257, 258
  EXPECT_STOP_ERROR(vocab_gguf(v, 250), 250, "metadata 'tokenizer.ggml.eos_token_id': 250 is not a token");
  EXPECT_STOP_ERROR(vocab_gguf(v, 1), 258, "metadata 'tokenizer.ggml.tokens': <|im_end|> (id 258): 258 is not a");
  EXPECT_STOP_ERROR(vocab_gguf(v, -1, [](GgufWriter& w) { w.i32("tokenizer.ggml.eos_token_id", -3); }), 300,
                    "-3 is not a token of the model");
  EXPECT_EQ(gguf_stop_token_ids(vocab_gguf(v, 1).metadata(), 259), (std::vector<int>{1, 258, 257}));
}

TEST(GgufStopTokensHostile, MistypedKeys) {
  Vocab v({{"<|im_end|>", kControl}});
  GgufWriter w;
  w.strings("tokenizer.ggml.tokens", v.tokens);
  w.array<int32_t>("tokenizer.ggml.token_type", GgufValueType::i32, {kNormal, kControl});
  EXPECT_STOP_ERROR(ParsedGguf(w.build()), 300, "metadata 'tokenizer.ggml.token_type': has 2 entries for 258");
  GgufWriter s;
  s.str("tokenizer.ggml.tokens", "<|im_end|>");
  s.array<int32_t>("tokenizer.ggml.token_type", GgufValueType::i32, {kControl});
  EXPECT_STOP_ERROR(ParsedGguf(s.build()), 300, "metadata 'tokenizer.ggml.tokens'");
  GgufWriter e;
  e.str("tokenizer.ggml.eos_token_id", "<|im_end|>");
  EXPECT_STOP_ERROR(ParsedGguf(e.build()), 300, "metadata 'tokenizer.ggml.eos_token_id'");
}

// --- the fixtures ---------------------------------------------------------------------------

// models/lily-tiny's generation_config.json lists [<|im_end|>, <|endoftext|>] as Qwen3.6's does;
// its vocabulary as GGUF gives the same set.
TEST(GgufStopTokens, LilyTinyVocabularyEqualsItsGenerationConfig) {
  const GgufModel gguf(kFixtures + "/tokenizer/lily-tiny-vocab.gguf");
  const GenerationConfig hf = load_generation_config(kLilyTiny);
  ASSERT_EQ(hf.eos_token_ids.size(), 2u);
  const std::vector<int> got = gguf_stop_token_ids(gguf.metadata(), 1920);
  EXPECT_EQ(as_set(got), as_set(hf.eos_token_ids));
  EXPECT_EQ(got.size(), as_set(got).size());
  const Tokenizer json = Tokenizer::load(kLilyTiny + "/tokenizer.json");
  EXPECT_TRUE(as_set(got).count(*json.token_id("<|im_end|>")));
  EXPECT_TRUE(as_set(got).count(*json.token_id("<|endoftext|>")));
}

// tiny-a's tokenizer (gguf/tokenizer/tokenizer.json, the one its GGUFs were made from) has
// <|im_end|> at 353 and <|endoftext|> at 351; the GGUFs' eos_token_id is tiny-a's
// generation_config.json's first id, 2 (that file's [2, 1] are random-model ids, not chat
// tokens, so the HF directory's set is not the one to compare with here).
TEST(GgufStopTokens, TinyAGgufStopsOnImEnd) {
  const Tokenizer json = Tokenizer::load(kFixtures + "/models/tiny-a/gguf/tokenizer/tokenizer.json");
  const auto weights = load_model(kFixtures + "/models/tiny-a/gguf/tiny-a-q8_0.gguf");
  const std::vector<int>& stops = weights->generation.eos_token_ids;
  EXPECT_EQ(stops, (std::vector<int>{2, *json.token_id("<|im_end|>"), *json.token_id("<|endoftext|>")}));
  const std::optional<Tokenizer> own = find_tokenizer(*weights);
  ASSERT_TRUE(own);
  EXPECT_EQ(own->token_id("<|im_end|>"), json.token_id("<|im_end|>"));
}

// `file` with every GGUF string `from` (length-prefixed, as tokenizer.ggml.tokens holds it)
// replaced by `to`, of the same length; returns how many it replaced.
int rename_token(std::vector<char>& file, const std::string& from, const std::string& to) {
  EXPECT_EQ(from.size(), to.size());
  std::string pattern(8, '\0');
  const uint64_t n = from.size();
  std::memcpy(pattern.data(), &n, 8);
  pattern += from;
  int count = 0;
  for (auto it = file.begin(); (it = std::search(it, file.end(), pattern.begin(), pattern.end())) != file.end();) {
    std::copy(to.begin(), to.end(), it + 8);
    ++count;
  }
  return count;
}

TEST(GgufStopTokensHostile, TinyAWithoutImEndStillLoadsWithTheEosAlone) {
  const std::string source = kFixtures + "/models/tiny-a/gguf/tiny-a-q8_0.gguf";
  std::ifstream in(source, std::ios::binary);
  std::vector<char> file{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_EQ(rename_token(file, "<|im_end|>", "<|im_fin|>"), 1);
  const fs::path dir = fs::temp_directory_path() / ("lily-gguf-stops-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "no-im-end.gguf").string();
  std::ofstream(path, std::ios::binary).write(file.data(), std::streamsize(file.size()));
  const auto no_im_end = load_model(path);
  EXPECT_EQ(no_im_end->generation.eos_token_ids, (std::vector<int>{2, 351}));

  ASSERT_EQ(rename_token(file, "<|endoftext|>", "<|endoftaxt|>"), 1);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(file.data(), std::streamsize(file.size()));
  const auto neither = load_model(path);
  EXPECT_EQ(neither->generation.eos_token_ids, std::vector<int>{2});
  const std::optional<Tokenizer> tokenizer = find_tokenizer(*neither);
  ASSERT_TRUE(tokenizer);
  EXPECT_FALSE(tokenizer->token_id("<|im_end|>"));
  EXPECT_EQ(tokenizer->token_id("<|im_fin|>"), 353);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lily
