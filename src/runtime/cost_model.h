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

// Floating-point operations to prefill a prompt of `length` tokens from empty.
double prefill_flops(const ModelConfig& c, int64_t length);

}  // namespace lily
