// test_tokenizer.cpp: the Tokenizer on a hand-written tokenizer.json (hand_tokenizer.h), with ids
// worked out by hand, plus decoding, streaming, errors, threads and the CLI.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/error.h"
#include "hand_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace lily {
namespace {

using Ids = std::vector<int32_t>;

const Tokenizer& hand() {
  static const Tokenizer t = Tokenizer::load(test::write_temp_json(test::hand_tokenizer_json(false), "strings.json"));
  return t;
}

TEST(tokenizer_hand, merges_in_rank_order) {
  EXPECT_EQ(hand().encode("hello"), (Ids{259}));
  EXPECT_EQ(hand().encode("hello world"), (Ids{259, 264}));
  EXPECT_EQ(hand().encode(" hello"), (Ids{32, 259}));       // no "Ġh" merge
  EXPECT_EQ(hand().encode("world"), (Ids{119, 261, 263}));  // "w or" is not a merge, "Ġw or" is
  EXPECT_EQ(hand().encode("hello  world"), (Ids{259, 32, 264}));
  EXPECT_EQ(hand().encode("hellohello"), (Ids{259, 259}));
}

TEST(tokenizer_hand, merges_as_pairs_give_the_same_ids) {
  const Tokenizer pairs = Tokenizer::load(test::write_temp_json(test::hand_tokenizer_json(true), "pairs.json"));
  for (const char* text : {"hello world", " hello", "world", "<|im_start|>x", "héllo 🎉"}) {
    EXPECT_EQ(pairs.encode(text), hand().encode(text)) << text;
  }
}

TEST(tokenizer_hand, empty_and_whitespace) {
  EXPECT_EQ(hand().encode(""), Ids{});
  EXPECT_EQ(hand().encode("   "), (Ids{32, 32, 32}));  // one pre-token, no merges
  EXPECT_EQ(hand().encode("\n"), (Ids{10}));
  EXPECT_EQ(hand().decode(Ids{}), "");
}

TEST(tokenizer_hand, added_tokens_are_matched_first) {
  EXPECT_EQ(hand().encode("<|im_end|>"), (Ids{267}));
  EXPECT_EQ(hand().encode("<|im_start|>user\nhello<|im_end|>"), (Ids{266, 117, 115, 101, 114, 10, 259, 267}));
  EXPECT_EQ(hand().encode("<think></think>"), (Ids{268, 269}));
  EXPECT_EQ(hand().encode("<|im_end|><|im_end|>"), (Ids{267, 267}));
  // Half a special token is plain text: "<|", "im", "_end".
  EXPECT_EQ(hand().encode("<|im_end"), (Ids{60, 124, 105, 109, 95, 101, 110, 100}));
}

TEST(tokenizer_hand, normalized_added_tokens_match_after_nfc) {
  // normalized=false: matched in the raw text, so the combining mark stays outside.
  EXPECT_EQ(hand().encode("<think>\xCC\xB8"), (Ids{268, 204, 184}));
  // normalized=true: NFC turns ">" + U+0338 into U+226F first, so "<y>" is no longer there.
  EXPECT_EQ(hand().encode("<y>"), (Ids{270}));
  EXPECT_EQ(hand().encode("<y>\xCC\xB8"), (Ids{60, 121, 226, 137, 175}));
}

TEST(tokenizer_hand, nfc_before_bpe) {
  EXPECT_EQ(hand().encode("e\xCC\x81"), (Ids{195, 169}));
  EXPECT_EQ(hand().encode("e\xCC\x81"), hand().encode("\xC3\xA9"));
  EXPECT_EQ(hand().decode(hand().encode("e\xCC\x81")), "\xC3\xA9");
}

TEST(tokenizer_hand, invalid_utf8_input_is_replaced) {
  EXPECT_EQ(hand().encode("a\xFF"
                          "b"),
            (Ids{97, 239, 191, 189, 98}));
  EXPECT_EQ(hand().encode("a\xFF"
                          "b"),
            hand().encode("a\xEF\xBF\xBD"
                          "b"));
  EXPECT_EQ(hand().encode("\xE4\xB8"), (Ids{239, 191, 189}));
}

TEST(tokenizer_hand, four_byte_utf8) {
  EXPECT_EQ(hand().encode("🎉"), (Ids{0xF0, 0x9F, 0x8E, 0x89}));
  EXPECT_EQ(hand().decode(Ids{0xF0, 0x9F, 0x8E, 0x89}), "🎉");
}

TEST(tokenizer_hand, decode) {
  EXPECT_EQ(hand().decode(Ids{259, 264}), "hello world");
  EXPECT_EQ(hand().decode(Ids{266, 259, 267, 268}), "<|im_start|>hello<|im_end|><think>");
  EXPECT_EQ(hand().decode(Ids{195}), "\xEF\xBF\xBD");  // half a character
  EXPECT_EQ(hand().decode(Ids{195, 169}), "\xC3\xA9");
  EXPECT_EQ(hand().token_bytes(32), " ");
  EXPECT_EQ(hand().token_bytes(264), " world");
  EXPECT_EQ(hand().token_bytes(195), "\xC3");
  EXPECT_EQ(hand().token_bytes(267), "<|im_end|>");
}

TEST(tokenizer_hand, round_trip_is_nfc) {
  for (const std::string& text :
       std::vector<std::string>{"hello world", "  x\r\n\ty", "e\xCC\x81t\xC3\xA9", "🎉 你好 สวัสดี",
                                "<|im_start|>a<|im_end|>", "<|im_e", std::string("nul\0x", 5)}) {
    const std::string nfc = text == "e\xCC\x81t\xC3\xA9" ? "\xC3\xA9t\xC3\xA9" : text;
    EXPECT_EQ(hand().decode(hand().encode(text)), nfc);
  }
}

TEST(tokenizer_hand, metadata) {
  EXPECT_EQ(hand().vocab_size(), 271);
  EXPECT_EQ(hand().token_id("<|im_end|>"), 267);
  EXPECT_EQ(hand().token_id("<think>"), 268);
  EXPECT_EQ(hand().token_id("hello"), std::nullopt);  // only added tokens
  EXPECT_TRUE(hand().is_special(265));
  EXPECT_TRUE(hand().is_special(267));
  EXPECT_FALSE(hand().is_special(268));
  EXPECT_FALSE(hand().is_special(259));
  EXPECT_FALSE(hand().is_special(-1));
  EXPECT_FALSE(hand().is_special(100000));
}

TEST(tokenizer_hand, undefined_ids_throw) {
  EXPECT_THROW(hand().decode(Ids{271}), Error);
  EXPECT_THROW(hand().decode(Ids{-1}), Error);
  EXPECT_THROW(hand().token_bytes(100000), Error);
}

// An added token's id is bounded like model.vocab's (0 .. 2^30): a negative one used to index
// the id tables, a float or a string threw nlohmann's own exception.
TEST(tokenizer_hand, bad_added_token_ids_are_refused) {
  for (const nlohmann::json& id :
       {nlohmann::json(-5), nlohmann::json(1 << 30), nlohmann::json(2.5), nlohmann::json("7")}) {
    nlohmann::json j = test::hand_tokenizer_json(false);
    j["added_tokens"][0]["id"] = id;
    const std::string path = test::write_temp_json(j, "bad_added_id.json");
    try {
      Tokenizer::load(path);
      ADD_FAILURE() << "added token id " << id.dump() << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has a bad id " + id.dump()), std::string::npos) << e.what();
    }
  }
  nlohmann::json not_a_list = test::hand_tokenizer_json(false);
  not_a_list["added_tokens"] = {{"id", 3}};
  EXPECT_THROW(Tokenizer::load(test::write_temp_json(not_a_list, "bad_added_list.json")), Error);
}

TEST(tokenizer_streaming, never_emits_half_a_character) {
  const std::string text = "hé🎉 world 你好!";
  const Ids ids = hand().encode(text);
  StreamingDecoder decoder(hand());
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = decoder.push(id);
    EXPECT_EQ(unicode::utf8_lossy(piece), piece) << "partial UTF-8 emitted";
    streamed += piece;
    EXPECT_EQ(text.compare(0, streamed.size(), streamed), 0);
  }
  streamed += decoder.flush();
  EXPECT_EQ(streamed, text);
}

TEST(tokenizer_streaming, holds_back_then_flushes_as_replacement) {
  StreamingDecoder decoder(hand());
  EXPECT_EQ(decoder.push(0xF0), "");
  EXPECT_EQ(decoder.push(0x9F), "");
  EXPECT_EQ(decoder.push(0x8E), "");
  EXPECT_EQ(decoder.push(0x89), "🎉");
  EXPECT_EQ(decoder.push(0xE4), "");
  EXPECT_EQ(decoder.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(decoder.flush(), "");
  // A byte that can never complete is emitted (as U+FFFD) at once, like decode() does.
  EXPECT_EQ(decoder.push(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(decoder.push(0xE4), "");
  EXPECT_EQ(decoder.push('a'), "\xEF\xBF\xBD"
                               "a");
}

TEST(tokenizer_streaming, matches_decode_on_every_byte_sequence) {
  // Random byte ids: streaming output must always equal decode() of the same ids.
  uint32_t state = 12345;
  for (int round = 0; round < 200; ++round) {
    Ids ids;
    for (int i = 0; i < 12; ++i) {
      state = state * 1664525u + 1013904223u;
      const uint32_t r = state >> 24;
      ids.push_back(r < 64 ? int32_t(0x80 + (r & 0x3F)) : r < 128 ? int32_t(0xC0 + (r & 0x3F)) : int32_t(r & 0x7F));
    }
    StreamingDecoder decoder(hand());
    std::string streamed;
    for (int32_t id : ids) streamed += decoder.push(id);
    streamed += decoder.flush();
    EXPECT_EQ(streamed, hand().decode(ids)) << "round " << round;
  }
}

TEST(tokenizer_hand, concurrent_encode_is_consistent) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "hello world " + std::to_string(i) + " héllo<|im_end|> ";
  const Ids expected = hand().encode(text);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      Tokenizer copy = hand();  // copies share the tables
      for (int i = 0; i < 20; ++i) mismatches += copy.encode(text) != expected;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(tokenizer_load, errors_name_the_file_and_the_field) {
  try {
    Tokenizer::load("/nonexistent/tokenizer.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos) << e.what();
  }
  auto expect_error = [](nlohmann::json j, const std::string& needle) {
    const std::string path = test::write_temp_json(j, "bad.json");
    try {
      Tokenizer::load(path);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto j = test::hand_tokenizer_json(false);
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error(j, "normalizer");
  j = test::hand_tokenizer_json(false);
  j["model"]["merges"].push_back("hello zzz");
  expect_error(j, "model.merges[9]");
  j = test::hand_tokenizer_json(false);
  j["model"]["byte_fallback"] = true;
  expect_error(j, "byte_fallback");
  j = test::hand_tokenizer_json(false);
  j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true;
  expect_error(j, "use_regex");
  j = test::hand_tokenizer_json(false);
  j["model"]["vocab"].erase(test::byte_symbol(' '));
  expect_error(j, "byte 0x20");
}

TEST(tokenizer_hand, ignore_merges_uses_whole_word_tokens) {
  auto j = test::hand_tokenizer_json(false);
  j["model"]["ignore_merges"] = true;
  j["model"]["vocab"]["wor"] = 271;  // a token no merge produces
  const Tokenizer t = Tokenizer::load(test::write_temp_json(j, "ignore_merges.json"));
  EXPECT_EQ(t.encode("wor"), (Ids{271}));
  EXPECT_EQ(t.encode("world"), (Ids{119, 261, 263}));
  EXPECT_EQ(hand().encode("wor"), (Ids{119, 261}));
}

std::string run_shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  return out;
}

TEST(tokenizer_cli, tokenize_and_detokenize) {
  if (!std::filesystem::exists(LILY_BINARY)) GTEST_SKIP() << "lily binary not built";
  const auto dir = std::filesystem::path(test::write_temp_json(test::hand_tokenizer_json(false), "cli/tokenizer.json"))
                       .parent_path();
  const std::string lily = std::string(LILY_BINARY) + " ";
  EXPECT_EQ(run_shell("printf 'hello world<|im_end|>' | " + lily + "tokenize -m " + dir.string()), "259 264 267\n");
  EXPECT_EQ(run_shell("echo '259, 264 267' | " + lily + "detokenize -m " + dir.string()), "hello world<|im_end|>");
  EXPECT_EQ(run_shell("echo 9999 | " + lily + "detokenize -m " + dir.string() + " 2>&1; echo \"rc=$?\""),
            "error: token id 9999 is not defined by this tokenizer (vocab size 271)\nrc=1\n");
}

}  // namespace
}  // namespace lily
