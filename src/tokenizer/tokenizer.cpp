// tokenizer.cpp: encode / decode over the tables that tokenizer_json.cpp or tokenizer_ggml.cpp builds.
#include "tokenizer/tokenizer.h"

#include "base/error.h"
#include "base/mapped_file.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace lily {

Tokenizer Tokenizer::load(const std::string& tokenizer_json_path) {
  return with_context("loading tokenizer " + tokenizer_json_path, [&] {
    MappedFile file(tokenizer_json_path);
    const auto bytes = file.bytes();
    return Tokenizer(parse_tokenizer_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  });
}

Tokenizer Tokenizer::load_from_model_dir(const std::string& dir) { return load(dir + "/tokenizer.json"); }

Tokenizer Tokenizer::from_ggml(const GgmlVocabulary& vocabulary, const std::string& source) {
  return with_context("the tokenizer of " + source, [&] { return Tokenizer(build_from_ggml(vocabulary)); });
}

// One pre-token -> ids, through the cache.
void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kCacheMaxWordBytes) {
    bpe.encode_word(piece, out);
    return;
  }
  thread_local std::string key;
  key.assign(piece);
  {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(key); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bpe.encode_word(piece, out);
  std::lock_guard lock(cache_mutex);
  if (cache.size() < kCacheCapacity) {
    cache.emplace(key, std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

// A stretch of raw text with no normalized=false added token in it: NFC, then the
// normalized=true added tokens, then the split regex and BPE.
void Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<int32_t>& out) const {
  const std::string normalized = nfc ? unicode::nfc(text) : std::string(text);
  thread_local std::vector<std::string_view> pieces;
  auto encode_stretch = [&](std::string_view stretch) {
    if (!split) {
      encode_piece(stretch, out);
      return;
    }
    pieces.clear();
    split->split(stretch, pieces);
    for (std::string_view piece : pieces) encode_piece(piece, out);
  };
  if (normalized_added.empty()) {
    encode_stretch(normalized);
    return;
  }
  normalized_added.split(normalized, [&](std::string_view stretch, int32_t id) {
    if (id >= 0) {
      out.push_back(id);
    } else {
      encode_stretch(stretch);
    }
  });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::utf8_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->raw_added.split(text, [&](std::string_view stretch, int32_t id) {
    if (id >= 0) {
      out.push_back(id);
    } else {
      impl_->encode_normalized(stretch, out);
    }
  });
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  LILY_CHECK(id >= 0 && id < vocab_size() && impl_->id_kind[id] != Impl::Kind::undefined,
             "token id {} is not defined by this tokenizer (vocab size {})", id, vocab_size());
  return impl_->id_bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    LILY_CHECK(id >= 0 && id < vocab_size() && impl_->id_kind[id] != Impl::Kind::undefined,
               "token id {} is not defined by this tokenizer (vocab size {})", id, vocab_size());
    bytes += impl_->id_bytes[id];
  }
  return unicode::utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view added_token_content) const {
  auto it = impl_->added_by_content.find(std::string(added_token_content));
  if (it == impl_->added_by_content.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_kind.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_kind[id] == Impl::Kind::added_special;
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

std::string StreamingDecoder::push(int32_t id) {
  pending_ += tokenizer_.token_bytes(id);
  // Everything except an unfinished trailing character is final: the held-back tail starts with a
  // lead byte, so no sequence of the emitted part can extend into it.
  const size_t keep = unicode::utf8_incomplete_tail(pending_);
  std::string text = unicode::utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return text;
}

std::string StreamingDecoder::flush() {
  std::string text = unicode::utf8_lossy(pending_);
  pending_.clear();
  return text;
}

}  // namespace lily
