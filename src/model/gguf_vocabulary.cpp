// gguf_vocabulary.cpp: tokenizer.ggml.* out of a GGUF's metadata (gguf_vocabulary.h has the keys).
#include "model/gguf_vocabulary.h"

#include <algorithm>

#include "base/error.h"

namespace lily {
namespace {

using Metadata = std::map<std::string, GgufValue>;

const GgufValue* find(const Metadata& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

// Runs `read` on the value of `key` when present, its errors prefixed with the key.
template <typename Fn>
void with_key(const Metadata& m, const std::string& key, Fn&& read) {
  if (const GgufValue* v = find(m, key)) with_context(fmt::format("metadata '{}'", key), [&] { read(*v); });
}

std::vector<int32_t> token_types(const GgufValue& v, size_t n_tokens) {
  const std::vector<int64_t> types = v.int_array();
  if (types.size() != n_tokens) fail("has {} entries for {} tokens", types.size(), n_tokens);
  std::vector<int32_t> out(types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] < 0 || types[i] > int64_t(GgmlTokenType::byte))
      fail("entry {} is {}, not a token type (0..6)", i, types[i]);
    out[i] = int32_t(types[i]);
  }
  return out;
}

// The special-token ids must name tokens: llama.cpp indexes its vocabulary with them.
void check_special_ids(const Metadata& m, size_t n_tokens) {
  for (const char* name : {"bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask"}) {
    with_key(m, fmt::format("tokenizer.ggml.{}_token_id", name), [&](const GgufValue& v) {
      const int64_t id = v.as_int();
      if (id < 0 || uint64_t(id) >= n_tokens)
        fail("{} is not a token id (tokenizer.ggml.tokens holds {})", id, n_tokens);
    });
  }
  for (const char* name : {"add_bos_token", "add_eos_token"})
    with_key(m, fmt::format("tokenizer.ggml.{}", name), [](const GgufValue& v) { v.as_bool(); });
  with_key(m, "tokenizer.chat_template", [](const GgufValue& v) { v.as_string(); });
}

// The id of the added token (CONTROL or USER_DEFINED) whose text is `text`, the one
// Tokenizer::token_id finds; nullopt when there is none. No token_type: every token is NORMAL.
std::optional<int64_t> added_token_id(const Metadata& m, const std::string& text) {
  const GgufValue* tokens = find(m, "tokenizer.ggml.tokens");
  const GgufValue* types = find(m, "tokenizer.ggml.token_type");
  if (!tokens || !types) return std::nullopt;
  const std::vector<std::string>* texts = nullptr;
  with_key(m, "tokenizer.ggml.tokens", [&](const GgufValue& v) { texts = &v.string_array(); });
  std::vector<int64_t> kinds;
  with_key(m, "tokenizer.ggml.token_type", [&](const GgufValue& v) {
    kinds = v.int_array();
    if (kinds.size() != texts->size()) fail("has {} entries for {} tokens", kinds.size(), texts->size());
  });
  for (size_t id = 0; id < texts->size(); ++id) {
    const bool added = kinds[id] == int64_t(GgmlTokenType::control) ||
                       kinds[id] == int64_t(GgmlTokenType::user_defined);
    if (added && (*texts)[id] == text) return int64_t(id);
  }
  return std::nullopt;
}

}  // namespace

std::vector<int> gguf_stop_token_ids(const Metadata& m, int vocab_size) {
  std::vector<int> ids;
  auto add = [&](int64_t id) {
    if (id < 0 || id >= vocab_size) fail("{} is not a token of the model (vocab_size {})", id, vocab_size);
    if (std::find(ids.begin(), ids.end(), int(id)) == ids.end()) ids.push_back(int(id));
  };
  with_key(m, "tokenizer.ggml.eos_token_id", [&](const GgufValue& v) { add(v.as_int()); });
  for (const char* text : {"<|im_end|>", "<|endoftext|>"})
    if (std::optional<int64_t> id = added_token_id(m, text))
      with_context(fmt::format("metadata 'tokenizer.ggml.tokens': {} (id {})", text, *id), [&] { add(*id); });
  return ids;
}

std::optional<GgmlVocabulary> gguf_vocabulary(const Metadata& m) {
  if (!find(m, "tokenizer.ggml.model")) return std::nullopt;
  GgmlVocabulary out;
  with_key(m, "tokenizer.ggml.model", [&](const GgufValue& v) { out.model = v.as_string(); });
  with_key(m, "tokenizer.ggml.pre", [&](const GgufValue& v) { out.pre = v.as_string(); });
  if (!find(m, "tokenizer.ggml.tokens"))
    fail("metadata 'tokenizer.ggml.tokens' is missing (the model has a tokenizer.ggml.model)");
  with_key(m, "tokenizer.ggml.tokens", [&](const GgufValue& v) {
    out.tokens = v.string_array();
    if (out.tokens.empty()) fail("holds no tokens");
  });
  with_key(m, "tokenizer.ggml.token_type",
           [&](const GgufValue& v) { out.token_types = token_types(v, out.tokens.size()); });
  with_key(m, "tokenizer.ggml.merges", [&](const GgufValue& v) { out.merges = v.string_array(); });
  check_special_ids(m, out.tokens.size());
  return out;
}

}  // namespace lily
