// added_tokens.h: finds added-token strings in text, leftmost first, then longest (HF uses an
// Aho-Corasick automaton with MatchKind::LeftmostLongest; with a few dozen tokens a first-byte
// index and direct comparison give the same answer).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lily {

class AddedTokenMatcher {
 public:
  void add(std::string pattern, int32_t id);  // empty patterns are ignored, as HF does
  bool empty() const { return patterns_.empty(); }

  // Calls fn(piece, id) for consecutive stretches covering `text`: id >= 0 for a matched added
  // token, id = -1 for the text between matches. Nothing is called for empty text.
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const {
    size_t start = 0;  // start of the current unmatched stretch
    size_t pos = 0;
    while (pos < text.size()) {
      const auto& candidates = by_first_byte_[static_cast<unsigned char>(text[pos])];
      const Pattern* hit = nullptr;
      for (uint32_t index : candidates) {  // longest first
        const Pattern& p = patterns_[index];
        if (text.compare(pos, p.text.size(), p.text) == 0) {
          hit = &p;
          break;
        }
      }
      if (!hit) {
        ++pos;
        continue;
      }
      if (pos > start) fn(text.substr(start, pos - start), int32_t{-1});
      fn(text.substr(pos, hit->text.size()), hit->id);
      pos += hit->text.size();
      start = pos;
    }
    if (start < text.size()) fn(text.substr(start), int32_t{-1});
  }

 private:
  struct Pattern {
    std::string text;
    int32_t id;
  };
  std::vector<Pattern> patterns_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // indices into patterns_, longest first
};

}  // namespace lily
