// moe_gate_up_staged.h: GateUpKernel::staged of moe_decode.h (moe_gate_up_staged.cu): the decode
// gate/up with each block's expert rows copied into shared memory by bulk copies. Internal to
// backend/cuda/decode (moe_gate_up.cu dispatches to it).
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// 4-bit, group 64 stacks [E, I, H] with H a multiple of 512 up to 4096 and I a multiple of 16, the
// shared expert of the same shape, 16-byte aligned arrays, k <= 8, E <= 256.
bool moe_gate_up_staged_supports(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate,
                                 const QMatrix& shared_up, int k);

// act[s, :] = silu(G_s x) * (U_s x) for the k routed slots and the shared expert (slot k), one
// token; slot s's expert is rank s of router_logits' top-k (warp_route_rank).
void moe_gate_up_staged(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate, const QMatrix& shared_up,
                        const float* x, const float* router_logits, int k, float* act, cudaStream_t stream);

}  // namespace lily::cuda
