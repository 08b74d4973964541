// prefix_cache.h: session reuse. Keeps the sequence states of recent conversations so that a
// request whose prompt extends one of them computes only its new tokens.
//
// A DeltaNet state cannot be rewound: it can only be returned to a point where a snapshot of
// it was taken (RecurrentSnapshot; restoring one also cuts the KV cache to its length). So a
// cached sequence is resumable at its full length and at its snapshot points. The chat
// service takes snapshots where the next request of a conversation is likely to diverge:
//   * the end of each prompt (a tool result appended to the reply, a regenerated answer);
//   * the end of each reply (the state itself: history kept verbatim, preserve_thinking);
//   * the template boundary: just before the generation prompt's <|im_start|>assistant. The
//     Qwen template drops the reasoning of older assistant turns, so once the next user
//     message arrives the rendering of this turn changes from there on.
//
// Lookup: among the cached sequences, the one that can resume the most prompt tokens, always
// leaving at least one prompt token to compute (its logits start the reply). The sequence is
// taken out of the cache while it runs (one generation at a time) and put back afterwards as
// the most recently used; over the byte budget the least recently used sequences are dropped.
// Taking a sequence rolls it back, so the branch beyond the resume point is lost: in a chat
// that branch is the old rendering of the last turn, which no later request can reuse.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace lily {

// A sequence state, the tokens in it, and snapshots of its recurrent state at earlier points.
struct CachedSequence {
  std::vector<int32_t> tokens;  // tokens.size() == state->length()
  std::unique_ptr<SequenceState> state;
  std::vector<std::unique_ptr<RecurrentSnapshot>> snapshots;  // ascending length, all <= tokens.size()

  // Records a snapshot at the current length (no-op when one is there already).
  void snapshot_here();
  uint64_t memory_bytes() const;
};

struct PrefixCacheStats {
  size_t sequences = 0;
  uint64_t bytes = 0;
  uint64_t budget_bytes = 0;
};

// The memory budget a session cache of this model can use, from the model's state size and the
// memory that is free:
//   * at most kCachedStates whole conversations: kCachedStates x (a state at the full context
//     + kMaxSnapshotsPerSequence snapshots of its recurrent part), fp32 (the CPU backend's
//     layout; the CUDA backend keeps its KV cache in bf16, so there it is an upper bound);
//   * at most a quarter of `free_bytes`, the memory free where the states live (0: unknown).
// 0 when the model's state size is unknown (a config without layers: the tests' fake backend).
struct SessionCacheBudget {
  static constexpr uint64_t kCachedStates = 8;
  static uint64_t state_bytes(const ModelConfig& config, int64_t context);  // one full-context state + snapshots
  static uint64_t limit(const ModelConfig& config, int64_t context, uint64_t free_bytes);
};

// MemAvailable of /proc/meminfo, in bytes (0 when it cannot be read).
uint64_t available_host_memory();

class PrefixCache {
 public:
  static constexpr size_t kMaxSnapshotsPerSequence = 8;
  // A budget of "as much as the model and the memory allow" (SessionCacheBudget::limit).
  static constexpr uint64_t kAutoBudget = UINT64_MAX;

  // capacity: the length limit of every state it creates (the context size). The budget is
  // `budget_bytes` capped by SessionCacheBudget::limit (free memory: the host's for the CPU
  // backend; unknown for the others, whose states live on the device). A fixed 4 GiB used to
  // be the budget whatever the model: 130 states of lily-tiny, 2 of the real model.
  PrefixCache(Backend& backend, int64_t capacity, uint64_t budget_bytes);

  // A sequence ready to extend to `prompt`: the cached one that resumes the most tokens,
  // rolled back to that point, or a new empty one. Its tokens are a prefix of `prompt`,
  // shorter than it.
  CachedSequence acquire(std::span<const int32_t> prompt);
  // Puts a sequence back as the most recently used, then drops the least recently used
  // ones while over budget (a budget of 0 keeps nothing).
  void release(CachedSequence sequence);
  // A new empty sequence that bypasses the cache (cold runs).
  CachedSequence fresh();
  void clear();

  PrefixCacheStats stats() const;
  int64_t capacity() const { return capacity_; }

  // How many of `prompt`'s tokens `sequence` could resume (0: none); exposed for tests.
  static int64_t resumable_length(const CachedSequence& sequence, std::span<const int32_t> prompt);

 private:
  Backend& backend_;
  int64_t capacity_;
  uint64_t budget_;
  std::list<CachedSequence> entries_;  // front: most recently used
};

}  // namespace lily
