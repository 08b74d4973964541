// moe_decode.h: the sparse MoE block of one token (spec §2.7) in three launches:
//
//   moe_route    x = RMSNorm(h; post_attention_layernorm)       (zero-centred: gain = 1 + w)
//                logits = x @ Wr^T (fp32);  shared_weight = sigmoid(x . w_sg)
//   moe_gate_up  act[s] = silu(G_e x) * (U_e x)    slot s < k: e = rank s of top-k(softmax(logits))
//                                                  (ties to the lower index); slot k: the shared expert
//   moe_down     h += sum_{s < k} w_s D_e act[s] + shared_weight D_shared act[k]
//                w_s = p_e / sum of the chosen p (renormalised, summed in rank order as the CPU)
//
// The expert launches choose the top-k from the logits themselves (route_topk.cuh: each block of
// gate/up its slot's expert, every block of down all k with their weights), so the router ends
// after its logits: no ticket, no serial tail on the critical path.
//
// Launch order under PDL (pdl.cuh): a kernel may read before its pdl_wait what was written two or
// more launches back, never what its direct predecessor writes. Here:
//   moe_route    before its wait: its router rows and the shared expert's gate row (weights);
//                after: h (written by out_proj / o_proj, its predecessor).
//   moe_gate_up  before: the shared expert's rows (the staged kernel copies them into shared
//                memory); after: logits and x (route, its predecessor), then the routed rows.
//   moe_down     before: logits and shared_weight (route, two launches back), so it chooses its
//                experts and loads their rows before its wait; after: act (gate/up).
// The kernel plan (kernel_plan.h) picks the gate/up kernel; route and down have one kernel each.
// Shapes: H <= 4096 and I multiples of 64 (the shared expert's width must equal I, true of every
// Qwen3.5/3.6 MoE), E <= 256, k <= 8; every expert matrix 4-bit, group 64.
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

enum class GateUpKernel {
  staged,  // the block's rows of G and U bulk-copied into shared memory (moe_gate_up_staged.cu):
           // H a multiple of 512, I of 16
  mma,     // the rows through registers (moe_gate_up.cu): any H, I multiples of 64
};

const char* kernel_name(GateUpKernel kernel);

// The buffers of one token's MoE block (device memory, 16-byte aligned; see above for who
// writes what).
struct MoeDecodeBuffers {
  float* h = nullptr;              // [H] the residual stream: read by route, added to by down
  float* x = nullptr;              // [H] RMSNorm(h)
  float* logits = nullptr;         // [E] router logits
  float* shared_weight = nullptr;  // [1] sigmoid(x . w_sg)
  float* act = nullptr;            // [k + 1, I] silu(G x) * (U x) per slot
};

struct MoeDecodeArgs {
  const GpuMoe* w = nullptr;
  const float* gain = nullptr;  // [H] post_attention_layernorm's effective gain
  float eps = 1e-6f;
  int k = 8;  // experts per token
  MoeDecodeBuffers buffers;
};

// Whether the three launches take these matrices and k (with `gate_up` for the second).
bool moe_decode_supports(const GpuMoe& w, int k, GateUpKernel gate_up);

void moe_route(const MoeDecodeArgs& args, cudaStream_t stream);
void moe_gate_up(GateUpKernel kernel, const MoeDecodeArgs& args, cudaStream_t stream);
void moe_down(const MoeDecodeArgs& args, cudaStream_t stream);

}  // namespace lily::cuda
