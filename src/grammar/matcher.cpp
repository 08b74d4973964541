// matcher.cpp: the per-state cache and the per-request matcher (see the header).
#include "grammar/matcher.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "base/cpu_clones.h"
#include "base/error.h"
#include "grammar/walk_classes.h"

namespace lily::grammar {

namespace {

// Suffixes kept per entry; past this the entry walks the vocabulary at run time instead.
constexpr size_t kMaxSuffixes = 400'000;

void set_bit(std::span<uint64_t> mask, int32_t id) { mask[size_t(id) >> 6] |= uint64_t(1) << (id & 63); }

}  // namespace

struct CompiledGrammar::Entry {
  // The accepted tokens as a mask, when there are many (shared: DensePool), else as a list.
  std::shared_ptr<const std::vector<uint64_t>> dense;
  std::vector<int32_t> sparse;
  TokenTrie suffixes;  // bytes left after the rule ends part-way through a token
  bool walk_at_run_time = false;
  // Without the dense mask, which the pool counts once.
  size_t bytes() const {
    return sparse.size() * 4 + suffixes.nodes.size() * sizeof(TokenTrie::Node) + suffixes.token_ids.size() * 4;
  }
};

// Equal dense masks stored once. The states of a maxLength chain (one per character) accept
// the same tokens but near its end: unshared, a string of maxLength 5000 written out cost a
// 31 KB mask per state visited (~40 MB per request at 248K ids, kept with the grammar).
struct CompiledGrammar::DensePool {
  std::unordered_map<std::string_view, std::shared_ptr<const std::vector<uint64_t>>> masks;  // keyed by their bytes
  size_t bytes = 0;

  std::shared_ptr<const std::vector<uint64_t>> intern(std::vector<uint64_t> mask) {
    const std::string_view key(reinterpret_cast<const char*>(mask.data()), mask.size() * 8);
    if (auto it = masks.find(key); it != masks.end()) return it->second;
    auto shared = std::make_shared<const std::vector<uint64_t>>(std::move(mask));
    bytes += shared->size() * 8;
    masks.emplace(std::string_view(reinterpret_cast<const char*>(shared->data()), shared->size() * 8), shared);
    return shared;
  }
};

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)), dense_pool_(std::make_unique<DensePool>()) {
  LILY_CHECK(vocabulary_ != nullptr, "grammar: no vocabulary");
  size_t offset = 0;
  called_.assign(grammar_.rules.size(), false);
  int longest = 0;  // bytes of the longest text token: what one walk can read
  for (int32_t id = 0; id < vocabulary_->size(); ++id)
    if (vocabulary_->is_text(id)) longest = std::max(longest, int(vocabulary_->bytes(id).size()));
  for (const Rule& r : grammar_.rules) {
    rule_offset_.push_back(offset);
    for (int32_t rep : walk_classes(grammar_, r, longest + 1)) entry_of_.push_back(offset + size_t(rep));
    offset += size_t(r.num_states);
    for (const CallEdge& c : r.calls) called_[size_t(c.rule)] = true;
  }
  entries_.resize(offset);
}

CompiledGrammar::~CompiledGrammar() = default;

size_t CompiledGrammar::cached_states() const {
  std::lock_guard lock(mutex_);
  return size_t(std::count_if(entries_.begin(), entries_.end(), [](const auto& e) { return e != nullptr; }));
}

size_t CompiledGrammar::cache_bytes() const {
  std::lock_guard lock(mutex_);
  size_t n = dense_pool_->bytes;
  for (const auto& e : entries_)
    if (e) n += e->bytes();
  return n;
}

const CompiledGrammar::Entry& CompiledGrammar::entry(int32_t rule, int32_t state) const {
  std::lock_guard lock(mutex_);
  std::unique_ptr<Entry>& slot = entries_[entry_of_[rule_offset_[size_t(rule)] + size_t(state)]];
  if (slot) return *slot;

  // A walk of the whole vocabulary from (rule, state) over an unknown caller.
  auto entry = std::make_unique<Entry>();
  const TokenTrie& trie = vocabulary_->trie();
  NodePool pool;
  Stepper stepper;
  Config start;
  const Top seed{rule, state, kBase};
  stepper.close(grammar_, pool, std::span(&seed, 1), start);
  start.base_pop = false;  // ending before the token is the caller's own states (the matcher's closure)
  std::vector<int32_t> accepted;
  std::vector<std::pair<std::string, int32_t>> suffixes;
  std::string path;
  std::vector<int32_t> ends;
  stepper.walk(
      grammar_, pool, trie, start,
      [&](int32_t node) {
        const TokenTrie::Node& n = trie.nodes[size_t(node)];
        accepted.insert(accepted.end(), trie.token_ids.begin() + n.token_begin,
                        trie.token_ids.begin() + n.token_begin + n.token_count);
      },
      [&](int32_t node, int32_t) {
        // A rule no call reaches (the root) ends only at the end of the text: nothing follows it
        // inside a token, and a suffix trie per state (one per character of a bounded string)
        // would only cost memory.
        if (entry->walk_at_run_time || !called_[size_t(rule)]) return;
        path.clear();
        ends.clear();
        for (int32_t y = node + 1; y < trie.nodes[size_t(node)].end; ++y) {
          const TokenTrie::Node& n = trie.nodes[size_t(y)];
          while (!ends.empty() && y >= ends.back()) ends.pop_back(), path.pop_back();
          path.push_back(char(n.byte));
          ends.push_back(n.end);
          for (int32_t i = 0; i < n.token_count; ++i)
            suffixes.emplace_back(path, trie.token_ids[size_t(n.token_begin + i)]);
        }
        if (suffixes.size() > kMaxSuffixes) entry->walk_at_run_time = true;
      });
  if (entry->walk_at_run_time) {
    suffixes.clear();
  } else if (!suffixes.empty()) {
    entry->suffixes = TokenTrie::build(std::move(suffixes));
  }
  const size_t words = vocabulary_->mask_words();
  if (accepted.size() > words / 2) {
    std::vector<uint64_t> dense(words, 0);
    for (int32_t id : accepted) set_bit(dense, id);
    entry->dense = dense_pool_->intern(std::move(dense));
  } else {
    std::sort(accepted.begin(), accepted.end());
    entry->sparse = std::move(accepted);
  }
  slot = std::move(entry);
  return *slot;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  LILY_CHECK(grammar_ != nullptr, "grammar matcher: no grammar");
  Config start;
  const Top seed{0, 0, kRoot};
  stepper_.close(grammar_->grammar(), pool_, std::span(&seed, 1), start);
  tops_ = std::move(start.tops);
  accepting_ = start.accepting;
}

void GrammarMatcher::fill_next_token_bitmask(std::span<uint64_t> mask) {
  const Vocabulary& vocab = grammar_->vocabulary();
  const Grammar& g = grammar_->grammar();
  LILY_CHECK(mask.size() >= vocab.mask_words(), "grammar matcher: mask of {} words, the vocabulary needs {}",
             mask.size(), vocab.mask_words());
  std::fill(mask.begin(), mask.end(), 0);
  if (finished_) return;
  auto set_tokens = [&](const TokenTrie& trie) {
    return [&mask, &trie](int32_t node) {
      const TokenTrie::Node& n = trie.nodes[size_t(node)];
      for (int32_t i = 0; i < n.token_count; ++i) set_bit(mask, trie.token_ids[size_t(n.token_begin + i)]);
    };
  };
  auto no_pop = [](int32_t, int32_t) {};
  Config from;
  for (const Top& t : tops_) {
    const CompiledGrammar::Entry& e = grammar_->entry(t.rule, t.state);
    if (e.walk_at_run_time) {
      stepper_.close(g, pool_, std::span(&t, 1), from);
      stepper_.walk(g, pool_, vocab.trie(), from, set_tokens(vocab.trie()), no_pop);
      continue;
    }
    if (e.dense) {
      const std::vector<uint64_t>& dense = *e.dense;
      for (size_t i = 0; i < dense.size(); ++i) mask[i] |= dense[i];
    } else {
      for (int32_t id : e.sparse) set_bit(mask, id);
    }
    if (t.parent != kRoot && e.suffixes.nodes.size() > 1) {
      const Top caller = pool_[t.parent];
      stepper_.close(g, pool_, std::span(&caller, 1), from);
      stepper_.walk(g, pool_, e.suffixes, from, set_tokens(e.suffixes), no_pop);
    }
  }
  if (accepting_)
    for (int32_t id : vocab.stop_ids()) set_bit(mask, id);
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  const Grammar& g = grammar_->grammar();
  Config cur{tops_, accepting_, false}, next;
  for (char c : bytes) {
    stepper_.step(g, pool_, cur, uint8_t(c), next);
    if (!next.alive()) return false;
    std::swap(cur, next);
  }
  tops_ = std::move(cur.tops);
  accepting_ = cur.accepting;
  return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
  const Vocabulary& vocab = grammar_->vocabulary();
  if (finished_ || id < 0 || id >= vocab.size()) return false;
  if (vocab.is_stop(id)) {
    if (!accepting_) return false;
    finished_ = true;
    tops_.clear();
    return true;
  }
  if (!vocab.is_text(id)) return false;
  return accept_bytes(vocab.bytes(id));
}

// A word at a time: a word all allowed (string content, free text) is skipped and one all
// forbidden (most words of a structural step) is one fill, so only mixed words test bits. At
// 248,320 logits this took 130-300 us a step bit by bit on the 2-core machine.
// A partly allowed word is a select per logit, not a branch per bit: in string content most
// words have a few forbidden ids at unpredictable places, and the branch per bit cost 130-200 us
// over 248,320 logits (800 us on a random half mask); the select vectorizes (AVX2, AVX-512
// clones): ~22 us whatever the mask (bench_constrained_step, docs/perf-log/2026-12.md).
LILY_CPU_CLONES void apply_token_bitmask(std::span<float> logits, std::span<const uint64_t> mask) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  for (size_t begin = 0, w = 0; begin < logits.size(); begin += 64, ++w) {
    const size_t n = std::min<size_t>(64, logits.size() - begin);
    const uint64_t bits = w < mask.size() ? mask[w] : 0;
    float* row = logits.data() + begin;
    if (bits == ~uint64_t(0)) continue;
    if (n == 64) {  // a constant trip count: the loop the compiler vectorizes
      for (size_t i = 0; i < 64; ++i) row[i] = (bits >> i) & 1 ? row[i] : minus_inf;
    } else {
      for (size_t i = 0; i < n; ++i) row[i] = (bits >> i) & 1 ? row[i] : minus_inf;
    }
  }
}

}  // namespace lily::grammar
