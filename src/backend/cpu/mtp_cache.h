// mtp_cache.h: the MTP head's cache in one sequence of the CPU backend (spec §4, §6).
//
// The K/V rows of the head's one attention layer, a row per position it has processed
// (Backend::forward_mtp): 2 x nkv x head_dim floats a position. Append-only like the main KV
// cache, and rolled with it by the sequence state that holds one: clone() copies it (a value
// member), snapshot() records its length(), restore() cut()s it back to that, reset() clear()s it.
#pragma once

#include <cstdint>

#include "backend/cpu/ops.h"
#include "base/error.h"

namespace lily::cpu {

class MtpCache {
 public:
  explicit MtpCache(const ModelConfig& c) : row_(int64_t(c.num_key_value_heads) * c.head_dim) {}

  int64_t length() const { return int64_t(kv_.k.size()) / row_; }  // positions processed (= the next position)
  AttentionCache& attention() { return kv_; }
  uint64_t memory_bytes() const { return (kv_.k.size() + kv_.v.size()) * sizeof(float); }

  // Drops the positions from `length` on. Rows once cut cannot come back: `length` must not be
  // past length().
  void cut(int64_t length) {
    LILY_CHECK(length >= 0 && length <= this->length(),
               "restore: the snapshot's MTP cache at {} positions is past this sequence's {}", length, this->length());
    kv_.k.resize(size_t(length * row_));
    kv_.v.resize(size_t(length * row_));
  }
  void clear() { cut(0); }

 private:
  int64_t row_;        // floats of one position's K (or V): nkv * head_dim
  AttentionCache kv_;  // k, v: [length, nkv, head_dim]
};

}  // namespace lily::cpu
