// unicode.cpp: UTF-8 validation with the maximal-subpart replacement rule, NFC, byte-level table.
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "base/error.h"

namespace lily::unicode {
namespace {

enum class Seq { ok, invalid, truncated };

// Examines the UTF-8 sequence starting at p[0] (n >= 1 bytes available). Sets `len` to the
// sequence length (ok), the maximal invalid subpart length (invalid, >= 1), or n (truncated:
// a valid prefix that the input ends inside). Table 3-7 of the Unicode standard.
Seq scan_sequence(const uint8_t* p, size_t n, size_t& len) {
  const uint8_t b0 = p[0];
  if (b0 < 0x80) {
    len = 1;
    return Seq::ok;
  }
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    len = 1;  // continuation byte, C0, C1, F5..FF
    return Seq::invalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) {
      len = n;
      return Seq::truncated;
    }
    const uint8_t b = p[i];
    const bool good = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!good) {
      len = i;
      return Seq::invalid;
    }
  }
  len = need;
  return Seq::ok;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0, n = bytes.size();
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    if (scan_sequence(p + i, n - i, len) != Seq::ok) return false;
    i += len;
  }
  return true;
}

std::string utf8_lossy(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  std::string out;
  out.reserve(bytes.size() + 8);
  size_t i = 0, n = bytes.size();
  while (i < n) {
    size_t len;
    if (scan_sequence(p + i, n - i, len) == Seq::ok) {
      out.append(bytes.substr(i, len));
    } else {
      out.append(kReplacement);  // an invalid subpart, or a sequence cut off by the end
    }
    i += len;
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  // An unfinished sequence is at most 3 bytes and starts with a lead byte.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = p[n - back];
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: look further back
    size_t len;
    return scan_sequence(p + n - back, back, len) == Seq::truncated ? back : 0;
  }
  return 0;
}

std::string nfc(std::string_view utf8) {
  bool ascii = true;
  for (unsigned char c : utf8) ascii &= c < 0x80;
  if (ascii) return std::string(utf8);
  utf8proc_uint8_t* out = nullptr;
  // An explicit length (no UTF8PROC_NULLTERM), so U+0000 inside the text is kept.
  const utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                                            static_cast<utf8proc_ssize_t>(utf8.size()), &out,
                                            utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  LILY_CHECK(len >= 0, "NFC normalization failed: {}", utf8proc_errmsg(len));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(len));
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// GPT-2 bytes_to_unicode: bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF map to themselves; the other
// 68 bytes map to U+0100, U+0101, ... in increasing byte order.
const std::array<uint32_t, 256>& byte_to_codepoint() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

int byte_of_codepoint(uint32_t cp) {
  static const std::array<int16_t, 512> inverse = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    const auto& fwd = byte_to_codepoint();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = int16_t(b);
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace lily::unicode
