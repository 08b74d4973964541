// test_pretokenizer.cpp: the Qwen3.5 split regex (spec §1.2) on PCRE2, piece by piece.
// Expected pieces worked out by hand from the ordered alternation of the pattern.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/pretokenizer.h"

namespace lily {
namespace {

std::vector<std::string> split(std::string_view text) {
  static const SplitPretokenizer splitter(kQwen35SplitPattern);
  std::vector<std::string_view> pieces;
  splitter.split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

using V = std::vector<std::string>;

TEST(tokenizer_split_regex, words_and_spaces) {
  EXPECT_EQ(split(""), V{});
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(split("   "), (V{"   "}));
  EXPECT_EQ(split("x   "), (V{"x", "   "}));
  EXPECT_EQ(split("\tx"), (V{"\tx"}));  // the optional lead char admits a tab
}

TEST(tokenizer_split_regex, contractions_are_case_insensitive) {
  EXPECT_EQ(split("I'M here"), (V{"I", "'M", " here"}));
  EXPECT_EQ(split("we'LL"), (V{"we", "'LL"}));
  EXPECT_EQ(split("it's"), (V{"it", "'s"}));
  EXPECT_EQ(split("'Re'vE"), (V{"'Re", "'vE"}));
  EXPECT_EQ(split("'x"), (V{"'x"}));  // not a contraction: lead char + letters
}

TEST(tokenizer_split_regex, digits_one_by_one) {
  EXPECT_EQ(split("123"), (V{"1", "2", "3"}));
  EXPECT_EQ(split("3\xC2\xBD"), (V{"3", "\xC2\xBD"}));  // ½ is \p{N} (No)
  EXPECT_EQ(split("a1"), (V{"a", "1"}));
  EXPECT_EQ(split(" 1"), (V{" ", "1"}));
}

TEST(tokenizer_split_regex, newlines_and_punctuation) {
  EXPECT_EQ(split("a \n\n b"), (V{"a", " \n\n", " b"}));
  EXPECT_EQ(split("a\r\n\r\nb"), (V{"a", "\r\n\r\n", "b"}));
  EXPECT_EQ(split("hello!!!\n\nworld"), (V{"hello", "!!!\n\n", "world"}));
  EXPECT_EQ(split("a ?\n"), (V{"a", " ?\n"}));
  EXPECT_EQ(split("<|im_end"), (V{"<|", "im", "_end"}));
}

TEST(tokenizer_split_regex, marks_stick_to_letters) {
  // Thai: vowel signs and tone marks are \p{M}; with the Qwen3 regex they would split the word.
  EXPECT_EQ(split("สวัสดีครับ ผม"), (V{"สวัสดีครับ", " ผม"}));
  EXPECT_EQ(split("e\xCC\x81x"), (V{"e\xCC\x81x"}));
  EXPECT_EQ(split("1\xCC\x81"), (V{"1", "\xCC\x81"}));
  EXPECT_EQ(split("!\xCC\x81"), (V{"!\xCC\x81"}));  // lead char + mark run
}

TEST(tokenizer_split_regex, white_space_is_the_unicode_property) {
  // U+0085 (NEL) is White_Space (Oniguruma's \s) but not in PCRE2's UCP \s: the rewrite matters.
  EXPECT_EQ(split("x\xC2\x85\xC2\x85y"), (V{"x", "\xC2\x85", "\xC2\x85y"}));
  // U+00A0 and U+3000 are spaces; U+200B (Cf) is not.
  EXPECT_EQ(split("a\xC2\xA0\xC2\xA0"
                  "b"),
            (V{"a", "\xC2\xA0",
               "\xC2\xA0"
               "b"}));
  EXPECT_EQ(split("a\xE2\x80\x8B\xE2\x80\x8B"
                  "b"),
            (V{"a", "\xE2\x80\x8B\xE2\x80\x8B", "b"}));
}

TEST(tokenizer_split_regex, pieces_cover_the_input) {
  const std::string text = "Mixed: 你好 мир 🎉\r\n\t 123 it's <tag> e\xCC\x81 \xC2\x85 end";
  std::string joined;
  for (const auto& p : split(text)) {
    EXPECT_FALSE(p.empty());
    joined += p;
  }
  EXPECT_EQ(joined, text);
}

TEST(tokenizer_split_regex, long_runs_do_not_blow_the_stack) {
  const std::string letters(1 << 20, 'a');
  EXPECT_EQ(split(letters), (V{letters}));
  const std::string spaces = std::string(200000, ' ') + "x";
  EXPECT_EQ(split(spaces), (V{std::string(199999, ' '), " x"}));
  std::string punct(100000, '!');
  EXPECT_EQ(split(punct), (V{punct}));
}

}  // namespace
}  // namespace lily
