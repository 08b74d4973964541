// output_rows.h: where a forward's per-token outputs go, for every backend (each runs a call's
// tokens in blocks or passes and writes the rows the caller wants of each).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "base/error.h"

namespace lily {

// Where a block's rows of a per-token output go: rows [first_row, n) of the block into `out`
// (null: none of them).
struct OutputRows {
  float* out = nullptr;
  int64_t first_row = 0;
};

// The rows `wanted` of block [t0, t0 + n) of T tokens, in `buffer` of `width` values a row.
inline OutputRows output_rows(LogitsWanted wanted, std::vector<float>& buffer, int64_t width, int64_t t0, int64_t n,
                              int64_t T) {
  if (wanted == LogitsWanted::all) return {buffer.data() + t0 * width, 0};
  if (wanted == LogitsWanted::last && t0 + n == T) return {buffer.data(), n - 1};
  return {};
}

// How many rows `wanted` names of a call of T tokens.
inline int64_t rows_of(LogitsWanted wanted, int64_t T) {
  return wanted == LogitsWanted::all ? T : wanted == LogitsWanted::last && T > 0 ? 1 : 0;
}

inline void check_tokens(std::span<const int32_t> tokens, int64_t V) {
  for (int32_t id : tokens) LILY_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
}

}  // namespace lily
