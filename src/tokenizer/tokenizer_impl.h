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
#include "tokenizer/ggml_vocabulary.h"
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

// The tables of a GGUF's tokenizer.ggml.* vocabulary (tokenizer_ggml.cpp). Throws lily::Error.
std::shared_ptr<Tokenizer::Impl> build_from_ggml(const GgmlVocabulary& vocabulary);

// HF's ByteLevel decoder: a token whose every character is a byte-level character decodes to
// those bytes; any other token decodes to its own UTF-8 text. `all_mapped` (optional) says which.
std::string byte_level_decode(std::string_view token, bool* all_mapped);

}  // namespace lily
