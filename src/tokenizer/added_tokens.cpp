// added_tokens.cpp: building the first-byte index of the added-token matcher.
#include "tokenizer/added_tokens.h"

#include <algorithm>

namespace lily {

void AddedTokenMatcher::add(std::string pattern, int32_t id) {
  if (pattern.empty()) return;
  const auto first = static_cast<unsigned char>(pattern[0]);
  patterns_.push_back({std::move(pattern), id});
  auto& bucket = by_first_byte_[first];
  bucket.push_back(uint32_t(patterns_.size() - 1));
  // Longest first, so the first hit at a position is the longest match there.
  std::stable_sort(bucket.begin(), bucket.end(),
                   [this](uint32_t a, uint32_t b) { return patterns_[a].text.size() > patterns_[b].text.size(); });
}

}  // namespace lily
