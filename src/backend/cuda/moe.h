// moe.h: the sparse MoE block on the GPU (spec §2.7): routing, experts, shared expert.
#pragma once

#include "backend/cuda/gpu_types.h"

namespace lily::cuda {

// Router: p = softmax(x @ Wr^T) over E experts (fp32), top-k (ties to the lower index),
// renormalised.  x: [T, H] -> expert_ids: [T, k] int32, expert_weights: [T, k] fp32.
void moe_route(const QMatrix& router, const float* x, int T, int k, int32_t* expert_ids, float* expert_weights,
               cudaStream_t stream);

// The selected experts' SwiGLU input half: act[t, s, :] = silu(G_e x_t) * (U_e x_t),
// e = expert_ids[t, s].  gate, up: stacks [E, I, H];  act: [T, k, I] fp32.
void moe_gate_up(const QMatrix& gate, const QMatrix& up, const float* x, const int32_t* expert_ids, int T, int k,
                 float* act, cudaStream_t stream);

// out[t, :] += sum_s expert_weights[t, s] * (D_e act[t, s, :]),  down: stack [E, H, I].
void moe_down_accumulate(const QMatrix& down, const float* act, const int32_t* expert_ids, const float* expert_weights,
                         int T, int k, float* out, cudaStream_t stream);

// The shared expert, gated per token, added to out:
//   out[t, :] += sigmoid(x_t . w_sg) * D_s(silu(G_s x_t) * U_s x_t)
// gate_proj, up_proj: [Is, H]; down_proj: [H, Is]; expert_gate: [1, H]. scratch: >= T*Is floats.
void shared_expert_accumulate(const QMatrix& gate_proj, const QMatrix& up_proj, const QMatrix& down_proj,
                              const QMatrix& expert_gate, const float* x, int T, float* scratch, float* out,
                              cudaStream_t stream);

}  // namespace lily::cuda
