// hand_tokenizer.h: a tiny tokenizer.json written by hand, whose ids can be worked out on paper.
//
// ids 0..255: the byte-level symbol of byte b has id b. Merges, by rank:
//   0 "h e" -> 256 "he"      3 "hell o" -> 259 "hello"    6 "Ġw or" -> 262 "Ġwor"
//   1 "l l" -> 257 "ll"      4 "Ġ w"    -> 260 "Ġw"       7 "l d"   -> 263 "ld"
//   2 "he ll" -> 258 "hell"  5 "o r"    -> 261 "or"       8 "Ġwor ld" -> 264 "Ġworld"
// Added: 265 <|endoftext|> (special), 266 <|im_start|> (special), 267 <|im_end|> (special),
//        268 <think>, 269 </think> (not special, normalized=false),
//        270 <y> (not special, normalized=true: matched after NFC).
#pragma once

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace lily::test {

inline std::string byte_symbol(unsigned char b) {
  std::string s;
  unicode::append_utf8(s, unicode::byte_to_codepoint()[b]);
  return s;
}

inline nlohmann::json hand_tokenizer_json(bool merges_as_pairs) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(static_cast<unsigned char>(b))] = b;
  const std::string G = byte_symbol(' ');  // "Ġ"
  const std::pair<std::string, std::string> merges[] = {{"h", "e"},      {"l", "l"}, {"he", "ll"},
                                                        {"hell", "o"},   {G, "w"},   {"o", "r"},
                                                        {G + "w", "or"}, {"l", "d"}, {G + "wor", "ld"}};
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    if (merges_as_pairs) {
      merge_list.push_back(json::array({a, b}));
    } else {
      merge_list.push_back(a + " " + b);
    }
  }
  auto added = [](int id, const char* content, bool special, bool normalized) {
    return json{{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", normalized}, {"special", special}};
  };
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({added(265, "<|endoftext|>", true, false), added(266, "<|im_start|>", true, false),
                                    added(267, "<|im_end|>", true, false), added(268, "<think>", false, false),
                                    added(269, "</think>", false, false), added(270, "<y>", false, true)})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({json{{"type", "Split"},
                                            {"pattern", {{"Regex", kQwen35SplitPattern}}},
                                            {"behavior", "Isolated"},
                                            {"invert", false}},
                                       json{{"type", "ByteLevel"},
                                            {"add_prefix_space", false},
                                            {"trim_offsets", false},
                                            {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
}

// Writes `j` to a fresh file under the temp dir and returns its path.
inline std::string write_temp_json(const nlohmann::json& j, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("lily_tok_test_" + std::to_string(::getpid()));
  const auto path = dir / name;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << j.dump(1);
  return path.string();
}

}  // namespace lily::test
