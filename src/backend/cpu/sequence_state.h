// sequence_state.h: one sequence's state on the CPU, for both CPU backends (backend/cpu and
// backend/cpu_fast, which share the caches of ops.h; spec §4).
//
// A cache per layer (the attention layers' K/V rows, the DeltaNet layers' conv and SSM state)
// and the MTP head's cache (mtp_cache.h; empty where the backend does not run the head). The
// state and its snapshots carry the name of the backend that made them ("CPU", "fast CPU"), so
// one backend refuses the other's by name.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/mtp_cache.h"
#include "backend/cpu/ops.h"

namespace lily::cpu {

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
  std::unique_ptr<SequenceState> clone() const override { return std::make_unique<CpuSequenceState>(*this); }
  std::unique_ptr<RecurrentSnapshot> snapshot() const override;
  void restore(const RecurrentSnapshot& snapshot) override;
  void reset() override;
  int64_t mtp_length() const override { return mtp_.length(); }

  const char* backend() const { return backend_; }
  AttentionCache& attention_cache(int layer) { return attention_[size_t(layer_slot_[size_t(layer)])]; }
  DeltaNetCache& deltanet_cache(int layer) { return deltanet_[size_t(layer_slot_[size_t(layer)])]; }
  LayerCache layer_cache(int layer);
  MtpCache& mtp() { return mtp_; }
  void advance(int64_t n) { length_ += n; }

 private:
  const ModelConfig* config_;
  int64_t capacity_;
  const char* backend_;
  int64_t length_ = 0;
  std::vector<int> layer_slot_;  // layer -> index into attention_ or deltanet_
  std::vector<AttentionCache> attention_;
  std::vector<DeltaNetCache> deltanet_;
  MtpCache mtp_;
};

// A new empty sequence of `backend` (Backend::new_sequence); capacity must be positive.
std::unique_ptr<SequenceState> new_cpu_sequence(const ModelConfig& c, int64_t capacity, const char* backend);

// `state` as a CpuSequenceState of the backend named `backend`; else an error saying so, for
// the operation `what`.
CpuSequenceState& cpu_sequence(SequenceState& state, const char* backend, const char* what);

}  // namespace lily::cpu
