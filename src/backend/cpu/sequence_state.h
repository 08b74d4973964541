// sequence_state.h: one sequence's state on the CPU, for both CPU backends (backend/cpu and
// backend/cpu_fast, which share the caches of ops.h; spec §4).
//
// A cache per layer (the attention layers' K/V rows, the DeltaNet layers' conv and SSM state)
// and the MTP head's cache (mtp_cache.h; empty where the backend does not run the head). The
// state and its snapshots carry the name of the backend that made them ("CPU", "fast CPU"), so
// one backend refuses the other's by name.
//
// keep_row_states / rewind (backend.h, a speculative verify): a forward that keeps R rows has
// each DeltaNet layer write its states after the call's rows [T - R, T - 1) (the last row's is the
// live state) into buffers of the state (ops.h's DeltaNetKept), allocated by keep_row_states for
// the most rows asked so far and reused; reset() frees them, clone() does not copy them (the copy
// keeps no rows). A rewind restores one of them and cuts the KV rows; it may be followed by
// another to a shorter length, until the next forward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/mtp_cache.h"
#include "backend/cpu/ops.h"

namespace lily::cpu {

// The most rows keep_row_states keeps: a verify of a token and up to 63 drafts (the backends'
// blocks are longer, so one block holds them all).
constexpr int kMaxKeptRows = 64;

struct CpuRecurrentSnapshot final : RecurrentSnapshot {
  const char* backend = "";  // the name of the backend whose state took it
  int64_t length_ = 0;
  int64_t mtp_length = 0;  // the MTP cache's length then
  std::vector<DeltaNetCache> deltanet;
  int64_t length() const override { return length_; }
  uint64_t memory_bytes() const override;
};

class CpuSequenceState final : public SequenceState {
 public:
  // `backend`: the name of the backend that makes it, in its errors (a string literal).
  CpuSequenceState(const ModelConfig& c, int64_t capacity, const char* backend);

  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  uint64_t memory_bytes() const override;
  std::unique_ptr<SequenceState> clone() const override;
  std::unique_ptr<RecurrentSnapshot> snapshot() const override;
  void restore(const RecurrentSnapshot& snapshot) override;
  void reset() override;
  int64_t mtp_length() const override { return mtp_.length(); }
  // 1 .. kMaxKeptRows rows; else false.
  bool keep_row_states(int rows) override;
  bool rewind(int64_t length, int64_t mtp_length) override;

  const char* backend() const { return backend_; }
  AttentionCache& attention_cache(int layer) { return attention_[size_t(layer_slot_[size_t(layer)])]; }
  DeltaNetCache& deltanet_cache(int layer) { return deltanet_[size_t(layer_slot_[size_t(layer)])]; }
  LayerCache layer_cache(int layer);
  MtpCache& mtp() { return mtp_; }

  // For the backends, which call it first in every forward of T tokens: how many of its last
  // rows it keeps (min(keep_row_states' rows, T); 0: none asked). The asking is used up.
  int64_t begin_forward(int64_t T);
  // Where DeltaNet layer `layer` keeps its states in the block that holds the call's kept rows
  // (its last), the first of them at the block's row `first_row`; no rows where none are kept.
  DeltaNetKept deltanet_kept(int layer, int64_t first_row);
  // After n rows of a forward; once the forward's last row is in, its kept rows can be rewound to.
  void advance(int64_t n);

 private:
  // What keep_row_states and the forward after it leave for rewind.
  struct KeptRows {
    int asked = 0;                              // keep_row_states' rows, for the next forward
    int64_t rows = 0;                           // that forward's kept rows: its last `rows`
    int64_t end = 0;                            // the length after that forward
    int64_t last = 0;                           // the longest length a rewind may ask now (end, then each rewind's)
    bool recording = false;                     // that forward is under way
    bool valid = false;                         // its rows are kept and the sequence has not moved on
    int64_t slots = 0;                          // states the buffers hold: asked - 1 for the most rows asked
    std::vector<std::vector<float>> conv, ssm;  // [DeltaNet layer]: [slots + K - 2, C], [slots, Hv, dk, dv]
  };
  void forget_kept_rows();
  void cut_attention(int64_t length);

  const ModelConfig* config_;
  int64_t capacity_;
  const char* backend_;
  int64_t length_ = 0;
  std::vector<int> layer_slot_;  // layer -> index into attention_ or deltanet_
  std::vector<AttentionCache> attention_;
  std::vector<DeltaNetCache> deltanet_;
  MtpCache mtp_;
  KeptRows kept_;
};

// The next block of a forward of T tokens from row t0 in blocks of at most `chunk` rows, so that
// the last `kept` rows (kept <= chunk) fall in the last block: its number of rows.
int64_t next_block(int64_t t0, int64_t T, int64_t chunk, int64_t kept);

// A new empty sequence of `backend` (Backend::new_sequence); capacity must be positive.
std::unique_ptr<SequenceState> new_cpu_sequence(const ModelConfig& c, int64_t capacity, const char* backend);

// `state` as a CpuSequenceState of the backend named `backend`; else an error saying so, for
// the operation `what`.
CpuSequenceState& cpu_sequence(SequenceState& state, const char* backend, const char* what);

}  // namespace lily::cpu
