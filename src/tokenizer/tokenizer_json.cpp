// tokenizer_json.cpp: reads a HF tokenizer.json into Tokenizer::Impl, refusing anything outside
// the Qwen3.5/3.6 pipeline (spec §1.1) with a message naming the field.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

#include "base/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace lily {
namespace {

using nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool is_null_or_empty_string(const json& j, const char* key) {
  return !j.contains(key) || j[key].is_null() || (j[key].is_string() && j[key].get<std::string>().empty());
}

bool flag(const json& j, const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

// Code points of valid UTF-8 (JSON strings are valid UTF-8 after parsing).
std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    cps.push_back(cp);
    i += len;
  }
  return cps;
}

void read_normalizer(const json& root, Tokenizer::Impl& impl) {
  const json& n = root.contains("normalizer") ? root["normalizer"] : json();
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "NFC") {
    impl.nfc = true;
  } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].size() == 1 &&
             n["normalizers"][0].value("type", "") == "NFC") {
    impl.nfc = true;
  } else {
    fail("normalizer: only NFC (or none) is supported, found {}", n.dump());
  }
}

void read_pre_tokenizer(const json& root, Tokenizer::Impl& impl) {
  const json& p = root.contains("pre_tokenizer") ? root["pre_tokenizer"] : json();
  LILY_CHECK(!p.is_null(), "pre_tokenizer: missing (expected Sequence[Split, ByteLevel])");
  std::vector<json> steps;
  if (p.value("type", "") == "Sequence") {
    for (const json& s : p.at("pretokenizers")) steps.push_back(s);
  } else {
    steps.push_back(p);
  }
  bool byte_level = false;
  for (const json& s : steps) {
    const std::string type = s.value("type", "");
    if (type == "Split") {
      LILY_CHECK(!impl.split, "pre_tokenizer: more than one Split is not supported");
      LILY_CHECK(s.contains("pattern") && s["pattern"].contains("Regex"),
                 "pre_tokenizer Split: only a Regex pattern is supported, found {}", s.dump());
      LILY_CHECK(lower(s.value("behavior", "")) == "isolated",
                 "pre_tokenizer Split: only behavior Isolated is supported, found '{}'", s.value("behavior", ""));
      LILY_CHECK(!flag(s, "invert"), "pre_tokenizer Split: invert=true is not supported");
      LILY_CHECK(!byte_level, "pre_tokenizer: Split after ByteLevel is not supported");
      impl.split = std::make_unique<SplitPretokenizer>(s["pattern"]["Regex"].get<std::string>());
    } else if (type == "ByteLevel") {
      LILY_CHECK(!flag(s, "add_prefix_space"), "pre_tokenizer ByteLevel: add_prefix_space=true is not supported");
      LILY_CHECK(!flag(s, "use_regex"), "pre_tokenizer ByteLevel: use_regex=true (the GPT-2 regex) is not supported");
      byte_level = true;
    } else {
      fail("pre_tokenizer: step type '{}' is not supported", type);
    }
  }
  LILY_CHECK(byte_level, "pre_tokenizer: a ByteLevel step is required");
}

void read_model(const json& root, Tokenizer::Impl& impl, std::unordered_map<std::string, int32_t>& vocab) {
  LILY_CHECK(root.contains("model") && root["model"].is_object(), "model: missing");
  const json& m = root["model"];
  LILY_CHECK(m.value("type", "BPE") == "BPE", "model: type '{}' is not supported (BPE only)", m.value("type", ""));
  LILY_CHECK(m.contains("dropout") == false || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0,
             "model: BPE dropout is not supported");
  LILY_CHECK(!flag(m, "byte_fallback"), "model: byte_fallback=true is not supported");
  LILY_CHECK(is_null_or_empty_string(m, "continuing_subword_prefix"),
             "model: continuing_subword_prefix is not supported");
  LILY_CHECK(is_null_or_empty_string(m, "end_of_word_suffix"), "model: end_of_word_suffix is not supported");
  impl.bpe.ignore_merges = flag(m, "ignore_merges");

  LILY_CHECK(m.contains("vocab") && m["vocab"].is_object(), "model.vocab: missing");
  vocab.reserve(m["vocab"].size());
  for (const auto& [token, id] : m["vocab"].items()) {
    LILY_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 30),
               "model.vocab: token '{}' has a bad id {}", token, id.dump());
    vocab.emplace(token, id.get<int32_t>());
  }

  const auto& to_cp = unicode::byte_to_codepoint();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    unicode::append_utf8(symbol, to_cp[b]);
    auto it = vocab.find(symbol);
    LILY_CHECK(it != vocab.end(), "model.vocab: byte 0x{:02X} (token '{}') is missing", b, symbol);
    impl.bpe.byte_token[b] = it->second;
  }

  LILY_CHECK(m.contains("merges") && m["merges"].is_array(), "model.merges: missing");
  const json& merges = m["merges"];
  impl.bpe.merges.reserve(merges.size() * 2);
  auto lookup = [&vocab](const std::string& token, size_t rank) {
    auto it = vocab.find(token);
    LILY_CHECK(it != vocab.end(), "model.merges[{}]: token '{}' is not in the vocab", rank, token);
    return it->second;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& merge = merges[rank];
    std::string left, right;
    if (merge.is_string()) {  // "a b" (tokens never contain a raw space)
      const std::string& s = merge.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      LILY_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                 "model.merges[{}]: '{}' is not two tokens separated by one space", rank, s);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      LILY_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
                 "model.merges[{}]: expected \"a b\" or [\"a\", \"b\"], found {}", rank, merge.dump());
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    // Later duplicates overwrite earlier ones, as in HF's HashMap collect.
    impl.bpe.merges[BpeModel::pair_key(lookup(left, rank), lookup(right, rank))] = BpeMerge{int32_t(rank),
                                                                                            lookup(left + right, rank)};
  }
}

void read_added_tokens(const json& root, Tokenizer::Impl& impl, std::vector<std::pair<int32_t, std::string>>& added) {
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return;
  LILY_CHECK(root["added_tokens"].is_array(), "added_tokens: expected a list");
  for (const json& t : root["added_tokens"]) {
    // The same bound as model.vocab's ids (a negative id used to index the tables).
    const json& id_value = t.at("id");
    LILY_CHECK(id_value.is_number_integer() && id_value.get<int64_t>() >= 0 && id_value.get<int64_t>() < (1 << 30),
               "added_tokens: token {} has a bad id {}", t.value("content", json()).dump(), id_value.dump());
    const int32_t id = id_value.get<int32_t>();
    const std::string content = t.at("content").get<std::string>();
    LILY_CHECK(!flag(t, "single_word") && !flag(t, "lstrip") && !flag(t, "rstrip"),
               "added token '{}' (id {}): single_word/lstrip/rstrip are not supported", content, id);
    const bool special = flag(t, "special");
    const bool normalized = t.contains("normalized") ? flag(t, "normalized") : !special;
    if (normalized) {
      impl.normalized_added.add(impl.nfc ? unicode::nfc(content) : content, id);
    } else {
      impl.raw_added.add(content, id);
    }
    impl.added_by_content[content] = id;
    added.emplace_back(id, content);
    if (id >= int32_t(impl.id_kind.size())) {
      impl.id_kind.resize(id + 1, Tokenizer::Impl::Kind::undefined);
      impl.id_bytes.resize(id + 1);
    }
    impl.id_kind[id] = special ? Tokenizer::Impl::Kind::added_special : Tokenizer::Impl::Kind::added;
  }
}

}  // namespace

std::string byte_level_decode(std::string_view token, bool* all_mapped) {
  std::string bytes;
  for (uint32_t cp : code_points(token)) {
    const int b = unicode::byte_of_codepoint(cp);
    if (b < 0) {
      if (all_mapped) *all_mapped = false;
      return std::string(token);
    }
    bytes.push_back(char(b));
  }
  if (all_mapped) *all_mapped = true;
  return bytes;
}

std::shared_ptr<Tokenizer::Impl> parse_tokenizer_json(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    fail("not valid JSON: {}", e.what());
  }
  auto impl = std::make_shared<Tokenizer::Impl>();
  try {
    read_normalizer(root, *impl);
    read_pre_tokenizer(root, *impl);
    if (root.contains("decoder") && !root["decoder"].is_null()) {
      LILY_CHECK(root["decoder"].value("type", "") == "ByteLevel", "decoder: only ByteLevel is supported, found {}",
                 root["decoder"].dump());
    }
    std::unordered_map<std::string, int32_t> vocab;
    read_model(root, *impl, vocab);

    int32_t max_id = -1;
    for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
    impl->id_kind.assign(max_id + 1, Tokenizer::Impl::Kind::undefined);
    impl->id_bytes.assign(max_id + 1, std::string());
    for (const auto& [token, id] : vocab) {
      bool all_mapped = false;
      impl->id_bytes[id] = byte_level_decode(token, &all_mapped);
      impl->id_kind[id] = Tokenizer::Impl::Kind::bpe;
      if (impl->bpe.ignore_merges && all_mapped) impl->bpe.bytes_to_token.emplace(impl->id_bytes[id], id);
    }

    // Added tokens take precedence for decoding (HF looks them up first).
    std::vector<std::pair<int32_t, std::string>> added;
    read_added_tokens(root, *impl, added);
    for (const auto& [id, content] : added) impl->id_bytes[id] = byte_level_decode(content, nullptr);
  } catch (const json::exception& e) {
    fail("unexpected structure: {}", e.what());
  }
  return impl;
}

}  // namespace lily
