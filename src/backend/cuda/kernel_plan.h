// kernel_plan.h: which kernel runs each part of a decode step and of a prefill pass. Decided once,
// when the backend is built, from the device and the weights' formats (plan_kernels); the decode
// step (decode_step.h) and the prefill pass (prefill_pass.h) only follow it, and no kernel
// launcher decides on its own. describe() prints the plan; docs/architecture.md has the table.
//
// What varies, and why:
//   decode GEMVs     4-bit rows: the prefetch kernel where a block's rows fit in shared memory
//                    (the input projections), else mma (lm_head, out_proj, o_proj); 8-bit rows
//                    (third-party checkpoints keep some projections at 8 bits): fp32
//   decode gate/up   staged (rows in shared memory) where H is a multiple of 512 and I of 16 (the
//                    model), else mma (the small test models)
//   prefill rule     the token loop below 48 tokens, the chunked rule from there (measured:
//                    docs/perf-log/2026-11.md, session 3's chunked DeltaNet table)
//   short passes     one token runs as a decode step (the captured graph), from 2 tokens a
//                    pass (2 tokens 3.0 ms, 4: 3.5, against 3.6 and 7.1 as decode steps);
//                    passes of up to 32 tokens launch with PDL (-8% at 5 tokens, -6% at 16,
//                    -2% at 32, but +3% at 47, +5% at 64, +2.5% at 4K)
//                    (H200, docs/perf-log/2026-12.md, sessions 9, 11, 14)
//   dense rows       passes of up to 16 tokens run the attention / DeltaNet projections as
//                    few-row GEMVs (gemv_rows.h: RMSNorm and residual fused, the fused input
//                    matrix in one launch) where every layer's matrices are 4-bit group 64
//   MoE rows         and the MoE block as moe_rows_accumulate (moe_grouped.h: the route in one
//                    launch, top-k with the plan, the experts on gemv_rows) where every layer's
//                    experts are 4-bit group 64, H <= 2048, router and shared gate alike
//   pass graphs      passes of up to 16 tokens replayed as CUDA graphs captured per sequence
//                    (pass_graph.h): -4% at 2 and 8 rows, -1% at 4 (H100, session 25)
//   batch steps      one token of each of up to batch_rows_up_to sequences (forward_batch) as one
//                    graph of the short pass with each row's attention and DeltaNet on its own
//                    state (batch_rows.h); off (0: the sequences one after another) until run
//   MoE slots        passes of up to 4 tokens: the block on the decode kernels, the rows a grid
//                    dimension (moe_decode.h's moe_slots_accumulate: three launches, no plan, no
//                    combine): -12% at 2 rows and -5% at 4 with the graphs, +3% at 8 (H100, s25)
//   MTP head         the head's rows (spec §6) as a prefill pass over its one layer, its fc as two
//                    column halves; off until it has run (DecodePlan::mtp)
//   logit rows       up to 16 rows of logits (a draft's verification) on gemv_rows where it takes
//                    lm_head: its 254 MB read once for the rows (gemm_q4 took 212 us for 4 rows)
//   decode step      the chain of kernels below (one persistent kernel for the whole step measured
//                    1.36x slower and was removed: docs/perf-log/2026-12.md, sessions 16-19)
//   prefill GEMM     the projections of passes of 256 tokens and more: wgmma (gemm_w4_wgmma.h)
//                    on an sm_90 device where every one of them is 4-bit group 64 (2.5x gemm_q4 on
//                    the input projections at 4K; below 256 tokens out_proj is slower than
//                    gemm_q4's split K), else mma.sync (gemm_q4.h); the routed and shared experts
//                    on wgmma from 512 tokens (their 64-token tiles match gemm_q4 at 512, 1.1-2x
//                    at 4K); the router and the shared expert's gate (8-bit) stay on gemm_exact /
//                    gemm_q4 (H200, docs/perf-log/2026-12.md, session 14)
//   device profile  (device_profile.h) the Hopper path: all of the above. A portable profile
//                    (compute capability other than 9.0, or a build without sm_90a): no PDL
//                    (launches in order), decode GEMVs on mma (prefetch needs bulk copies),
//                    gate/up on mma (staged needs bulk copies), prefill GEMMs on gemm_q4 (no
//                    wgmma), the token loop in place of the chunked rule (188,928 bytes of shared
//                    memory), the simple attention kernel where flash (173,056 bytes) does not fit,
//                    no few-token DeltaNet rows (clusters) and no batch steps. Refused, naming
//                    them, while a part has no portable kernel: today the decode step's attention
//                    core (attention_split: 202,752 bytes of shared memory) and DeltaNet core
//                    (deltanet_decode: clusters). docs/gpus.md has the inventory.
//   prefill attention flash where the query heads per KV head divide 64, else the simple kernel;
//                    passes of up to 32 tokens the split kernel (a token and KV head's keys over
//                    S blocks, then a merge: flash had 4 of 64 query rows a block at 16 tokens,
//                    and the simple kernel's one block a (token, KV head) walked 4K keys alone:
//                    a 2-row step at depth 4096 8.55 -> 3.31 ms)
// A checkpoint that no kernel takes (experts that are not 4-bit, a head size the attention does
// not implement, ...) is refused here, when the backend is built, with what is wrong.
#pragma once

#include <string>
#include <vector>

#include "backend/cuda/attention/attention_prefill.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/row_tables.h"
#include "backend/cuda/deltanet/deltanet_decode.h"
#include "backend/cuda/deltanet/deltanet_prefill.h"
#include "backend/cuda/device_profile.h"
#include "backend/cuda/gemv/gemv.h"
#include "backend/cuda/gemv/gemv_rows.h"
#include "backend/cuda/gpu_weights.h"
#include "backend/cuda/moe/moe_decode.h"
#include "backend/cuda/moe/moe_grouped.h"

namespace lily::cuda {

// A decode projection and the kernel that computes it.
struct PlannedGemv {
  QMatrix W;
  GemvKernel kernel = GemvKernel::mma;
};

struct DecodeLayerPlan {
  LayerKind kind = LayerKind::linear_attention;
  // RMSNorm(h) @ W^T: the fused matrix ([qkv; z; b; a] or [q; k; v]) or, where its parts differ
  // in quantization, the parts one after another; their outputs are consecutive in that order.
  std::vector<PlannedGemv> input;
  PlannedGemv output;  // h += y @ W^T: out_proj or o_proj
  GateUpKernel gate_up = GateUpKernel::staged;
};

struct DecodePlan {
  std::vector<DecodeLayerPlan> layers;
  PlannedGemv lm_head;  // logits = RMSNorm(h) @ lm_head^T (also the one row a prefill pass needs)
  // Steps chained on the GPU, each token chosen there (Backend::chain_tokens, decode_graph.h):
  // lily serve --parallel 1 streamed 568-569 tokens/s at 4K against 558-561 stepping with
  // forward_candidates, the graph loop 584.9 (H200, session 25). Off, generate() steps.
  bool chain = true;
  bool pdl = true;  // the step graph's edges programmatic (Hopper only: griddepcontrol)
  // The MTP head (Backend::forward_mtp, forward_hidden: prefill passes over its layer, mtp_pass.cpp)
  // where the weights have one (mtp_limit 1): off until its tests have passed on a GPU (issue 37).
  bool mtp = false;
  int mtp_limit = 0;
  DecodeLayerPlan mtp_layer;  // the head's layer, planned as the model's are
  int launches() const;       // kernels of one step, argmax included
};

constexpr int kMaxPassGraphTokens = 16;  // the longest pass a graph may replay (its logits in pinned memory)
constexpr int kMoeSlotsDefaultRows = 4;  // passes of up to this many tokens: the MoE on the decode kernels

struct PrefillPlan {
  int decode_steps_below = 2;                     // forwards of fewer tokens run as decode steps
  int programmatic_below = 33;                    // passes of fewer tokens launch with PDL (pdl_launch.cuh)
  int chunk_tokens = 8192;                        // tokens per pass
  int chunked_delta_rule_from = 48;               // passes of fewer tokens run the token loop
  int deltanet_rows_up_to = kDeltaNetDecodeMaxT;  // passes of at most this many tokens: the decode kernel
  int dense_rows_up_to = 0;                       // passes of at most this many tokens: gemv_rows projections
  int moe_rows_up_to = 0;                         // passes of at most this many tokens: gemv_rows experts
  int moe_slots_up_to = 0;                        //   or the decode MoE kernels, rows a grid dimension
  int moe_slots_limit = 0;                        // the most moe_slots_up_to may be (what the weights allow)
  int pass_graphs_up_to = 0;                      // passes of at most this many tokens: a captured graph
  int pass_graphs_limit = kMaxPassGraphTokens;    // the most pass_graphs_up_to may be
  int batch_rows_up_to = 0;                       // batch steps of at most this many sequences: one graph
  int batch_rows_limit = kMaxBatchRows;           // the most batch_rows_up_to may be
  int logit_rows_up_to = 0;                       // at most this many rows of logits: gemv_rows lm_head
  AttentionPrefillKernel attention = AttentionPrefillKernel::flash;  // of longer passes
  int split_attention_up_to = 32;   // passes of at most this many tokens: the split kernel
  int wgmma_from = kNever;          // passes of at least this many tokens: the projections on wgmma
  int wgmma_experts_from = kNever;  //   and the experts
  static constexpr int kNever = 1 << 30;
  bool dense_rows(int T) const { return T <= dense_rows_up_to; }
  bool moe_slots(int T) const { return T <= moe_slots_up_to; }
  bool wgmma(int T) const { return T >= wgmma_from; }
  AttentionPrefillKernel attention_kernel(int T) const {
    return T <= split_attention_up_to ? AttentionPrefillKernel::split : attention;
  }
  MoeExpertKernels moe_experts(int T) const {
    if (T <= moe_rows_up_to) return MoeExpertKernels::rows;
    return T >= wgmma_experts_from ? MoeExpertKernels::wgmma : MoeExpertKernels::gemm;
  }
  DeltaRulePrefill delta_rule(int T) const {
    if (T <= deltanet_rows_up_to) return DeltaRulePrefill::rows;
    return T < chunked_delta_rule_from ? DeltaRulePrefill::recurrent : DeltaRulePrefill::chunked;
  }
};

struct KernelPlan {
  DeviceProfile device;  // what it was decided for
  DecodePlan decode;
  PrefillPlan prefill;
  std::string describe() const;  // a table of part x kernel, for people
};

// The largest prefill pass: its scratch grows ~0.2 MB per token.
constexpr int kMaxPrefillChunkTokens = 16384;

// Throws lily::Error when some part of the model has no kernel, naming the part and its format,
// and when the device profile lacks what a part needs (device_profile.h: a card that is not
// Hopper has no clusters, bulk copies, wgmma or PDL, and less shared memory a block), naming the
// parts that have no portable kernel yet. prefill_chunk_tokens: a multiple of 64 in [64,
// kMaxPrefillChunkTokens].
KernelPlan plan_kernels(const GpuWeights& w, const DeviceProfile& device, int prefill_chunk_tokens);

// Tests: the plan without the refusal, and in `gaps` the parts that have no kernel under the
// profile (empty on the Hopper path): the choices a portable profile gets once they have one.
KernelPlan plan_kernels_with_gaps(const GpuWeights& w, const DeviceProfile& device, int prefill_chunk_tokens,
                                  std::vector<std::string>& gaps);

// For measurement and tests (`lily bench --kernel-plan`, CudaBackendOptions::plan_edits): sets one
// setting of the plan, "NAME=VALUE": chain (0 or 1) or a threshold of PrefillPlan
// (moe_slots_up_to, pass_graphs_up_to, ...). Throws on an unknown name, a malformed value, or a
// value the weights do not allow (a kernel that does not take them).
void edit_plan(KernelPlan& plan, const std::string& edit);

}  // namespace lily::cuda
