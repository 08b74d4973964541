// tokenizer_ggml.cpp: lily's tokenizer from a GGUF's own vocabulary (ggml_vocabulary.h), for a
// GGUF with no tokenizer.json beside it. The result encodes and decodes as the tokenizer.json it
// was converted from (tests/model/test_gguf_tokenizer.cpp): the BPE vocabulary and merges are the
// same, the added tokens are matched in the raw text as Qwen's (normalized=false) are, and NFC
// and the split regex come from tokenizer.ggml.pre. Only the special flag can differ: llama.cpp's
// converter types a non-special added token that looks special ("<|fim_pad|>") CONTROL.
#include <unordered_map>

#include "base/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace lily {
namespace {

using Kind = Tokenizer::Impl::Kind;
using Vocab = std::unordered_map<std::string, int32_t>;

constexpr size_t kMaxTokens = size_t(1) << 30;  // the bound tokenizer.json ids have

// The split pattern of a tokenizer.ggml.pre lily implements. Both Qwen tokenizer.json files
// normalize with NFC before it.
const char* split_pattern(const std::string& pre) {
  if (pre == "qwen35") return kQwen35SplitPattern;
  if (pre == "qwen2") return kQwen2SplitPattern;
  if (pre.empty())
    fail("tokenizer.ggml.pre is missing: lily implements the pre-tokenizers 'qwen35' and 'qwen2' (llama.cpp would "
         "fall back to GPT-2's, which is not this model's)");
  fail("tokenizer.ggml.pre '{}' is not supported: lily implements 'qwen35' and 'qwen2'", pre);
}

GgmlTokenType token_type(const GgmlVocabulary& v, size_t id) {
  if (v.token_types.empty()) return GgmlTokenType::normal;
  const int32_t t = v.token_types[id];
  if (t < 0 || t > int32_t(GgmlTokenType::byte))
    fail("tokenizer.ggml.token_type[{}] is {}, not a token type (0..6)", id, t);
  return GgmlTokenType(t);
}

// One id's entry in the tables: NORMAL tokens are the BPE vocabulary (byte-level text);
// CONTROL and USER_DEFINED ones are added tokens matched in the raw text; UNUSED ids ("[PAD7]")
// stay undefined. The rest have no meaning in a byte-level BPE.
void read_token(const GgmlVocabulary& v, size_t id, Tokenizer::Impl& impl, Vocab& vocab, Vocab& added) {
  const std::string& text = v.tokens[id];
  const GgmlTokenType type = token_type(v, id);
  if (type == GgmlTokenType::unused) return;
  if (text.empty()) fail("tokenizer.ggml.tokens[{}] is empty", id);
  if (!unicode::is_valid_utf8(text)) fail("tokenizer.ggml.tokens[{}] is not valid UTF-8", id);
  const auto i = int32_t(id);
  switch (type) {
    case GgmlTokenType::normal: {
      auto [it, inserted] = vocab.emplace(text, i);
      if (!inserted) fail("tokenizer.ggml.tokens[{}] '{}' repeats tokens[{}]", id, text, it->second);
      impl.id_bytes[id] = byte_level_decode(text, nullptr);
      impl.id_kind[id] = Kind::bpe;
      return;
    }
    case GgmlTokenType::control:
    case GgmlTokenType::user_defined: {
      auto [it, inserted] = added.emplace(text, i);
      if (!inserted) fail("tokenizer.ggml.tokens[{}] '{}' repeats tokens[{}]", id, text, it->second);
      impl.raw_added.add(text, i);
      impl.added_by_content[text] = i;
      impl.id_bytes[id] = byte_level_decode(text, nullptr);
      impl.id_kind[id] = type == GgmlTokenType::control ? Kind::added_special : Kind::added;
      return;
    }
    default:
      fail("tokenizer.ggml.tokens[{}] '{}' has token type {} ({}), which a byte-level BPE does not use", id, text,
           int32_t(type), type == GgmlTokenType::byte ? "BYTE: SentencePiece byte fallback" : "UNKNOWN or UNDEFINED");
  }
}

// The 256 single-byte tokens every byte-level BPE starts from.
void read_byte_tokens(const Vocab& vocab, BpeModel& bpe) {
  const auto& to_cp = unicode::byte_to_codepoint();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    unicode::append_utf8(symbol, to_cp[b]);
    auto it = vocab.find(symbol);
    if (it == vocab.end()) fail("tokenizer.ggml.tokens: byte 0x{:02X} (token '{}') is missing", b, symbol);
    bpe.byte_token[b] = it->second;
  }
}

// "left right" in rank order; left, right and left+right all NORMAL tokens.
void read_merges(const std::vector<std::string>& merges, const Vocab& vocab, BpeModel& bpe) {
  if (merges.empty()) fail("tokenizer.ggml.merges is missing or empty: a byte-level BPE needs its merges");
  bpe.merges.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& s = merges[rank];
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
      fail("tokenizer.ggml.merges[{}] '{}' is not two tokens separated by one space", rank, s);
    auto lookup = [&](const std::string& token) {
      auto it = vocab.find(token);
      if (it == vocab.end())
        fail("tokenizer.ggml.merges[{}] '{}': '{}' is not a token of tokenizer.ggml.tokens", rank, s, token);
      return it->second;
    };
    const std::string left = s.substr(0, space), right = s.substr(space + 1);
    const int32_t left_id = lookup(left), right_id = lookup(right), result = lookup(left + right);
    // Later duplicates overwrite earlier ones, as tokenizer.json's do.
    bpe.merges[BpeModel::pair_key(left_id, right_id)] = BpeMerge{int32_t(rank), result};
  }
}

}  // namespace

std::shared_ptr<Tokenizer::Impl> build_from_ggml(const GgmlVocabulary& v) {
  if (v.model != "gpt2")
    fail("tokenizer.ggml.model '{}' is not supported: lily reads byte-level BPE ('gpt2'), the Qwen tokenizer", v.model);
  if (v.tokens.empty()) fail("tokenizer.ggml.tokens is missing or empty");
  if (v.tokens.size() > kMaxTokens) fail("tokenizer.ggml.tokens holds {} tokens, more than 2^30", v.tokens.size());
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size())
    fail("tokenizer.ggml.token_type has {} entries for {} tokens", v.token_types.size(), v.tokens.size());
  auto impl = std::make_shared<Tokenizer::Impl>();
  impl->nfc = true;
  impl->split = std::make_unique<SplitPretokenizer>(split_pattern(v.pre));
  impl->id_kind.assign(v.tokens.size(), Kind::undefined);
  impl->id_bytes.assign(v.tokens.size(), std::string());
  Vocab vocab, added;
  vocab.reserve(v.tokens.size());
  for (size_t id = 0; id < v.tokens.size(); ++id) read_token(v, id, *impl, vocab, added);
  read_byte_tokens(vocab, impl->bpe);
  read_merges(v.merges, vocab, impl->bpe);
  // The ids tokenizer.json defines: the [PAD] ids llama.cpp fills up to the model's rows with
  // are not tokens.
  size_t n = impl->id_kind.size();
  while (n > 0 && impl->id_kind[n - 1] == Kind::undefined) --n;
  impl->id_kind.resize(n);
  impl->id_bytes.resize(n);
  return impl;
}

}  // namespace lily
