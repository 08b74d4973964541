// moe_gate_up_staged.h: the decode (T = 1) gate/up launch of the MoE with each block's expert
// rows copied into shared memory by bulk copies (moe_gate_up_staged.cu); moe.cu's moe_gate_up
// routes here when moe_gate_up_staged_supports. Internal to backend/cuda.
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// 4-bit, group 64 stacks [E, I, H] with H a multiple of 512 up to 4096 and I a multiple of 16,
// the shared expert of the same shape, 16-byte aligned pointers, k <= 8, E <= 256; false also
// when LILY_GATEUP_STAGED=0 (read at every call: tests compare both kernels).
bool moe_gate_up_staged_supports(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate,
                                 const QMatrix& shared_up, const float* x, int k);

// act[s, :] = silu(G_s x) * (U_s x) for the k routed slots and the shared expert (slot k), one
// token. Slot s's expert: rank s of router_logits' top-k (warp_route_rank) when router_logits is
// given, else expert_ids[s].
void moe_gate_up_staged(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate, const QMatrix& shared_up,
                        const float* x, const int32_t* expert_ids, const float* router_logits, int k, float* act,
                        cudaStream_t stream);

}  // namespace lily::cuda
