// cost_model.h: the work a token costs, to state speed against the hardware limit.
//
// Decode moves bytes: every weight the token touches (4-bit codes + bf16 scale and bias per
// group of 64, 8-bit router), the DeltaNet state (read and written), and the KV cache up to
// the context depth. Prefill does arithmetic: 2 FLOP per active weight per token, plus the
// attention products.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace lily {

// Bytes one decode step must move at context depth `depth` (4-bit g64 weights).
double decode_bytes_per_token(const ModelConfig& c, int64_t depth);

// Bytes a step of `rows` consecutive tokens of one sequence must move (a speculative draft's
// verification): the weights once, the routed experts as the union of the rows' choices (its
// expectation under uniform random routing, E (1 - (1 - k/E)^rows) a layer: ~31 of 256 experts
// for 4 rows, ~57 for 8), the state once, the KV cache up to the last row. rows = 1 is
// decode_bytes_per_token.
double decode_step_bytes(const ModelConfig& c, int64_t depth, int rows);

// Bytes a step of one token of each of `sequences` sequences at depth `depth` must move (parallel
// requests): the weights once, the routed experts' union, and every sequence's own state (read
// and written) and KV cache.
double batch_step_bytes(const ModelConfig& c, int64_t depth, int sequences);

// The expected number of distinct experts `rows` tokens choose in one layer (uniform routing).
double expected_experts(const ModelConfig& c, int rows);

// Floating-point operations to prefill a prompt of `length` tokens from empty.
double prefill_flops(const ModelConfig& c, int64_t length);

}  // namespace lily
