// test_unicode.cpp: UTF-8 repair (maximal subparts), unfinished tails, NFC, the byte-level table.
#include <gtest/gtest.h>

#include <set>

#include "tokenizer/unicode.h"

namespace lily::unicode {
namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(tokenizer_utf8, valid_input_is_unchanged) {
  for (const std::string& s :
       std::vector<std::string>{"", "abc", "é", "你好", "🎉", std::string("a\0b", 3), "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(is_valid_utf8(s)) << s;
    EXPECT_EQ(utf8_lossy(s), s);
  }
}

// Expected values are Python's bytes.decode("utf-8", errors="replace") (= Rust from_utf8_lossy).
TEST(tokenizer_utf8, maximal_subparts_become_one_replacement_each) {
  EXPECT_EQ(utf8_lossy("\xFF"), kFFFD);
  EXPECT_EQ(utf8_lossy("a\xFF"
                       "b"),
            "a" + kFFFD + "b");
  EXPECT_EQ(utf8_lossy("\xE4\xB8"), kFFFD);  // cut off at the end: one
  EXPECT_EQ(utf8_lossy("\xE4\xB8z"), kFFFD + "z");
  EXPECT_EQ(utf8_lossy("\xE0\x80"), kFFFD + kFFFD);                          // E0 needs A0..BF next
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);              // surrogate
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), kFFFD + kFFFD);                          // overlong
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), kFFFD + kFFFD + kFFFD + kFFFD);  // > U+10FFFF
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x8E"), kFFFD);
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x8E\xF0\x9F\x8E\x89"), kFFFD + "🎉");
  EXPECT_EQ(utf8_lossy("\x80\x80"), kFFFD + kFFFD);
  EXPECT_FALSE(is_valid_utf8("\xC3"));
}

TEST(tokenizer_utf8, incomplete_tail) {
  EXPECT_EQ(utf8_incomplete_tail(""), 0u);
  EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xC3"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x8E"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x8E\x89"), 0u);  // complete
  EXPECT_EQ(utf8_incomplete_tail("a\xB8"), 0u);             // stray continuation: not pending
  EXPECT_EQ(utf8_incomplete_tail("\xE0\x80"), 0u);          // can never complete
  EXPECT_EQ(utf8_incomplete_tail("\xFF"), 0u);
}

TEST(tokenizer_nfc, composes_and_keeps_nul) {
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");                       // e + U+0301 -> é
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "각");  // Hangul jamo -> syllable
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");                    // U+212B ANGSTROM SIGN -> Å
  EXPECT_EQ(nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");    // U+0958: composition exclusion
  EXPECT_EQ(nfc(std::string("a\0e\xCC\x81", 5)), std::string("a\0\xC3\xA9", 4));
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
}

TEST(tokenizer_byte_level, table_is_a_bijection_with_the_gpt2_layout) {
  const auto& t = byte_to_codepoint();
  EXPECT_EQ(t[' '], 0x120u);   // Ġ
  EXPECT_EQ(t['\n'], 0x10Au);  // Ċ
  EXPECT_EQ(t['!'], uint32_t('!'));
  EXPECT_EQ(t[0xAD], 0x143u);  // soft hyphen is not printable: the last remapped byte
  EXPECT_EQ(t[0], 0x100u);
  std::set<uint32_t> seen(t.begin(), t.end());
  EXPECT_EQ(seen.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(byte_of_codepoint(t[b]), b);
  EXPECT_EQ(byte_of_codepoint(0x4F60), -1);
}

}  // namespace
}  // namespace lily::unicode
