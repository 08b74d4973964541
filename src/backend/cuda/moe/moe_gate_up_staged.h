// moe_gate_up_staged.h: GateUpKernel::staged of moe_decode.h (moe_gate_up_staged.cu): the decode
// gate/up with each block's expert rows copied into shared memory by bulk copies. Internal to
// backend/cuda/moe (moe_gate_up.cu dispatches to it).
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// 4-bit, group 64 stacks [E, I, H] with H a multiple of 512 up to 4096 and I a multiple of 16, the
// shared expert of the same shape, 16-byte aligned arrays, k <= 8, E <= 256.
bool moe_gate_up_staged_supports(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate,
                                 const QMatrix& shared_up, int k);

// act[t, s, :] = silu(G_s x[t]) * (U_s x[t]) for the k routed slots and the shared expert (slot
// k) of each of T rows; slot s's expert is rank s of router_logits[t]'s top-k (warp_route_rank).
//   x: [T, H], router_logits: [T, E], act: [T, k + 1, I].
void moe_gate_up_staged(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate, const QMatrix& shared_up,
                        const float* x, const float* router_logits, int k, int T, float* act, cudaStream_t stream);

}  // namespace lily::cuda
