#include "runtime/prefix_cache.h"

#include <algorithm>
#include <fstream>
#include <string>

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

uint64_t SessionCacheBudget::state_bytes(const ModelConfig& c, int64_t context) {
  const uint64_t attention_layers = uint64_t(c.num_layers_of(LayerKind::full_attention));
  const uint64_t deltanet_layers = uint64_t(c.num_layers_of(LayerKind::linear_attention));
  // KV: k and v rows of [kv_heads, head_dim] per token and attention layer.
  const uint64_t kv = attention_layers * uint64_t(std::max<int64_t>(context, 0)) * 2 * uint64_t(c.attention_kv_width());
  // DeltaNet: the conv window [conv_dim, kernel] and the recurrent state [v_heads, k_dim, v_dim].
  const uint64_t recurrent = deltanet_layers * (uint64_t(c.linear_conv_dim()) * uint64_t(c.linear_conv_kernel_dim) +
                                                uint64_t(c.linear_num_value_heads) * uint64_t(c.linear_key_head_dim) *
                                                    uint64_t(c.linear_value_head_dim));
  return 4 * (kv + recurrent * (1 + PrefixCache::kMaxSnapshotsPerSequence));
}

uint64_t SessionCacheBudget::limit(const ModelConfig& c, int64_t context, uint64_t free_bytes) {
  const uint64_t states = kCachedStates * state_bytes(c, context);
  if (states == 0) return 0;
  return free_bytes > 0 ? std::min(states, free_bytes / 4) : states;
}

uint64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t value = 0;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;  // kB
  }
  return 0;
}

PrefixCache::PrefixCache(Backend& backend, int64_t capacity, uint64_t budget_bytes)
    : backend_(backend), capacity_(capacity), budget_(budget_bytes) {
  LILY_CHECK(capacity > 0, "the context size must be positive, got {}", capacity);
  const uint64_t free_bytes = backend.name() == "cpu" ? available_host_memory() : 0;
  if (const uint64_t limit = SessionCacheBudget::limit(backend.config(), capacity, free_bytes); limit > 0)
    budget_ = std::min(budget_, limit);
  else if (budget_ == kAutoBudget) budget_ = free_bytes / 4;  // the state size is unknown: the memory rule alone
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
