// synthetic_vocabulary.h: a made-up vocabulary of Qwen3.6's size for the grammar benchmarks
// (bench_grammar, bench_constrained_step), a schema and a document valid for it.
//
// There is no real Qwen3.6 vocabulary here, so a byte-level BPE-like one of the same size is
// made up: the 256 bytes, words with and without a leading space (and capitalized), CJK
// characters and pairs, punctuation runs mixed with quotes, braces and spaces, JSON pieces
// ("name":, ",", "}}), whitespace and indentation runs, digits; 248,077 real ids (the Qwen
// added tokens at 248,044.. with <tool_call>, </think> as text) and the padded tail.
#pragma once

#include <algorithm>
#include <cctype>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "grammar/json_schema.h"  // json
#include "grammar/vocabulary.h"

namespace lily::bench {

using lily::grammar::json;
using lily::grammar::Vocabulary;

inline constexpr int32_t kPadded = 248'320, kReal = 248'077, kAddedBegin = 248'044;

inline std::shared_ptr<const Vocabulary> vocabulary() {
  static auto v = [] {
    std::mt19937_64 rng(42);
    auto pick = [&](size_t n) { return size_t(rng() % n); };
    std::set<std::string> pieces;
    std::vector<std::string> tokens;
    auto add = [&](std::string s) {
      if (!s.empty() && int32_t(tokens.size()) < kAddedBegin && pieces.insert(s).second) tokens.push_back(s);
    };
    for (int b = 0; b < 256; ++b) add(std::string(1, char(b)));
    for (int n = 1; n <= 32; ++n) add(std::string(size_t(n), ' '));
    for (int n = 0; n <= 24; ++n) {
      std::string indent(size_t(n), ' ');
      add(std::string("\n").append(indent));
      add(std::string(",\n").append(indent));
    }
    static const char* const syl[] = {"ka",  "ri", "to",  "na", "me",  "so", "lu", "pe", "an", "ing", "tion", "er",
                                      "the", "qu", "ick", "br", "own", "st", "re", "al", "ed", "ly",  "ou",   "ch",
                                      "th",  "is", "or",  "en", "es",  "at", "ar", "on", "in", "it",  "ag",   "id"};
    const char* const punct = "{}[]()\":,.;!?'-_/\\<>=+*&%$#@|~`";
    const std::string cjk[] = {"你", "好", "世", "界", "人", "工", "智", "能", "今", "天", "是", "年", "月", "日"};
    while (int32_t(tokens.size()) < kAddedBegin) {
      const size_t kind = pick(100);
      std::string s;
      if (kind < 62) {  // words
        for (size_t i = 0, n = 1 + pick(4); i < n; ++i) s += syl[pick(std::size(syl))];
        if (pick(2)) s.insert(s.begin(), ' ');
        if (pick(5) == 0) s[s[0] == ' ' ? 1 : 0] = char(std::toupper(s[s[0] == ' ' ? 1 : 0]));
      } else if (kind < 72) {  // CJK
        for (size_t i = 0, n = 1 + pick(3); i < n; ++i) s += cjk[pick(std::size(cjk))];
        if (pick(4) == 0) s = s.substr(0, s.size() - 1 - pick(2));  // a cut character, as BPE makes
      } else if (kind < 84) {                                       // punctuation runs with quotes, braces, spaces
        for (size_t i = 0, n = 1 + pick(4); i < n; ++i) s += pick(6) == 0 ? ' ' : punct[pick(32)];
      } else if (kind < 94) {  // JSON pieces
        std::string w;
        for (size_t i = 0, n = 1 + pick(2); i < n; ++i) w += syl[pick(std::size(syl))];
        static const char* const forms[] = {"\"%\":", "\"%\": \"", "\"%\",", "\",\"%\":", "{\"%\":", "%\"", "\"%"};
        s = forms[pick(std::size(forms))];
        s.replace(s.find('%'), 1, w);
      } else {  // code and markup
        static const char* const code[] = {"()", "();", "{\n", "}\n", "=>", "!=", "==", "::", "->", "</", "/>", "<"};
        s = code[pick(std::size(code))];
        if (pick(2)) s.append(syl[pick(std::size(syl))]);
      }
      add(s);
    }
    static const char* const added[] = {
        "<|endoftext|>",  "<|im_start|>",   "<|im_end|>",      "<|object_ref_start|>", "<|object_ref_end|>",
        "<|box_start|>",  "<|box_end|>",    "<|quad_start|>",  "<|quad_end|>",         "<|vision_start|>",
        "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",   "<|video_pad|>",        "<tool_call>",
        "</tool_call>",   "<|fim_prefix|>", "<|fim_middle|>",  "<|fim_suffix|>",       "<|fim_pad|>",
        "<|repo_name|>",  "<|file_sep|>",   "<tool_response>", "</tool_response>",     "<think>",
        "</think>"};
    std::vector<int32_t> special;
    for (const char* a : added) {
      const std::string s = a;
      if (s.starts_with("<|")) special.push_back(int32_t(tokens.size()));
      tokens.push_back(s);
    }
    while (int32_t(tokens.size()) < kReal) special.push_back(int32_t(tokens.size())), tokens.push_back("<|x|>");
    tokens.resize(kPadded);
    const int32_t stop[] = {kAddedBegin + 2, kAddedBegin};
    return std::make_shared<const Vocabulary>(std::move(tokens), special, stop);
  }();
  return v;
}

// Longest-match tokens of `text` over the vocabulary trie.
inline std::vector<int32_t> tokenize(const Vocabulary& v, const std::string& text) {
  const auto& trie = v.trie();
  std::vector<int32_t> out;
  for (size_t i = 0; i < text.size();) {
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t j = i; j < text.size(); ++j) {
      int32_t child = node + 1, found = -1;
      while (child < trie.nodes[size_t(node)].end) {
        if (trie.nodes[size_t(child)].byte == uint8_t(text[j])) {
          found = child;
          break;
        }
        child = trie.nodes[size_t(child)].end;
      }
      if (found < 0) break;
      node = found;
      if (trie.nodes[size_t(node)].token_count > 0)
        best = trie.token_ids[size_t(trie.nodes[size_t(node)].token_begin)], best_len = j - i + 1;
    }
    out.push_back(best);
    i += best_len;
  }
  return out;
}

inline const json kSchema = json::parse(R"({"type":"object","properties":{
  "name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string","maxLength":64},
  "status":{"enum":["active","inactive","banned"]},
  "tags":{"type":"array","items":{"type":"string"},"maxItems":8},
  "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
     "zip":{"type":"string","minLength":5,"maxLength":5}},"required":["city"]},
  "scores":{"type":"array","items":{"type":"number"}},"note":{"type":["string","null"]}},
  "required":["name","age","status"]})");

inline const char* const kDocument = R"({"name": "Karito Namesolu", "age": 42, "email": "karito@example.com",
  "status": "active", "tags": ["admin", "early adopter", "世界"], "address": {"street": "12 Queen Street",
  "city": "Oslo", "zip": "01234"}, "scores": [3.5, -1, 2e10], "note": "likes \"quoted\" text and \u00e9"})";

}  // namespace lily::bench
