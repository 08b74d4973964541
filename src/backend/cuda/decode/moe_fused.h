// moe_fused.h: the sparse MoE block of one decode token in a single launch (moe_fused.cu): the
// same results as moe.cu's moe_route_norm + moe_gate_up + moe_down_accumulate, without two of
// the three launches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

struct MoeFusedWeights {
  QMatrix router, shared_expert_gate;  // [E, H], [1, H]
  QMatrix gate, up, down;              // stacks [E, I, H], [E, I, H], [E, H, I]
  QMatrix shared_gate, shared_up, shared_down;  // [I, H], [I, H], [H, I]
};

// Whether moe_fused_decode takes this shape (4-bit experts, I <= 512, H <= 4096, E <= 256,
// k <= 8, router and shared-expert gate rows of at most 128 chunks).
bool moe_fused_supports(const MoeFusedWeights& w, int k);

// Whether the decode step uses it: only with LILY_MOE_FUSED=1. Measured slower than the three
// launches (H200, 4K decode: 403.9 vs 432.2 tokens/s, docs/perf.md): one block of 255 registers
// per SM leaves no room for its neighbours' blocks under PDL, and its two grid barriers and the
// top-k in every block cost more than the two launches they replace.
bool moe_fused_enabled();

// Device scratch for moe_fused_decode, zero-filled before the first call (its barrier words
// return to zero at the end of every launch).
size_t moe_fused_scratch_bytes(int E, int I, int k);

// h[:] += MoE(RMSNorm(h; gain)) for one token (T = 1); expert_ids / expert_weights [k + 1] as
// moe_route_norm writes them (for callers that look; the kernel keeps its own copies).
void moe_fused_decode(const MoeFusedWeights& w, float* h, const float* gain, float eps, int k, int32_t* expert_ids,
                      float* expert_weights, void* scratch, cudaStream_t stream);

}  // namespace lily::cuda
