// vocabulary.cpp: token kinds and the preorder trie.
#include "grammar/vocabulary.h"

#include <algorithm>

#include "base/error.h"
#include "tokenizer/tokenizer.h"

namespace lily::grammar {

TokenTrie TokenTrie::build(std::vector<std::pair<std::string, int32_t>> entries) {
  std::sort(entries.begin(), entries.end());
  TokenTrie t;
  t.nodes.push_back({});
  std::vector<int32_t> path{0};  // path[d]: the node at depth d on the current branch
  std::string prev;
  auto close_to = [&](size_t depth) {  // ends the subtrees deeper than `depth`
    while (path.size() > depth + 1) {
      t.nodes[size_t(path.back())].end = int32_t(t.nodes.size());
      path.pop_back();
    }
  };
  for (auto& [bytes, id] : entries) {
    size_t common = 0;
    while (common < prev.size() && common < bytes.size() && prev[common] == bytes[common]) ++common;
    close_to(common);
    for (size_t d = common; d < bytes.size(); ++d) {
      TokenTrie::Node n;
      n.byte = uint8_t(bytes[d]);
      n.token_begin = int32_t(t.token_ids.size());
      path.push_back(int32_t(t.nodes.size()));
      t.nodes.push_back(n);
    }
    TokenTrie::Node& at = t.nodes[size_t(path.back())];
    if (at.token_count == 0) at.token_begin = int32_t(t.token_ids.size());
    t.token_ids.push_back(id);
    ++at.token_count;
    prev = std::move(bytes);
  }
  close_to(0);
  t.nodes[0].end = int32_t(t.nodes.size());
  return t;
}

Vocabulary::Vocabulary(std::vector<std::string> tokens, std::span<const int32_t> special, std::span<const int32_t> stop)
    : tokens_(std::move(tokens)), kind_(tokens_.size(), kText) {
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (tokens_[i].empty()) kind_[i] = kNever;
  auto check = [&](int32_t id, const char* what) {
    LILY_CHECK(id >= 0 && size_t(id) < tokens_.size(), "grammar vocabulary: {} id {} outside [0, {})", what, id,
               tokens_.size());
  };
  for (int32_t id : special) check(id, "special"), kind_[size_t(id)] = kNever;
  for (int32_t id : stop) {
    check(id, "stop");
    kind_[size_t(id)] = kStop;
    stop_.push_back(id);
  }
  std::vector<std::pair<std::string, int32_t>> entries;
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (kind_[i] == kText) entries.emplace_back(tokens_[i], int32_t(i));
  trie_ = TokenTrie::build(std::move(entries));
}

Vocabulary Vocabulary::from_tokenizer(const Tokenizer& tokenizer, int32_t padded_size) {
  const int32_t n = tokenizer.vocab_size();
  LILY_CHECK(padded_size >= n, "grammar vocabulary: padded size {} below the tokenizer's {} ids", padded_size, n);
  std::vector<std::string> tokens(static_cast<size_t>(padded_size));
  std::vector<int32_t> special;
  for (int32_t id = 0; id < n; ++id) {
    // The tokenizer has no "is this id defined" accessor: an id in a gap of the vocabulary
    // throws, and stays empty here (never allowed).
    try {
      tokens[size_t(id)] = tokenizer.token_bytes(id);
    } catch (const Error&) {
      continue;
    }
    if (tokenizer.is_special(id)) special.push_back(id);
  }
  std::vector<int32_t> stop;
  for (const char* name : {"<|im_end|>", "<|endoftext|>"})
    if (auto id = tokenizer.token_id(name)) stop.push_back(*id);
  return Vocabulary(std::move(tokens), special, stop);
}

}  // namespace lily::grammar
