// tokenizer.h: the Qwen3.5/3.6 tokenizer, read from the model directory's tokenizer.json, or
// from a GGUF's own vocabulary (tokenizer.ggml.*, ggml_vocabulary.h) when none is beside it.
//
// Pipeline (HF `tokenizers` semantics, spec tokenizer-chat-api.md §1.1):
//   1. added tokens with normalized=false are matched as whole strings in the raw text
//      (leftmost, then longest), special or not, as HF does by default;
//   2. each remaining stretch is NFC-normalized, then added tokens with normalized=true are matched;
//   3. each remaining stretch is split by the pre-tokenizer regex (PCRE2, UTF + UCP);
//   4. each piece is byte-level BPE encoded (a per-piece cache makes repeats cheap).
// No BOS or other token is ever added.
//
// Invalid UTF-8 in the input of encode(): each maximal invalid subpart is replaced by U+FFFD
// before step 1 (HF only ever sees valid Unicode, so this is our rule, and it is the rule
// Python's bytes.decode(errors="replace") uses). decode() does the same to its output bytes,
// like HF. Ids that are not defined (out of range, or in a gap of the vocabulary) throw.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/ggml_vocabulary.h"

namespace lily {

class Tokenizer {
 public:
  // Reads a HF tokenizer.json. Throws lily::Error naming the file and what is wrong or unsupported.
  static Tokenizer load(const std::string& tokenizer_json_path);
  // DIR/tokenizer.json.
  static Tokenizer load_from_model_dir(const std::string& dir);
  // From a GGUF's tokenizer.ggml.* vocabulary (tokenizer_ggml.cpp): byte-level BPE ("gpt2")
  // with a Qwen pre-tokenizer ("qwen35", "qwen2"); anything else is refused. Throws lily::Error
  // naming `source` (the file) and the key that is wrong.
  static Tokenizer from_ggml(const GgmlVocabulary& vocabulary, const std::string& source);

  // Text -> ids. Added-token strings in the text become their ids (HF default).
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids -> text. Added tokens decode to their content; bytes that are not valid UTF-8 -> U+FFFD.
  std::string decode(std::span<const int32_t> ids) const;
  // Raw bytes of one token (may be part of a UTF-8 character).
  std::string token_bytes(int32_t id) const;
  // Id of an added token, e.g. "<|im_end|>"; nullopt when there is none with that content.
  std::optional<int32_t> token_id(std::string_view added_token_content) const;
  // Number of ids defined: 1 + the largest id of the BPE vocabulary and the added tokens.
  int32_t vocab_size() const;
  // True for an added token with special=true.
  bool is_special(int32_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  // Shared, immutable tables (plus an internally locked cache): copies are cheap and
  // concurrent const use from many threads is safe.
  std::shared_ptr<const Impl> impl_;
};

// Incremental decoder for streaming: push ids, get back only complete UTF-8 characters.
// The concatenation of every push() and the final flush() equals tokenizer.decode(all ids).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer);
  // Text that became complete with this token (may be empty).
  std::string push(int32_t id);
  // Whatever is left; an unfinished character becomes U+FFFD. The decoder is then empty.
  std::string flush();

 private:
  Tokenizer tokenizer_;
  std::string pending_;  // bytes that do not yet form complete characters
};

}  // namespace lily
