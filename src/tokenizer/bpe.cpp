// bpe.cpp: rank-ordered BPE over a linked list of symbols with a min-heap of candidate merges.
#include "tokenizer/bpe.h"

#include <algorithm>

namespace lily {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  bool alive;
};

struct Candidate {
  int32_t rank;
  int32_t pos;     // index of the left symbol
  int32_t result;  // id the merge produces; a stale candidate no longer matches it
};

// The std heap functions keep the "largest" on top; we want the lowest rank, then leftmost.
struct Later {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (auto it = bytes_to_token.find(std::string(word)); it != bytes_to_token.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    out.push_back(byte_token[static_cast<unsigned char>(word[0])]);
    return;
  }

  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap_storage;
  symbols.clear();
  const int32_t n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back({byte_token[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true});
  }

  auto find_merge = [this](int32_t left, int32_t right) -> const BpeMerge* {
    auto it = merges.find(pair_key(left, right));
    return it == merges.end() ? nullptr : &it->second;
  };

  // A binary min-heap (via Later) kept in a reused thread-local vector.
  std::vector<Candidate>& queue = heap_storage;
  queue.clear();
  auto push = [&queue](Candidate c) {
    queue.push_back(c);
    std::push_heap(queue.begin(), queue.end(), Later{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const BpeMerge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      push({m->rank, i, m->result});
    }
  }

  // Mirrors HF Word::merge_all: a popped candidate is applied only if its left symbol is alive,
  // has a right neighbour, and that pair still merges into the same result id.
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), Later{});
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const BpeMerge* current = find_merge(left.id, right.id);
    if (!current || current->result != top.result) continue;

    left.id = top.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (left.prev >= 0) {
      if (const BpeMerge* m = find_merge(symbols[left.prev].id, left.id)) {
        push({m->rank, left.prev, m->result});
      }
    }
    if (left.next >= 0) {
      if (const BpeMerge* m = find_merge(left.id, symbols[left.next].id)) {
        push({m->rank, top.pos, m->result});
      }
    }
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace lily
