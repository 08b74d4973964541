// bench_speculative.h: `lily bench --speculate K`, speculative decoding against plain decoding in
// the same run: per context depth, greedy generate() with and without the MTP head's drafts,
// the effective decode tokens/s of each, the tokens a verify step yields and the acceptance per
// draft position. --assume-acceptance forces given acceptance rates (random weights accept
// nothing), so the pipeline's cost is measured; the tokens are then not the model's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace lily::cli {

struct SpeculativeBench {
  int drafts = 0;               // --speculate K
  std::vector<double> assumed;  // --assume-acceptance: per draft position, non-increasing; empty: the model's
  int tokens = 0;               // tokens generated per measurement
  int repeats = 1;              // measurements per point (median), after a warm-up round
  std::string title;            // the model and machine
};

// "0.85,0.67,0.51" -> rates, checked against K drafts (at most K of them, each in [0, 1],
// non-increasing: the rate of position k is that of keeping drafts 1..k).
std::vector<double> parse_acceptance(const std::string& text, int drafts);

// Prints the table (or JSON) on stdout. fill(state, D) puts D tokens of context in a fresh state.
void run_speculative_bench(Backend& backend, const std::vector<int32_t>& depths, const SpeculativeBench& options,
                           const std::function<void(SequenceState&, int32_t)>& fill, bool json);

}  // namespace lily::cli
