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
//
// Several rows (a step of T tokens, T <= kMoeSlotsMaxRows): gate/up and down take the rows as a
// grid dimension (MoeDecodeArgs::rows), each row its own x, logits, gate, act and h; the route of
// T rows is moe_route_rows.h's (one launch), which leaves the shared expert's gate as a logit
// (shared_gate_logit: down takes its sigmoid). moe_slots_accumulate runs the three. No plan, no
// combine: a row's slots each read their expert, the shared expert's rows are read by T blocks
// at once (through L2).
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

enum class GateUpKernel {
  staged,  // the block's rows of G and U bulk-copied into shared memory (moe_gate_up_staged.cu):
           // H a multiple of 512, I of 16
  mma,     // the rows through registers (moe_gate_up.cu): any H, I multiples of 64
};

const char* kernel_name(GateUpKernel kernel);

constexpr int kMoeSlotsMaxRows = 16;  // rows the gate/up and down launches take (moe_route_rows': 16)

// The buffers of the MoE block of `rows` tokens (device memory, 16-byte aligned; see above for
// who writes what), row after row.
struct MoeDecodeBuffers {
  float* h = nullptr;              // [rows, H] the residual stream: read by route, added to by down
  float* x = nullptr;              // [rows, H] RMSNorm(h)
  float* logits = nullptr;         // [rows, E] router logits
  float* shared_weight = nullptr;  // [rows] sigmoid(x . w_sg), or x . w_sg (shared_gate_logit)
  float* act = nullptr;            // [rows, k + 1, I] silu(G x) * (U x) per slot
};

struct MoeDecodeArgs {
  const GpuMoe* w = nullptr;
  const float* gain = nullptr;  // [H] post_attention_layernorm's effective gain
  float eps = 1e-6f;
  int k = 8;                       // experts per token
  int rows = 1;                    // tokens, 1 .. kMoeSlotsMaxRows (moe_route: 1)
  bool shared_gate_logit = false;  // shared_weight holds the logit, not its sigmoid
  MoeDecodeBuffers buffers;
};

// Whether the three launches take these matrices and k (with `gate_up` for the second).
bool moe_decode_supports(const GpuMoe& w, int k, GateUpKernel gate_up);

void moe_route(const MoeDecodeArgs& args, cudaStream_t stream);
void moe_gate_up(GateUpKernel kernel, const MoeDecodeArgs& args, cudaStream_t stream);
void moe_down(const MoeDecodeArgs& args, cudaStream_t stream);

// The block of T = 1 .. kMoeSlotsMaxRows rows from the residual stream h [T, H]: x = RMSNorm(h;
// gain) (written to x [T, H]), h += sum_s w_s * expert_s(x) + sigmoid(x . w_sg) * shared(x), in
// three launches (moe_route_rows, moe_gate_up, moe_down with rows = T). Needs moe_decode_supports
// and moe_route_rows_supports; scratch: moe_slots_scratch_bytes (the logits, gates and act).
size_t moe_slots_scratch_bytes(const GpuMoe& w, int T, int k);
void moe_slots_accumulate(GateUpKernel gate_up, const GpuMoe& w, float* h, const float* gain, float eps, int T, int k,
                          void* scratch, float* x, cudaStream_t stream);

}  // namespace lily::cuda
