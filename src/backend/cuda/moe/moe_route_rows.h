// moe_route_rows.h: the MoE block's norm, router logits and shared expert gate for T = 1 .. 16
// rows in one launch (moe_route_rows.cu): the routing of a short pass.
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// Whether moe_route_rows takes the router and the shared expert's gate: both 4-bit or both
// 8-bit, group 64, E <= 256, H <= 2048 (a multiple of 64).
bool moe_route_rows_supports(const GpuMoe& w);

// x[t] = RMSNorm(h[t]; gain), logits[t] = x[t] @ router^T, sg[t] = x[t] . shared_expert_gate
// (fp32), t < T <= 16.  h, x: [T, H];  gain: [H];  logits: [T, E];  sg: [T].
void moe_route_rows(const GpuMoe& w, const float* h, int T, const float* gain, float eps, float* x, float* logits,
                    float* sg, cudaStream_t stream);

}  // namespace lily::cuda
