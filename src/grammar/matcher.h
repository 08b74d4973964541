// matcher.h: which tokens a grammar allows next, and advancing it by the token sampled.
//
// CompiledGrammar binds a Grammar to a Vocabulary and caches, per rule state, what a token
// walk from that state finds when nothing is known about the rules below it on the stack:
//   * accepted: tokens the state takes whole without its rule ending (allowed whatever called
//     the rule; for a grammar without recursion, every token there is);
//   * a suffix trie of the tokens whose bytes can end the rule part-way, keyed by the bytes
//     left over (these depend on the caller: at each step they are walked from the caller's
//     state, so `},` after a nested object costs a walk of a few trie nodes).
// States that no token can tell apart (walk_classes.h: most of a long string's chain) share one
// entry. An entry is made the first time a state of its class is reached (a walk of the
// vocabulary trie pruned by the grammar: the whole trie only inside strings and free text) and
// kept for the grammar's life, shared by every matcher of it; the steps after that are a copy of
// the cached mask.
//
// GrammarMatcher is one request's state (a set of stacks of rule states, for the few places a
// grammar is ambiguous by a byte): fill_next_token_bitmask before each sampling step, then
// accept_token with the token sampled. A stop token is allowed exactly when the text so far is
// a whole sentence of the grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/stack.h"
#include "grammar/vocabulary.h"

namespace lily::grammar {

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary);
  ~CompiledGrammar();

  const Grammar& grammar() const { return grammar_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }
  // Cache entries made so far (one per class of states that share it), and their bytes (for
  // logs and the benchmark).
  size_t cached_states() const;
  size_t cache_bytes() const;

  struct Entry;
  // The entry of one rule state, made on first use (thread-safe).
  const Entry& entry(int32_t rule, int32_t state) const;

 private:
  struct DensePool;
  Grammar grammar_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  std::unique_ptr<DensePool> dense_pool_;  // guarded by mutex_
  std::vector<size_t> rule_offset_;        // index of (rule, state) = rule_offset_[rule] + state
  std::vector<size_t> entry_of_;           // [index]: the entry it shares (walk_classes.h), an index too
  std::vector<bool> called_;               // [rule]: some call edge reaches it (the root: none)
  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<Entry>> entries_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // mask.size() >= vocabulary().mask_words(): bit (id % 64) of word id / 64 is set iff the
  // token may come next. After the grammar has finished (a stop token was accepted): none.
  void fill_next_token_bitmask(std::span<uint64_t> mask);
  // Advances by one token; false (and no change) when the grammar does not allow it.
  bool accept_token(int32_t id);
  // Advances by raw bytes (tests; a token's bytes are fed the same way); false: no change.
  bool accept_bytes(std::string_view bytes);

  // The text so far is a whole sentence of the grammar: a stop token is allowed.
  bool is_accepting() const { return accepting_; }
  // Accepting, and no byte can follow: the caller may end the generation without sampling.
  bool must_stop() const { return accepting_ && tops_.empty(); }
  // A stop token was accepted.
  bool is_finished() const { return finished_; }

  const CompiledGrammar& compiled() const { return *grammar_; }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  NodePool pool_;  // the frames below the tops (copies of a matcher copy it)
  std::vector<Top> tops_;
  bool accepting_ = false;
  bool finished_ = false;
  Stepper stepper_;  // scratch
};

// Sets logits of the tokens the mask leaves out to -infinity (ids past the mask too).
void apply_token_bitmask(std::span<float> logits, std::span<const uint64_t> mask);

}  // namespace lily::grammar
