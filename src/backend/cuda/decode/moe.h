// moe.h: the sparse MoE block on the GPU (spec §2.7) in three launches: norm + routing,
// gate/up, down. The shared expert is slot k of the expert launches, after the k routed ones.
#pragma once

#include <cstddef>

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// The block's input norm, router and shared-expert gate, per token t:
//   normed[t] = h[t] * rsqrt(mean(h[t]^2) + eps) * gain          (gain: [H] effective, 1 + w)
//   p = softmax(normed[t] @ Wr^T) over E experts (fp32), top-k (ties to the lower index),
//   renormalised: expert_ids[t, 0..k), expert_weights[t, 0..k);
//   slot k, the shared expert: expert_ids[t, k] = 0, expert_weights[t, k] = sigmoid(normed[t] . w_sg).
// h, normed: [T, H] fp32 (H <= 4096);  expert_ids: [T, k+1] int32;  expert_weights: [T, k+1] fp32.
// scratch: moe_route_scratch_bytes(E, scratch_tokens) bytes for up to scratch_tokens >= T
// tokens, zero-filled before its first use; the kernel leaves its counters at zero again, so
// later calls (and graph replays) with the same scratch and scratch_tokens need nothing else.
size_t moe_route_scratch_bytes(int E, int scratch_tokens);
// choose = false (one token): the top-k is left to the expert launches, which choose from the
// logits themselves (router_logits below): expert_ids / expert_weights get only slot k here.
void moe_route_norm(const QMatrix& router, const QMatrix& shared_expert_gate, const float* h, const float* gain,
                    float eps, int T, int k, float* normed, int32_t* expert_ids, float* expert_weights, void* scratch,
                    int scratch_tokens, cudaStream_t stream, bool choose = true);
// The router logits [scratch_tokens, E] inside that scratch (token 0 first).
const float* moe_route_logits(const void* scratch, int scratch_tokens);
// Whether moe_gate_up and moe_down_accumulate can choose from router_logits (the tensor-core
// kernels: 4-bit experts, LILY_MMA_GEMV not 0).
bool moe_experts_can_choose(const QMatrix& gate, const QMatrix& down, int E, int k);
// The same with a grow-only scratch of its own (one stream at a time; call once before a graph
// capture so that nothing is allocated while capturing).
void moe_route_norm(const QMatrix& router, const QMatrix& shared_expert_gate, const float* h, const float* gain,
                    float eps, int T, int k, float* normed, int32_t* expert_ids, float* expert_weights,
                    cudaStream_t stream);

// The SwiGLU input half of every slot: act[t, s, :] = silu(G_s x_t) * (U_s x_t), where slot
// s < k is the routed expert expert_ids[t, s] and slot k the shared expert.
// gate, up: stacks [E, I, H];  shared_gate, shared_up: [I, H] (same shape and bits);
// expert_ids: [T, k+1];  act: [T, k+1, I] fp32.
// router_logits (T = 1): each block chooses its expert from the logits (warp_route_rank: the same
// choice as moe_route_norm's) instead of reading expert_ids.
void moe_gate_up(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate, const QMatrix& shared_up,
                 const float* x, const int32_t* expert_ids, int T, int k, float* act, cudaStream_t stream,
                 const float* router_logits = nullptr);

// out[t, :] += sum_{s <= k} expert_weights[t, s] * (D_s act[t, s, :]);  down: stack [E, H, I],
// shared_down: [H, I] (slot k).
// ids_before_launch: expert_ids were written by a kernel that had finished before the kernel
// ahead of this one passed its PDL wait (moe_route_norm, then moe_gate_up, then this): the
// routed experts' weights are then loaded before this kernel's PDL wait (tensor-core form).
void moe_down_accumulate(const QMatrix& down, const QMatrix& shared_down, const float* act, const int32_t* expert_ids,
                         const float* expert_weights, int T, int k, float* out, cudaStream_t stream,
                         bool ids_before_launch = false, const float* router_logits = nullptr);
// router_logits (T = 1, written two kernels back like ids_before_launch): each block chooses the
// experts and their weights from the logits before its PDL wait (slot k's weight from
// expert_weights[k]); the routed slots of expert_ids / expert_weights are then neither read nor
// written.

}  // namespace lily::cuda
