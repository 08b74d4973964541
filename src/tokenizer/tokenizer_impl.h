// tokenizer_impl.h: the tables behind lily::Tokenizer (private to src/tokenizer/).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace lily {

struct Tokenizer::Impl {
  enum class Kind : uint8_t { undefined, bpe, added, added_special };

  BpeModel bpe;
  std::unique_ptr<SplitPretokenizer> split;  // null: the whole stretch is one pre-token
  bool nfc = false;

  AddedTokenMatcher raw_added;         // normalized=false: matched before NFC
  AddedTokenMatcher normalized_added;  // normalized=true: matched on the NFC text
  std::unordered_map<std::string, int32_t> added_by_content;

  std::vector<std::string> id_bytes;  // [vocab_size] what each id decodes to
  std::vector<Kind> id_kind;          // [vocab_size]

  // Per-pre-token cache (HF caches too). Bounded; once full, new words are not added.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, std::vector<int32_t>& out) const;
};

// Parses tokenizer.json text (tokenizer_json.cpp). Throws lily::Error.
std::shared_ptr<Tokenizer::Impl> parse_tokenizer_json(std::string_view json_text);

}  // namespace lily
