// vocabulary.h: the token vocabulary as the grammar matcher sees it: bytes per id, and a trie.
//
// Every id is one of
//   * a text token: its bytes (a byte-level BPE token, or a non-special added token such as
//     <tool_call> or </think>, which is its literal text); grammars match these byte by byte;
//   * a stop token (<|im_end|>, <|endoftext|>): allowed exactly when the grammar accepts;
//   * never allowed: special (control) tokens, ids with no bytes, the padded tail of the
//     embedding (248,077 .. 248,319 for Qwen3.6).
// The trie holds the text tokens, its nodes in depth-first preorder: node 0 is the root (the
// empty prefix); a node's children follow it, and end is one past its last descendant, so a
// walk skips a whole subtree in one step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lily {
class Tokenizer;
}

namespace lily::grammar {

// A byte trie over token ids, in preorder (shared by the vocabulary and the matcher's caches).
struct TokenTrie {
  struct Node {
    uint8_t byte = 0;         // the byte on the edge from the parent (unused at the root)
    int32_t end = 0;          // one past the last node of this subtree
    int32_t token_begin = 0;  // tokens whose bytes end here: token_ids[token_begin .. + token_count)
    int32_t token_count = 0;
  };
  std::vector<Node> nodes;
  std::vector<int32_t> token_ids;

  // The trie of (bytes, id) pairs; the pairs need not be sorted, equal byte strings may repeat.
  static TokenTrie build(std::vector<std::pair<std::string, int32_t>> entries);
};

class Vocabulary {
 public:
  // tokens[id]: the bytes of each id (empty: never allowed). special: ids never allowed by a
  // grammar. stop: ids allowed exactly when the grammar accepts. Throws lily::Error when an id
  // is out of range.
  Vocabulary(std::vector<std::string> tokens, std::span<const int32_t> special, std::span<const int32_t> stop);

  // From lily's tokenizer: every id below padded_size (>= tokenizer.vocab_size()); the special
  // added tokens are never allowed, <|im_end|> and <|endoftext|> (when present) are the stops.
  static Vocabulary from_tokenizer(const Tokenizer& tokenizer, int32_t padded_size);

  int32_t size() const { return int32_t(tokens_.size()); }
  // 64-bit words of a mask over size() ids: bit (id % 64) of word id / 64.
  size_t mask_words() const { return (tokens_.size() + 63) / 64; }
  std::string_view bytes(int32_t id) const { return tokens_[size_t(id)]; }
  bool is_text(int32_t id) const { return kind_[size_t(id)] == kText; }
  bool is_stop(int32_t id) const { return kind_[size_t(id)] == kStop; }
  const std::vector<int32_t>& stop_ids() const { return stop_; }
  const TokenTrie& trie() const { return trie_; }

 private:
  enum Kind : uint8_t { kNever, kText, kStop };
  std::vector<std::string> tokens_;
  std::vector<uint8_t> kind_;
  std::vector<int32_t> stop_;
  TokenTrie trie_;
};

}  // namespace lily::grammar
