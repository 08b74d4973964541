#include "runtime/prefix_cache.h"

#include <algorithm>

#include "base/error.h"

namespace lily {

void CachedSequence::snapshot_here() {
  const int64_t length = state->length();
  if (!snapshots.empty() && snapshots.back()->length() >= length) {
    if (snapshots.back()->length() == length) return;
    // Snapshots past the current length belong to a rolled-back branch.
    while (!snapshots.empty() && snapshots.back()->length() > length) snapshots.pop_back();
  }
  snapshots.push_back(state->snapshot());
  // Keep the most recent points; the oldest matter only for edits far back in a conversation.
  if (snapshots.size() > PrefixCache::kMaxSnapshotsPerSequence) snapshots.erase(snapshots.begin());
}

uint64_t CachedSequence::memory_bytes() const {
  uint64_t n = state ? state->memory_bytes() : 0;
  for (const auto& s : snapshots) n += s->memory_bytes();
  return n;
}

PrefixCache::PrefixCache(Backend& backend, int64_t capacity, uint64_t budget_bytes)
    : backend_(backend), capacity_(capacity), budget_(budget_bytes) {
  LILY_CHECK(capacity > 0, "the context size must be positive, got {}", capacity);
}

int64_t PrefixCache::resumable_length(const CachedSequence& sequence, std::span<const int32_t> prompt) {
  if (prompt.empty()) return 0;
  const size_t n = std::min(sequence.tokens.size(), prompt.size());
  size_t common = 0;
  while (common < n && sequence.tokens[common] == prompt[common]) ++common;
  const int64_t limit = std::min<int64_t>(int64_t(common), int64_t(prompt.size()) - 1);
  if (int64_t(sequence.tokens.size()) <= limit) return int64_t(sequence.tokens.size());
  int64_t best = 0;
  for (const auto& s : sequence.snapshots) {
    if (s->length() <= limit) best = std::max(best, s->length());
  }
  return best;
}

CachedSequence PrefixCache::acquire(std::span<const int32_t> prompt) {
  auto best = entries_.end();
  int64_t best_length = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    int64_t n = resumable_length(*it, prompt);
    if (n > best_length) best_length = n, best = it;
  }
  if (best == entries_.end()) return fresh();

  CachedSequence seq = std::move(*best);
  entries_.erase(best);
  if (best_length < int64_t(seq.tokens.size())) {
    auto snap = std::find_if(seq.snapshots.begin(), seq.snapshots.end(),
                             [&](const auto& s) { return s->length() == best_length; });
    LILY_CHECK(snap != seq.snapshots.end(), "internal: no snapshot at {}", best_length);
    seq.state->restore(**snap);
    seq.tokens.resize(size_t(best_length));
    seq.snapshots.erase(snap + 1, seq.snapshots.end());
  }
  return seq;
}

CachedSequence PrefixCache::fresh() {
  CachedSequence seq;
  seq.state = backend_.new_sequence(capacity_);
  return seq;
}

void PrefixCache::release(CachedSequence sequence) {
  if (!sequence.state || sequence.tokens.empty()) return;
  LILY_CHECK(int64_t(sequence.tokens.size()) == sequence.state->length(),
             "internal: a sequence of {} tokens holds a state of {}", sequence.tokens.size(), sequence.state->length());
  entries_.push_front(std::move(sequence));
  uint64_t total = stats().bytes;
  while (!entries_.empty() && total > budget_) {
    total -= entries_.back().memory_bytes();
    entries_.pop_back();
  }
}

void PrefixCache::clear() { entries_.clear(); }

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s;
  s.sequences = entries_.size();
  s.budget_bytes = budget_;
  for (const auto& e : entries_) s.bytes += e.memory_bytes();
  return s;
}

}  // namespace lily
