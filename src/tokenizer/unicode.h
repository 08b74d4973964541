// unicode.h: the UTF-8 and Unicode helpers the tokenizer needs (spec tokenizer-chat-api.md §1).
//
// Invalid UTF-8 follows one rule everywhere (decode, streaming decode, and encode input): each
// maximal invalid subpart becomes one U+FFFD, the rule of Rust's String::from_utf8_lossy (what HF
// `tokenizers` decode uses), Python's errors="replace" and the WHATWG encoding standard.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lily::unicode {

// True when `bytes` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view bytes);

// `bytes` with each maximal invalid subpart replaced by U+FFFD ("\xEF\xBF\xBD").
std::string utf8_lossy(std::string_view bytes);

// Length of the trailing bytes of `bytes` that form a valid but unfinished UTF-8 sequence
// (0..3): more bytes could still complete them. Used by the streaming decoder.
size_t utf8_incomplete_tail(std::string_view bytes);

// Unicode NFC of valid UTF-8 (utf8proc; an all-ASCII string is returned as is).
std::string nfc(std::string_view utf8);

// Appends code point `cp` as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

// GPT-2 byte-level mapping (spec §1.3): every byte has a printable code point; space -> U+0120.
const std::array<uint32_t, 256>& byte_to_codepoint();
// Inverse of byte_to_codepoint: -1 for code points that are not the image of a byte.
int byte_of_codepoint(uint32_t cp);

}  // namespace lily::unicode
