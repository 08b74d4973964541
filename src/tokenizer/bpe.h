// bpe.h: the byte-level BPE merge step (spec §1.3), one pre-token at a time.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lily {

struct BpeMerge {
  int32_t rank;    // position in the merge list; lower merges first
  int32_t result;  // id of the merged token
};

struct BpeModel {
  std::array<int32_t, 256> byte_token{};                    // id of each single-byte token
  std::unordered_map<uint64_t, BpeMerge> merges;            // key: pair_key(left id, right id)
  std::unordered_map<std::string, int32_t> bytes_to_token;  // raw bytes -> id (ignore_merges)
  bool ignore_merges = false;

  static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

  // Appends the ids of one pre-token (raw bytes, before the byte-level mapping) to `out`.
  // HF BPE::merge_word semantics: repeatedly merge the adjacent pair of lowest rank, leftmost
  // first among equal ranks, until no adjacent pair has a merge.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
};

}  // namespace lily
