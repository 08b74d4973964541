// byte_vocabulary.h: the grammar tests' vocabulary of the 256 single bytes and a stop token
// (id 256), so every byte string is one path of tokens.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "grammar/vocabulary.h"

namespace lily::test {

inline std::shared_ptr<const grammar::Vocabulary> byte_vocabulary() {
  static auto v = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, char(b));
    tokens.emplace_back("<|im_end|>");
    const int32_t stop = 256;
    return std::make_shared<const grammar::Vocabulary>(std::move(tokens), std::span<const int32_t>{},
                                                       std::span<const int32_t>(&stop, 1));
  }();
  return v;
}

}  // namespace lily::test
